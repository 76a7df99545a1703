// The sandbox's network namespace: only loopback, and it is up.
#pragma once

#include <cstdint>

#include "base/child_failure.h"

namespace openshell::namespaces {

// Child side: brings up "lo" in the current network namespace.
bool bring_up_loopback(ChildFailure* failure) noexcept;

// Where the sandbox's egress proxy and DNS stub listen, inside its network
// namespace.
inline constexpr uint16_t kProxyPort = 3128;
inline constexpr uint16_t kDnsPort = 53;

// Child side: makes the proxy's TCP listener (127.0.0.1:3128) and the DNS
// stub's UDP socket (127.0.0.1:53) in the current network namespace. The
// host-side owner serves them; they never stay open in the sandbox.
bool make_egress_sockets(int* proxy_fd, int* dns_fd, ChildFailure* failure) noexcept;

}  // namespace openshell::namespaces
