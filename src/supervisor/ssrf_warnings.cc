#include "supervisor/ssrf_warnings.h"

#include <netinet/in.h>

#include <algorithm>
#include <cctype>
#include <optional>

#include "base/address.h"
#include "egress/rules.h"

namespace openshell::supervisor {

namespace {

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// The addresses a host stands for without a lookup; none when it needs one.
std::vector<Address> known_addresses(const std::string& host) {
  if (auto address = Address::parse(host)) return {*address};
  std::string name = lower(host);
  if (!name.empty() && name.back() == '.') name.pop_back();
  if (name == "localhost" || name.ends_with(".localhost"))
    return {*Address::parse("127.0.0.1"), *Address::parse("::1")};
  return {};
}

// Whether an endpoint lets a connection use the address: its allowed_ips,
// or the SSRF guard when it has none.
bool admits(const policy::Endpoint& endpoint, const Address& address) {
  if (endpoint.allowed_ips.empty()) return egress::special_address_reason(address).empty();
  return std::any_of(endpoint.allowed_ips.begin(), endpoint.allowed_ips.end(),
                     [&](const std::string& entry) {
                       auto cidr = Cidr::parse(entry);
                       return cidr && cidr->contains(address);
                     });
}

}  // namespace

std::vector<RefusedEndpoint> ssrf_refused_endpoints(const policy::Policy& policy) {
  std::vector<RefusedEndpoint> refused;
  for (const auto& rule : policy.network)
    for (size_t i = 0; i < rule.endpoints.size(); ++i) {
      const policy::Endpoint& endpoint = rule.endpoints[i];
      std::vector<Address> addresses = known_addresses(endpoint.host);
      if (addresses.empty()) continue;
      for (uint16_t port : endpoint.ports) {
        // Any endpoint (of any rule) for this host and port may admit it.
        bool admitted = false;
        for (const auto& other_rule : policy.network)
          for (const auto& other : other_rule.endpoints) {
            bool serves =
                egress::host_matches(other.host, endpoint.host) &&
                std::find(other.ports.begin(), other.ports.end(), port) != other.ports.end();
            if (!serves) continue;
            for (const auto& address : addresses) admitted = admitted || admits(other, address);
          }
        if (admitted) continue;
        const Address& first = addresses.front();
        RefusedEndpoint r;
        r.rule = rule.name;
        r.field = "network_policies." + rule.name + ".endpoints[" + std::to_string(i) + "]";
        r.host = endpoint.host;
        r.port = port;
        r.address = first.to_string();
        r.reason = endpoint.allowed_ips.empty() ? egress::special_address_reason(first)
                                                : "not in the endpoint's allowed_ips";
        r.cidr = r.address + (first.family == AF_INET ? "/32" : "/128");
        refused.push_back(std::move(r));
      }
    }
  return refused;
}

std::string describe(const RefusedEndpoint& r) {
  bool v6 = r.host.find(':') != std::string::npos;
  std::string endpoint = (v6 ? "[" + r.host + "]" : r.host) + ":" + std::to_string(r.port);
  std::string why = r.reason == "not in the endpoint's allowed_ips"
                        ? r.address + " is not in its allowed_ips"
                        : "the SSRF guard refuses " + r.address + " (" + r.reason + ")";
  return endpoint + " can never connect: " + why;
}

}  // namespace openshell::supervisor
