// The sandbox's network namespace: only loopback, and it is up.
#pragma once

#include "base/child_failure.h"

namespace openshell::namespaces {

// Child side: brings up "lo" in the current network namespace.
bool bring_up_loopback(ChildFailure* failure) noexcept;

}  // namespace openshell::namespaces
