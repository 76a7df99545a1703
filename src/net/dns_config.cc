// The resolver's configuration: the environment, the hosts file, resolv.conf.
// Each file is read again when it changes.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/text.h"
#include "net/dns_internal.h"

namespace openshell::net::dns {
namespace detail {

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

}  // namespace detail

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

}  // namespace openshell::net::dns
