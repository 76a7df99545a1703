#include "egress/dns.h"

#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <list>
#include <random>
#include <sstream>
#include <unordered_map>
#include <utility>

#include <boost/asio/ip/udp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/error.h"
#include "base/text.h"

namespace openshell::egress {

namespace asio = boost::asio;
using asio::ip::udp;

namespace {

constexpr size_t kHeaderSize = 12;
constexpr size_t kMaxLabel = 63;
constexpr size_t kMaxNameOctets = 255;  // on the wire: length octets and the final zero
constexpr size_t kMaxUdpMessage = 512;  // RFC 1035 without EDNS
constexpr uint16_t kTypeCname = 5;
constexpr uint16_t kFlagResponse = 0x8000;
constexpr uint16_t kFlagTruncated = 0x0200;
constexpr uint16_t kFlagRecursionDesired = 0x0100;
constexpr uint16_t kFlagRecursionAvailable = 0x0080;
constexpr uint16_t kPointerToQuestion = 0xC000 | kHeaderSize;
constexpr int kMaxCnameHops = 16;

uint16_t get16(std::string_view m, size_t at) {
  return static_cast<uint16_t>((static_cast<uint8_t>(m[at]) << 8) |
                               static_cast<uint8_t>(m[at + 1]));
}

uint32_t get32(std::string_view m, size_t at) {
  return (static_cast<uint32_t>(get16(m, at)) << 16) | get16(m, at + 2);
}

void put16(std::string& out, uint16_t value) {
  out.push_back(static_cast<char>(value >> 8));
  out.push_back(static_cast<char>(value & 0xFF));
}

void put32(std::string& out, uint32_t value) {
  put16(out, static_cast<uint16_t>(value >> 16));
  put16(out, static_cast<uint16_t>(value & 0xFFFF));
}

// Host names only: letters, digits, '-' and '_' (service labels). Anything
// else, a '.' inside a label above all, would make the dotted text of a name
// ambiguous, and the dotted text is what the egress rules compare.
bool is_host_name_char(unsigned char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

using text::lower;

// Reads the name at *offset and moves *offset past it. Queries carry no
// compression pointers; in responses a pointer must point before the part
// of the name that holds it, so following pointers always ends. plain is
// false when a label holds a character outside is_host_name_char (the name
// then matches nothing, but the message is still well formed).
std::optional<std::string> read_name(std::string_view message, size_t* offset, bool allow_pointers,
                                     bool* plain) {
  std::string name;
  size_t octets = 0;
  size_t at = *offset;
  size_t segment_start = at;
  bool jumped = false;
  *plain = true;
  for (;;) {
    if (at >= message.size()) return std::nullopt;
    uint8_t length = static_cast<uint8_t>(message[at]);
    if ((length & 0xC0) == 0xC0) {
      if (!allow_pointers || at + 1 >= message.size()) return std::nullopt;
      size_t target = get16(message, at) & 0x3FFF;
      if (target >= segment_start) return std::nullopt;
      if (!jumped) *offset = at + 2;
      jumped = true;
      segment_start = at = target;
      continue;
    }
    if (length & 0xC0) return std::nullopt;  // 0x40 and 0x80: obsolete label types
    octets += 1 + length;
    if (octets > kMaxNameOctets) return std::nullopt;
    if (length == 0) {
      if (!jumped) *offset = at + 1;
      return name;
    }
    if (length > kMaxLabel || at + 1 + length > message.size()) return std::nullopt;
    if (!name.empty()) name.push_back('.');
    for (size_t i = at + 1; i <= at + length; ++i) {
      if (!is_host_name_char(static_cast<unsigned char>(message[i]))) *plain = false;
      name.push_back(lower(message[i]));
    }
    at += 1 + length;
  }
}

// Appends name in wire form; false when it is not a valid host name.
bool write_name(std::string& out, std::string_view name) {
  if (name.empty()) {  // the root
    out.push_back('\0');
    return true;
  }
  if (name.size() > kMaxNameOctets - 2) return false;
  for (const std::string& label : text::split(name, '.')) {
    if (label.empty() || label.size() > kMaxLabel) return false;
    for (char c : label)
      if (!is_host_name_char(static_cast<unsigned char>(c))) return false;
    out.push_back(static_cast<char>(label.size()));
    out += label;
  }
  out.push_back('\0');
  return true;
}

// Lower case, no trailing dot; nullopt when not a host name.
std::optional<std::string> normalize_host_name(std::string_view host) {
  if (!host.empty() && host.back() == '.') host.remove_suffix(1);
  if (host.empty()) return std::nullopt;
  std::string name;
  for (char c : host) name.push_back(lower(c));
  std::string probe;
  if (!write_name(probe, name)) return std::nullopt;
  return name;
}

size_t address_length(int family) { return family == AF_INET ? 4 : 16; }

Address address_from_bytes(int family, const char* bytes) {
  Address address;
  address.family = family;
  std::memcpy(address.bytes, bytes, address_length(family));
  return address;
}

std::string rcode_name(uint8_t rcode) {
  switch (rcode) {
    case kRcodeFormErr:
      return "FORMERR";
    case kRcodeServFail:
      return "SERVFAIL";
    case kRcodeNxDomain:
      return "NXDOMAIN";
    case kRcodeNotImp:
      return "NOTIMP";
    case kRcodeRefused:
      return "REFUSED";
    default:
      return "rcode " + std::to_string(rcode);
  }
}

// ---- responses from nameservers ---------------------------------------------

struct Record {
  std::string name;  // "" when not plain: matches no question
  uint16_t type = 0;
  uint16_t klass = 0;
  uint32_t ttl = 0;
  std::string data;  // the address bytes, or the target of a CNAME
};

struct Response {
  uint16_t id = 0;
  uint16_t flags = 0;
  Question question;
  std::vector<Record> answers;
  uint8_t rcode() const { return flags & 0x0F; }
  bool truncated() const { return flags & kFlagTruncated; }
};

// The header, question and answer section of a response; the authority and
// additional sections are not read. nullopt when malformed.
std::optional<Response> parse_response(std::string_view message) {
  if (message.size() < kHeaderSize) return std::nullopt;
  Response response;
  response.id = get16(message, 0);
  response.flags = get16(message, 2);
  if (!(response.flags & kFlagResponse) || ((response.flags >> 11) & 0x0F) != 0)
    return std::nullopt;
  if (get16(message, 4) != 1) return std::nullopt;
  uint16_t answer_count = get16(message, 6);
  size_t at = kHeaderSize;
  bool plain = true;
  auto name = read_name(message, &at, true, &plain);
  if (!name || !plain || at + 4 > message.size()) return std::nullopt;
  response.question = {*name, get16(message, at), get16(message, at + 2)};
  at += 4;
  for (uint16_t i = 0; i < answer_count; ++i) {
    Record record;
    auto owner = read_name(message, &at, true, &plain);
    if (!owner || at + 10 > message.size()) return std::nullopt;
    if (plain) record.name = *owner;
    record.type = get16(message, at);
    record.klass = get16(message, at + 2);
    record.ttl = get32(message, at + 4);
    size_t length = get16(message, at + 8);
    at += 10;
    if (at + length > message.size()) return std::nullopt;
    if (record.klass == kClassIN && (record.type == kTypeA || record.type == kTypeAAAA)) {
      if (length != address_length(record.type == kTypeA ? AF_INET : AF_INET6)) return std::nullopt;
      record.data.assign(message.substr(at, length));
    } else if (record.klass == kClassIN && record.type == kTypeCname) {
      size_t target_at = at;
      auto target = read_name(message, &target_at, true, &plain);
      if (!target || target_at != at + length) return std::nullopt;
      if (plain) record.data = *target;
    }
    at += length;
    response.answers.push_back(std::move(record));
  }
  return response;
}

// The addresses of type `type` for name, following CNAMEs inside the answer
// section; records of names off the chain are ignored. *ttl: the least TTL
// of the records used (the CNAMEs and the addresses).
std::vector<Address> addresses_for(const std::vector<Record>& answers, std::string name,
                                   uint16_t type, uint32_t* ttl) {
  int family = type == kTypeA ? AF_INET : AF_INET6;
  uint32_t least = UINT32_MAX;
  for (int hop = 0; hop <= kMaxCnameHops && !name.empty(); ++hop) {
    std::vector<Address> addresses;
    std::string alias;
    uint32_t alias_ttl = UINT32_MAX;
    for (const Record& record : answers) {
      if (record.name != name || record.klass != kClassIN) continue;
      if (record.type == type) {
        Address address = address_from_bytes(family, record.data.data());
        least = std::min(least, record.ttl);
        if (std::find(addresses.begin(), addresses.end(), address) == addresses.end())
          addresses.push_back(address);
      } else if (record.type == kTypeCname && alias.empty()) {
        alias = record.data;
        alias_ttl = record.ttl;
      }
    }
    if (!addresses.empty() || alias.empty()) {
      *ttl = least;
      return addresses;
    }
    least = std::min(least, alias_ttl);
    name = alias;
  }
  *ttl = least;
  return {};
}

std::string build_query(uint16_t id, const std::string& name, uint16_t type) {
  std::string out;
  put16(out, id);
  put16(out, kFlagRecursionDesired);
  put16(out, 1);  // one question, no other records
  put16(out, 0);
  put16(out, 0);
  put16(out, 0);
  write_name(out, name);
  put16(out, type);
  put16(out, kClassIN);
  return out;
}

// Query ids must not be guessable (an off-path attacker would have to guess
// the id and the source port to forge an answer).
uint16_t random_id() {
  uint16_t id = 0;
  if (::getrandom(&id, sizeof id, 0) == static_cast<ssize_t>(sizeof id)) return id;
  static std::random_device device;  // getrandom or /dev/urandom in libstdc++
  return static_cast<uint16_t>(device());
}

// "1.2.3.4", "1.2.3.4:5353", "::1", "[::1]:5353"; nullopt when malformed.
std::optional<udp::endpoint> parse_server(std::string_view text) {
  std::string host(text);
  uint16_t port = 53;
  auto set_port = [&](std::string_view digits) {
    auto value = text::parse_uint(digits, 65535);
    if (!value || *value == 0) return false;
    port = static_cast<uint16_t>(*value);
    return true;
  };
  if (!text.empty() && text.front() == '[') {
    size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = std::string(text.substr(1, close - 1));
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty() && (rest.front() != ':' || !set_port(rest.substr(1)))) return std::nullopt;
  } else if (std::count(text.begin(), text.end(), ':') == 1) {
    size_t colon = text.find(':');
    host = std::string(text.substr(0, colon));
    if (!set_port(text.substr(colon + 1))) return std::nullopt;
  }
  boost::system::error_code ec;
  auto address = asio::ip::make_address(host, ec);  // keeps a %scope of fe80::
  if (ec) return std::nullopt;
  return udp::endpoint(address, port);
}

std::string endpoint_text(const udp::endpoint& endpoint) {
  std::string address = endpoint.address().to_string();
  if (endpoint.address().is_v6()) address = "[" + address + "]";
  return address + ":" + std::to_string(endpoint.port());
}

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// A file read again only when it changed (a hosts file may be large; both
// may change while the gateway runs).
template <typename Parsed>
class CachedFile {
 public:
  using Parser = Parsed (*)(const std::string& content);
  explicit CachedFile(Parser parse) : parse_(parse) {}
  const Parsed& get(const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      valid_ = false;
      parsed_ = Parsed{};
      return parsed_;
    }
    bool same = valid_ && path == path_ && st.st_dev == stat_.st_dev && st.st_ino == stat_.st_ino &&
                st.st_size == stat_.st_size && st.st_mtim.tv_sec == stat_.st_mtim.tv_sec &&
                st.st_mtim.tv_nsec == stat_.st_mtim.tv_nsec;
    if (!same) {
      parsed_ = parse_(read_whole_file(path));
      path_ = path;
      stat_ = st;
      valid_ = true;
    }
    return parsed_;
  }

 private:
  Parser parse_;
  std::string path_;
  struct stat stat_ {};
  bool valid_ = false;
  Parsed parsed_;
};

using HostsTable = std::unordered_map<std::string, std::vector<Address>>;

// "ADDRESS NAME [ALIAS...]" lines, '#' comments. Names match in any case; a
// name on several lines gets the addresses of all of them, in file order.
HostsTable parse_hosts(const std::string& content) {
  HostsTable table;
  std::istringstream lines(content);
  std::string line;
  while (std::getline(lines, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string word;
    if (!(words >> word)) continue;
    auto address = Address::parse(word);
    if (!address) continue;  // e.g. fe80::1%eth0: a scope is no use for a proxy
    while (words >> word) {
      auto name = normalize_host_name(word);
      if (!name) continue;
      auto& addresses = table[*name];
      if (std::find(addresses.begin(), addresses.end(), *address) == addresses.end())
        addresses.push_back(*address);
    }
  }
  return table;
}

// The `nameserver` lines; '#' and ';' start comments.
std::vector<udp::endpoint> parse_resolv_conf(const std::string& content) {
  std::vector<udp::endpoint> servers;
  std::istringstream lines(content);
  std::string line;
  while (std::getline(lines, line)) {
    line = line.substr(0, line.find_first_of("#;"));
    std::istringstream words(line);
    std::string keyword, value;
    if (!(words >> keyword >> value) || keyword != "nameserver") continue;
    // Plain addresses only: resolv.conf has no syntax for a port.
    boost::system::error_code ec;
    auto address = asio::ip::make_address(value, ec);
    if (!ec) servers.emplace_back(address, 53);
  }
  return servers;
}

}  // namespace

// ---- the wire format ----------------------------------------------------------

std::optional<Query> parse_query(std::string_view message) {
  if (message.size() < kHeaderSize) return std::nullopt;
  uint16_t flags = get16(message, 2);
  if (flags & kFlagResponse) return std::nullopt;
  if (((flags >> 11) & 0x0F) != 0) return std::nullopt;  // only standard queries
  if (get16(message, 4) != 1) return std::nullopt;
  size_t at = kHeaderSize;
  bool plain = true;
  auto name = read_name(message, &at, false, &plain);
  if (!name || !plain || at + 4 > message.size()) return std::nullopt;
  Query query;
  query.id = get16(message, 0);
  query.recursion_desired = flags & kFlagRecursionDesired;
  query.question = {*name, get16(message, at), get16(message, at + 2)};
  return query;
}

std::string build_response(const Query& query, uint8_t rcode, const std::vector<Address>& answers,
                           uint32_t ttl) {
  std::string question;
  bool question_ok = write_name(question, query.question.name);
  if (!question_ok) rcode = kRcodeFormErr;
  put16(question, query.question.type);
  put16(question, query.question.klass);

  std::string records;
  uint16_t count = 0;
  int family = query.question.type == kTypeA ? AF_INET : AF_INET6;
  bool answerable = question_ok && rcode == kRcodeNoError && query.question.klass == kClassIN &&
                    (query.question.type == kTypeA || query.question.type == kTypeAAAA);
  for (const Address& address : answers) {
    if (!answerable || address.family != family) continue;
    size_t length = address_length(family);
    if (kHeaderSize + question.size() + records.size() + 12 + length > kMaxUdpMessage) break;
    put16(records, kPointerToQuestion);
    put16(records, query.question.type);
    put16(records, kClassIN);
    put32(records, ttl);
    put16(records, static_cast<uint16_t>(length));
    records.append(reinterpret_cast<const char*>(address.bytes), length);
    ++count;
  }

  std::string out;
  put16(out, query.id);
  uint16_t flags = kFlagResponse | kFlagRecursionAvailable | (rcode & 0x0F);
  if (query.recursion_desired) flags |= kFlagRecursionDesired;
  put16(out, flags);
  put16(out, question_ok ? 1 : 0);
  put16(out, count);
  put16(out, 0);
  put16(out, 0);
  if (question_ok) out += question;
  out += records;
  return out;
}

// ---- configuration ------------------------------------------------------------

ResolverConfig ResolverConfig::from_environment() {
  ResolverConfig config;
  if (const char* value = std::getenv("OPENSHELL_HOSTS_FILE"); value && *value)
    config.hosts_file = value;
  if (const char* value = std::getenv("OPENSHELL_RESOLV_CONF"); value && *value)
    config.resolv_conf = value;
  if (const char* value = std::getenv("OPENSHELL_DNS_SERVERS"); value && *value) {
    for (const std::string& part : text::split(value, ',')) {
      std::string_view server = text::trim(part);
      if (!server.empty()) config.servers.emplace_back(server);
    }
  }
  auto number = [](const char* variable, double least, const char* what) -> std::optional<double> {
    const char* value = std::getenv(variable);
    if (!value || !*value) return std::nullopt;
    char* end = nullptr;
    double parsed = std::strtod(value, &end);
    if (*end != '\0' || !std::isfinite(parsed) || parsed < least)
      throw Error(std::string(variable) + "=" + value + ": not " + what);
    return parsed;
  };
  if (auto rate = number("OPENSHELL_DNS_QUERY_RATE", 0,
                         "a number of DNS lookups a second (like 20; 0 for no limit)"))
    config.query_rate = *rate;
  if (auto burst = number("OPENSHELL_DNS_QUERY_BURST", 1, "a number of DNS lookups of at least 1"))
    config.query_burst = *burst;
  return config;
}

// ---- the resolver -------------------------------------------------------------

namespace {

class Lookup;

using Clock = std::chrono::steady_clock;

// What one lookup through the nameservers ended with.
struct LookupOutcome {
  std::vector<Address> addresses;
  std::string error;
  bool cacheable = false;     // a final answer: addresses, none, or NXDOMAIN
  uint32_t ttl = UINT32_MAX;  // the least TTL of the records used
};
using LookupDone = std::function<void(LookupOutcome)>;

// What the lookups of one Resolver share; they keep it alive.
struct ResolverState {
  asio::io_context& io;
  ResolverConfig config;
  std::vector<udp::endpoint> configured_servers;
  CachedFile<HostsTable> hosts{parse_hosts};
  CachedFile<std::vector<udp::endpoint>> resolv{parse_resolv_conf};
  std::list<std::weak_ptr<Lookup>> active;
  bool closed = false;

  struct CacheEntry {
    std::vector<Address> addresses;
    std::string error;  // NXDOMAIN
    Clock::time_point expires;
    std::list<std::string>::iterator recent;  // its place in `recency`
  };
  std::unordered_map<std::string, CacheEntry> cache;
  std::list<std::string> recency;  // most recently used first
  // Names being looked up, and who waits for each.
  std::unordered_map<std::string, std::vector<std::function<void(Resolution)>>> pending;
  double tokens = 0;
  Clock::time_point refilled;
  bool bucket_started = false;

  ResolverState(asio::io_context& context, ResolverConfig c) : io(context), config(std::move(c)) {
    if (!config.now) config.now = Clock::now;
  }

  const CacheEntry* cached(const std::string& name) {
    auto it = cache.find(name);
    if (it == cache.end()) return nullptr;
    if (config.now() >= it->second.expires) {
      recency.erase(it->second.recent);
      cache.erase(it);
      return nullptr;
    }
    recency.splice(recency.begin(), recency, it->second.recent);
    return &it->second;
  }

  void remember(const std::string& name, const LookupOutcome& outcome) {
    if (config.cache_entries == 0 || !outcome.cacheable) return;
    uint32_t ttl = outcome.addresses.empty() ? config.negative_ttl_s : outcome.ttl;
    ttl = std::max(config.min_ttl_s, std::min(ttl, config.max_ttl_s));
    if (auto it = cache.find(name); it != cache.end()) {
      recency.erase(it->second.recent);
      cache.erase(it);
    }
    while (cache.size() >= config.cache_entries) {
      cache.erase(recency.back());
      recency.pop_back();
    }
    recency.push_front(name);
    cache[name] = {outcome.addresses, outcome.error, config.now() + std::chrono::seconds(ttl),
                   recency.begin()};
  }

  // A token of the bucket for one lookup upstream; false when it is empty.
  bool take_token() {
    if (config.query_rate <= 0) return true;
    Clock::time_point now = config.now();
    if (!bucket_started) {
      bucket_started = true;
      tokens = config.query_burst;
      refilled = now;
    }
    double elapsed = std::chrono::duration<double>(now - refilled).count();
    if (elapsed > 0) {
      tokens = std::min(config.query_burst, tokens + elapsed * config.query_rate);
      refilled = now;
    }
    if (tokens < 1) return false;
    tokens -= 1;
    return true;
  }
};

// One name through the nameservers: an A and an AAAA query to a server at a
// time, the same server again only after all the others (attempts rounds).
// Each server gets its own connected UDP socket with a port the kernel
// picks at random, so answers from elsewhere never reach us.
class Lookup : public std::enable_shared_from_this<Lookup> {
 public:
  Lookup(std::shared_ptr<ResolverState> state, std::string name, std::vector<udp::endpoint> servers,
         LookupDone done)
      : state_(std::move(state)),
        name_(std::move(name)),
        servers_(std::move(servers)),
        done_(std::move(done)),
        timer_(state_->io) {
    sockets_.resize(servers_.size());
  }

  void start() { start_round(); }

  // The resolver went away: no callback, nothing more sent.
  void cancel() {
    finished_ = true;
    done_ = nullptr;
    stop();
  }

 private:
  struct Family {
    explicit Family(uint16_t t) : type(t) {}
    uint16_t type;
    bool answered = false;
    bool failed_this_round = false;
    std::vector<Address> addresses;
    uint32_t ttl = UINT32_MAX;
  };
  struct Sent {
    size_t server;
    uint16_t id;
    size_t family;
    unsigned round;
  };
  struct Socket {
    explicit Socket(asio::io_context& io) : socket(io) {}
    udp::socket socket;
    udp::endpoint sender;
    std::array<char, 65536> buffer;
  };

  void start_round() {
    ++round_;
    const udp::endpoint& server = servers_[server_];
    for (Family& family : families_) family.failed_this_round = false;
    for (size_t f = 0; f < families_.size(); ++f) {
      if (families_[f].answered) continue;
      std::string error = send(f);
      if (!error.empty()) {
        // Also the ICMP error of an earlier query ("Connection refused"):
        // this server answers nothing this round.
        for (Family& family : families_) family.failed_this_round = true;
        failure_ = "sending to " + endpoint_text(server) + ": " + error;
        break;
      }
    }
    timer_.expires_after(std::chrono::milliseconds(std::max(1, state_->config.timeout_ms)));
    timer_.async_wait([self = shared_from_this(), round = round_](boost::system::error_code ec) {
      if (ec || self->finished_ || round != self->round_) return;
      self->next_server();
    });
    if (round_failed()) {
      asio::post(state_->io, [self = shared_from_this(), round = round_] {
        if (!self->finished_ && round == self->round_) self->next_server();
      });
    }
  }

  // "" or why the query could not be sent.
  std::string send(size_t f) {
    if (!sockets_[server_]) {
      auto socket = std::make_unique<Socket>(state_->io);
      boost::system::error_code ec;
      socket->socket.open(servers_[server_].protocol(), ec);
      if (!ec) socket->socket.connect(servers_[server_], ec);
      if (ec) return ec.message();
      sockets_[server_] = std::move(socket);
      receive(server_);
    }
    uint16_t id = random_id();
    for (const Sent& sent : sent_)  // one id per outstanding query of this server
      if (sent.server == server_ && sent.id == id) id = static_cast<uint16_t>(id + 1);
    sent_.push_back({server_, id, f, round_});
    boost::system::error_code ec;
    sockets_[server_]->socket.send(asio::buffer(build_query(id, name_, families_[f].type)), 0, ec);
    return ec ? ec.message() : "";
  }

  void receive(size_t server) {
    Socket& socket = *sockets_[server];
    socket.socket.async_receive_from(
        asio::buffer(socket.buffer), socket.sender,
        [self = shared_from_this(), server](boost::system::error_code ec, size_t size) {
          self->received(server, ec, size);
        });
  }

  void received(size_t server, boost::system::error_code ec, size_t size) {
    if (finished_ || ec == asio::error::operation_aborted) return;
    Socket& socket = *sockets_[server];
    if (ec) {
      // ICMP port unreachable and the like: this server will not answer.
      failure_ = endpoint_text(servers_[server]) + ": " + ec.message();
      if (server == server_) {
        for (Family& family : families_) family.failed_this_round = true;
        next_server();
        if (finished_) return;
      }
    } else if (socket.sender == servers_[server]) {
      answer(server, std::string_view(socket.buffer.data(), size));
      if (finished_) return;
    }
    receive(server);
  }

  void answer(size_t server, std::string_view message) {
    auto response = parse_response(message);
    if (!response || response->question.name != name_ || response->question.klass != kClassIN)
      return;
    auto sent = std::find_if(sent_.begin(), sent_.end(), [&](const Sent& s) {
      return s.server == server && s.id == response->id &&
             families_[s.family].type == response->question.type;
    });
    if (sent == sent_.end()) return;  // not an answer to anything we asked
    Family& family = families_[sent->family];
    if (family.answered) return;
    uint8_t rcode = response->rcode();
    std::vector<Address> addresses;
    uint32_t ttl = UINT32_MAX;
    if (rcode == kRcodeNoError)
      addresses = addresses_for(response->answers, name_, family.type, &ttl);
    if (rcode == kRcodeNxDomain) return finish({}, name_ + ": no such host", true);
    if (rcode == kRcodeNoError && !(response->truncated() && addresses.empty())) {
      // A truncated answer is used for what it holds (no TCP fallback).
      family.answered = true;
      family.addresses = std::move(addresses);
      family.ttl = ttl;
    } else {
      failure_ = endpoint_text(servers_[server]) + " answered " +
                 (rcode == kRcodeNoError ? "a truncated message" : rcode_name(rcode));
      if (sent->round == round_) family.failed_this_round = true;
    }
    if (std::all_of(families_.begin(), families_.end(), [](const Family& f) { return f.answered; }))
      return finish(collect(), "", true);
    if (round_failed()) next_server();
  }

  // Every query still open in this round got a failure: no need to wait.
  bool round_failed() const {
    bool any_open = false;
    for (const Family& family : families_) {
      if (family.answered) continue;
      any_open = true;
      if (!family.failed_this_round) return false;
    }
    return any_open;
  }

  void next_server() {
    if (++server_ == servers_.size()) {
      server_ = 0;
      ++attempt_;
    }
    if (attempt_ >= std::max(1, state_->config.attempts)) return give_up();
    start_round();
  }

  void give_up() {
    std::vector<Address> addresses = collect();
    // One family answered: used, but not kept (the other may answer next time).
    if (!addresses.empty()) return finish(std::move(addresses), "", false);
    if (!failure_.empty()) return finish({}, name_ + ": DNS lookup failed: " + failure_, false);
    finish({}, name_ + ": DNS servers did not answer", false);
  }

  // IPv4 first: a host without an IPv6 route is more common than the opposite.
  std::vector<Address> collect() const {
    std::vector<Address> addresses;
    for (const Family& family : families_)
      addresses.insert(addresses.end(), family.addresses.begin(), family.addresses.end());
    return addresses;
  }

  void finish(std::vector<Address> addresses, std::string error, bool cacheable) {
    finished_ = true;
    stop();
    auto done = std::move(done_);
    done_ = nullptr;
    LookupOutcome outcome{std::move(addresses), std::move(error), cacheable, UINT32_MAX};
    for (const Family& family : families_)
      if (!family.addresses.empty()) outcome.ttl = std::min(outcome.ttl, family.ttl);
    if (done) done(std::move(outcome));
  }

  void stop() {
    ++round_;
    timer_.cancel();
    for (auto& socket : sockets_) {
      if (!socket) continue;
      boost::system::error_code ignored;
      socket->socket.close(ignored);
    }
  }

  std::shared_ptr<ResolverState> state_;
  std::string name_;
  std::vector<udp::endpoint> servers_;
  LookupDone done_;
  asio::steady_timer timer_;
  std::vector<std::unique_ptr<Socket>> sockets_;  // by server, opened on first use
  std::array<Family, 2> families_{Family(kTypeA), Family(kTypeAAAA)};
  std::vector<Sent> sent_;
  size_t server_ = 0;
  int attempt_ = 0;
  unsigned round_ = 0;
  std::string failure_;  // the last thing that went wrong with a server
  bool finished_ = false;
};

}  // namespace

struct Resolver::Impl : ResolverState {
  using ResolverState::ResolverState;
};

Resolver::Resolver(asio::io_context& io, ResolverConfig config)
    : impl_(std::make_shared<Impl>(io, std::move(config))) {
  for (const std::string& text : impl_->config.servers) {
    auto server = parse_server(text);
    if (!server) throw Error("DNS server \"" + text + "\": not an address or address:port");
    impl_->configured_servers.push_back(*server);
  }
}

Resolver::~Resolver() {
  impl_->closed = true;
  for (auto& weak : impl_->active)
    if (auto lookup = weak.lock()) lookup->cancel();
  impl_->active.clear();
}

void Resolver::resolve(const std::string& host, Callback done) {
  lookup(host, [done = std::move(done)](Resolution result) {
    done(std::move(result.addresses), std::move(result.error));
  });
}

void Resolver::lookup(const std::string& host, std::function<void(Resolution)> done) {
  auto impl = impl_;
  // Never call back from inside lookup(): the caller may still be setting up.
  auto later = [impl](std::function<void(Resolution)> callback, Resolution result) {
    asio::post(impl->io,
               [impl, callback = std::move(callback), result = std::move(result)]() mutable {
                 if (!impl->closed) callback(std::move(result));
               });
  };

  if (auto literal = Address::parse(host))
    return later(std::move(done), {{*literal}, "", Source::kLocal});
  auto name = normalize_host_name(host);
  if (!name)
    return later(std::move(done), {{}, "\"" + host + "\": not a valid host name", Source::kLocal});

  const HostsTable& hosts = impl->hosts.get(impl->config.hosts_file);
  if (auto entry = hosts.find(*name); entry != hosts.end())
    return later(std::move(done), {entry->second, "", Source::kLocal});

  if (const auto* entry = impl->cached(*name))
    return later(std::move(done), {entry->addresses, entry->error, Source::kCached});
  if (auto waiting = impl->pending.find(*name); waiting != impl->pending.end()) {
    waiting->second.push_back(std::move(done));  // one query for them all
    return;
  }

  std::vector<udp::endpoint> servers = impl->configured_servers;
  if (servers.empty()) servers = impl->resolv.get(impl->config.resolv_conf);
  if (servers.empty())
    return later(std::move(done),
                 {{},
                  *name + ": no DNS servers (no nameserver in " + impl->config.resolv_conf + ")",
                  Source::kLocal});

  if (!impl->take_token()) {
    std::ostringstream rate;
    rate << impl->config.query_rate;
    return later(std::move(done),
                 {{},
                  *name + ": too many DNS lookups (over " + rate.str() + " a second)",
                  Source::kRateLimited});
  }

  impl->pending[*name].push_back(std::move(done));
  ResolverState* state = impl.get();  // the lookup holds it alive
  auto finished = [state, name = *name](LookupOutcome outcome) {
    state->remember(name, outcome);
    auto waiting = state->pending.find(name);
    if (waiting == state->pending.end()) return;
    auto callbacks = std::move(waiting->second);
    state->pending.erase(waiting);
    Source source = Source::kUpstream;  // the first asked; the others shared its answer
    for (auto& callback : callbacks) {
      if (state->closed) return;
      callback({outcome.addresses, outcome.error, source});
      source = Source::kCached;
    }
  };
  impl->active.remove_if([](const std::weak_ptr<Lookup>& weak) { return weak.expired(); });
  auto lookup = std::make_shared<Lookup>(impl, *name, std::move(servers), std::move(finished));
  impl->active.push_back(lookup);
  lookup->start();
}

const char* source_name(Source source) {
  switch (source) {
    case Source::kLocal:
      return "local";
    case Source::kCached:
      return "cached";
    case Source::kUpstream:
      return "upstream";
    case Source::kRateLimited:
      return "rate_limited";
  }
  return "local";
}

}  // namespace openshell::egress
