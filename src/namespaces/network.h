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

// Child side: a NETLINK_SOCK_DIAG socket of the current network namespace,
// or -1 when the kernel refuses one (not a failure: the proxy then
// identifies its callers through /proc). Handed to the owner like the
// egress sockets: a netlink socket queries the namespace it was made in,
// wherever it is used, so the owner needs no setns() (which a rootless
// owner could not do: it lacks CAP_SYS_ADMIN in its own user namespace).
int make_sock_diag_socket() noexcept;

}  // namespace openshell::namespaces
