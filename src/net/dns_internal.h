// Private to src/net: what the DNS files share.
#pragma once

#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <boost/asio/ip/udp.hpp>

#include "net/dns.h"

namespace openshell::net::dns::detail {

namespace asio = boost::asio;
using asio::ip::udp;

inline constexpr uint16_t kFlagTruncated = 0x0200;

// Lower case, no trailing dot; nullopt when not a host name.
std::optional<std::string> normalize_host_name(std::string_view host);

std::string rcode_name(uint8_t rcode);

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
std::optional<Response> parse_response(std::string_view message);

// The addresses of type `type` for name, following CNAMEs inside the answer
// section; records of names off the chain are ignored. *ttl: the least TTL
// of the records used (the CNAMEs and the addresses).
std::vector<Address> addresses_for(const std::vector<Record>& answers, std::string name,
                                   uint16_t type, uint32_t* ttl);

std::string build_query(uint16_t id, const std::string& name, uint16_t type);

// "1.2.3.4", "1.2.3.4:5353", "::1", "[::1]:5353"; nullopt when malformed.
std::optional<udp::endpoint> parse_server(std::string_view text);

std::string endpoint_text(const udp::endpoint& endpoint);

std::string read_whole_file(const std::string& path);

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
HostsTable parse_hosts(const std::string& content);

// The `nameserver` lines; '#' and ';' start comments.
std::vector<udp::endpoint> parse_resolv_conf(const std::string& content);

}  // namespace openshell::net::dns::detail
