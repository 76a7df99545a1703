// DNS on the host: the wire format (RFC 1035) and a resolver that asks the
// hosts file, then the nameservers, never glibc. The egress proxy's stub
// (names of allowed hosts for a sandbox) and the image client use it.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/address.h"

namespace openshell::net::dns {

// ---- the wire format (RFC 1035) ---------------------------------------------

inline constexpr uint16_t kTypeA = 1;
inline constexpr uint16_t kTypeAAAA = 28;
inline constexpr uint16_t kClassIN = 1;
inline constexpr uint8_t kRcodeNoError = 0;
inline constexpr uint8_t kRcodeFormErr = 1;
inline constexpr uint8_t kRcodeServFail = 2;
inline constexpr uint8_t kRcodeNxDomain = 3;
inline constexpr uint8_t kRcodeNotImp = 4;
inline constexpr uint8_t kRcodeRefused = 5;

struct Question {
  std::string name;  // lower case, no trailing dot
  uint16_t type = 0;
  uint16_t klass = kClassIN;
};

struct Query {
  uint16_t id = 0;
  bool recursion_desired = false;
  Question question;  // exactly one question is accepted
};

// Parses a query message; nullopt when it is malformed, is a response, or
// has a question count other than one. Never reads out of bounds.
// Also nullopt: an opcode other than QUERY, a compression pointer in the
// question, a label over 63 or a name over 255 octets, and a label with a
// character other than a letter, digit, '-' or '_' (a '.' inside a label
// would make the dotted name ambiguous). Records after the question (an
// EDNS OPT record, say) are not read.
std::optional<Query> parse_query(std::string_view message);

// A response to query: answers of its type (A: IPv4, AAAA: IPv6 addresses;
// addresses of the other family are skipped) with the given TTL, or an
// empty answer with rcode. Name compression points back to the question.
// Answers only for rcode NoError, class IN and type A or AAAA, and only as
// many as fit in 512 bytes (no TC bit: a shorter answer is still right).
// AA is clear, RA set, RD copied. A question name that is not a host name
// (a hand-made Query) gives FORMERR without a question.
std::string build_response(const Query& query, uint8_t rcode, const std::vector<Address>& answers,
                           uint32_t ttl);

// ---- resolving on the host --------------------------------------------------

struct ResolverConfig {
  std::string hosts_file = "/etc/hosts";
  std::string resolv_conf = "/etc/resolv.conf";
  std::vector<std::string> servers;  // "1.2.3.4" or "1.2.3.4:5353"; overrides resolv_conf when set
  int timeout_ms = 2000;
  int attempts = 2;

  // Answers from the nameservers are kept for their TTL (the least of the
  // records used), held between min_ttl_s and max_ttl_s; NXDOMAIN and
  // answers without addresses for negative_ttl_s. At most cache_entries
  // names, the least recently used going first; 0: no cache.
  size_t cache_entries = 4096;
  uint32_t min_ttl_s = 5;
  uint32_t max_ttl_s = 300;
  uint32_t negative_ttl_s = 30;
  // Lookups sent to the nameservers (each an A and an AAAA query): a
  // token bucket of query_burst tokens that refills at query_rate a
  // second. A lookup over the limit fails at once, without a query.
  // query_rate 0: no limit.
  double query_rate = 20;
  double query_burst = 50;

  // The clock of the cache and the limit (tests replace it).
  std::function<std::chrono::steady_clock::time_point()> now = std::chrono::steady_clock::now;

  // From the environment: OPENSHELL_HOSTS_FILE, OPENSHELL_RESOLV_CONF,
  // OPENSHELL_DNS_SERVERS (comma separated) override the defaults, and
  // OPENSHELL_DNS_QUERY_RATE and OPENSHELL_DNS_QUERY_BURST (numbers; a rate
  // of 0 lifts the limit). Throws Error for a value that is not a number.
  static ResolverConfig from_environment();
};

// Where a resolution came from.
enum class Source {
  kLocal,        // an IP literal or the hosts file
  kCached,       // the cache, or a lookup of the same name already under way
  kUpstream,     // a lookup sent to the nameservers
  kRateLimited,  // refused: the lookup would have gone over query_rate
};
const char* source_name(Source source);  // "local", "cached", "upstream", "rate_limited"

struct Resolution {
  std::vector<Address> addresses;
  std::string error;  // as Resolver::resolve gives it
  Source source = Source::kLocal;
};

// Asynchronous A and AAAA lookups: the hosts file first, then the
// nameservers. Runs on the caller's io_context (one thread).
//
// Names the hosts file does not have go through a cache and a rate limit
// (see ResolverConfig): what a sandbox asks for reaches the nameservers at
// most once per TTL and at most query_rate times a second, and lookups of a
// name already under way wait for it instead of asking again.
//
// The hosts file and resolv.conf are read again when they change. Names are
// taken as absolute: no search domains, no ndots. Each lookup sends an A and
// an AAAA query (ids from getrandom) from a fresh connected UDP socket per
// server (a random source port; datagrams from elsewhere never arrive) and
// accepts only answers that match id, type and name; it asks the servers in
// order, each for timeout_ms, `attempts` times round. A server that answers
// SERVFAIL, REFUSED or with an ICMP error is left at once. CNAME chains are
// followed inside the answer section. A truncated (TC) answer is used for
// the addresses it holds; there is no TCP fallback.
class Resolver {
 public:
  using Callback = std::function<void(std::vector<Address> addresses, std::string error)>;
  // Throws Error for a malformed entry in config.servers.
  Resolver(boost::asio::io_context& io, ResolverConfig config);
  // Pending lookups are dropped: their callbacks are never called.
  ~Resolver();
  // Both families; an IP literal resolves to itself. error is "" on success
  // (addresses may then still be empty: the name has none).
  // IPv4 addresses come first. done is called from the io_context, never
  // from inside resolve(). Errors: "NAME: no such host" (NXDOMAIN), "NAME:
  // DNS servers did not answer", "NAME: DNS lookup failed: <server> answered
  // SERVFAIL" (or the socket error), "NAME: no DNS servers (...)",
  // "\"NAME\": not a valid host name". When only one family answered in
  // the end, its addresses are the result.
  void resolve(const std::string& host, Callback done);
  // The same, saying where the answer came from. A lookup refused by the
  // rate limit has the error "NAME: too many DNS lookups (over N a second)".
  void lookup(const std::string& host, std::function<void(Resolution)> done);

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace openshell::net::dns
