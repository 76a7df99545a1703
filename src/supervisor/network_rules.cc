#include "supervisor/network_rules.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/address.h"
#include "base/error.h"
#include "supervisor/http_rules.h"

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
      // Layer 7: every request is judged, unless its TLS is relayed unread
      // (tls = "skip", which parse() allows only without rules).
      if (!source.protocol.empty() && source.tls != "skip") {
        auto inspection = std::make_shared<egress::Inspection>();
        inspection->policy = network.name;
        inspection->protocol = source.protocol;
        inspection->rules = http_rules(source);
        inspection->ca_file = source.ca_file;
        for (const auto& place : source.credentials_in) {
          inspection->credentials_in_query = inspection->credentials_in_query || place == "query";
          inspection->credentials_in_body = inspection->credentials_in_body || place == "body";
        }
        endpoint.inspect = std::move(inspection);
      }
      rule.endpoints.push_back(std::move(endpoint));
    }
    for (const auto& binary : network.binaries) rule.binaries.push_back(binary.path);
    rules.push_back(std::move(rule));
  }
  return egress::NetworkRules(rules, resolve);
}

}  // namespace openshell::supervisor
