// From a policy's endpoint to the layer-7 rules that judge its requests:
// the policy's schema meets egress::HttpRules here only, as it meets
// egress::NetworkRules in network_rules.h.
#pragma once

#include "egress/http_rules.h"
#include "policy/policy.h"

namespace openshell::supervisor {

// The endpoint's enforcement, access, rules, deny_rules and
// allow_encoded_slash. Throws Error (as egress::HttpRules does) for an
// access that policy::parse() would refuse.
egress::HttpRules::Spec http_rules_spec(const policy::Endpoint& endpoint);
egress::HttpRules http_rules(const policy::Endpoint& endpoint);

}  // namespace openshell::supervisor
