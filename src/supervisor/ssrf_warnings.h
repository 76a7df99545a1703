// Endpoints that the egress proxy's SSRF guard makes useless: a host whose
// address is known without a lookup (an IP literal, "localhost" and names
// under .localhost) and that no endpoint for that host and port admits, so
// that every connection to it is refused however the policy's rules match.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "policy/policy.h"

namespace openshell::supervisor {

struct RefusedEndpoint {
  std::string rule;   // "local"
  std::string field;  // "network_policies.local.endpoints[0]"
  std::string host;   // as written
  uint16_t port = 0;
  std::string address;  // the address refused: "127.0.0.1"
  std::string reason;   // "loopback", or "not in the endpoint's allowed_ips"
  std::string cidr;     // what allowed_ips needs: "127.0.0.1/32"
};

std::vector<RefusedEndpoint> ssrf_refused_endpoints(const policy::Policy& policy);

// "localhost:9000 can never connect: the SSRF guard refuses 127.0.0.1
// (loopback)"; the caller adds the fix it can offer.
std::string describe(const RefusedEndpoint& refused);

}  // namespace openshell::supervisor
