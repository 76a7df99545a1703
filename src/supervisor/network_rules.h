// From a policy's [network_policies] to the egress proxy's rules: the one
// place where the policy's schema meets the proxy, for the supervisor and
// for `openshell run`.
#pragma once

#include "egress/rules.h"
#include "policy/policy.h"

namespace openshell::supervisor {

// Throws Error for an allowed_ips entry that is not a CIDR, which only a
// policy that policy::parse() did not return can hold:
// "network_policies.NAME.endpoints[I].allowed_ips[J]: REASON".
egress::NetworkRules network_rules(const policy::Policy& policy,
                                   const egress::NetworkRules::PathResolver& resolve = {});

}  // namespace openshell::supervisor
