#include "supervisor/network_rules.h"

#include <string>
#include <utility>
#include <vector>

#include "base/address.h"
#include "base/error.h"

namespace openshell::supervisor {

egress::NetworkRules network_rules(const policy::Policy& policy,
                                   const egress::NetworkRules::PathResolver& resolve) {
  std::vector<egress::NetworkRules::Rule> rules;
  for (const auto& network : policy.network) {
    egress::NetworkRules::Rule rule;
    rule.name = network.name;
    for (size_t i = 0; i < network.endpoints.size(); ++i) {
      const auto& source = network.endpoints[i];
      egress::NetworkRules::Endpoint endpoint;
      endpoint.host = source.host;
      endpoint.ports = source.ports;
      for (size_t j = 0; j < source.allowed_ips.size(); ++j) {
        auto cidr = Cidr::parse(source.allowed_ips[j]);
        // policy::parse() refuses these; a policy built in code may still hold one.
        if (!cidr)
          throw Error("network_policies." + network.name + ".endpoints[" + std::to_string(i) +
                      "].allowed_ips[" + std::to_string(j) +
                      "]: " + policy::check_allowed_ip(source.allowed_ips[j]));
        endpoint.allowed_ips.push_back(*cidr);
      }
      // Layer 7 is judged per request, which this proxy does not do yet: an
      // endpoint that asks for it allows nothing rather than every request.
      if (!source.protocol.empty())
        endpoint.refusal = "its endpoint asks for layer-7 inspection (protocol = \"" +
                           source.protocol + "\"), which is not in this build";
      rule.endpoints.push_back(std::move(endpoint));
    }
    for (const auto& binary : network.binaries) rule.binaries.push_back(binary.path);
    rules.push_back(std::move(rule));
  }
  return egress::NetworkRules(rules, resolve);
}

}  // namespace openshell::supervisor
