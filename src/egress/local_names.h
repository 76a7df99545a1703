// Names that never leave the sandbox: localhost and the sandbox's own host
// name, as its /etc/hosts has them (namespaces/mounts.h). The DNS stub
// answers them itself, without a rule and without a denial in the log.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/address.h"

namespace openshell::egress {

// The addresses of `name` (lower case, no trailing dot) when it is one of
// the sandbox's local names: "localhost" (and any name below it, RFC 6761)
// is 127.0.0.1 and ::1, `hostname` is 127.0.0.1. nullopt: not a local name.
std::optional<std::vector<Address>> local_name_addresses(const std::string& name,
                                                         const std::string& hostname);

}  // namespace openshell::egress
