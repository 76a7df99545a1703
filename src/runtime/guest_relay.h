// The micro-VM guest's only ways out: the guest init relays the sandbox's
// HTTP proxy connections and DNS queries to the host over vsock, where the
// supervisor's egress proxy and DNS stub judge them as a container
// sandbox's. The guest kernel has TCP and UDP on the loopback interface
// alone (no network device), so inside the guest:
//
//   TCP 127.0.0.1:3128  each connection: a vsock connection to the host's
//                       egress port, an identity line first, then the bytes
//                       both ways
//   UDP 127.0.0.1:53    each query: a message on one DNS stream to the
//                       host's DNS port (DNS over TCP's framing: a 2-byte
//                       big-endian length, then the message), the answer
//                       sent back to the address that asked
//
// The identity line names the process that connected, found as the egress
// proxy's /proc fallback finds it (the socket's inode in /proc/net/tcp, then
// the process holding it) and judged by base/exe_credit.h's rules:
//   {"pid":N,"exe":"/usr/bin/curl","untrusted":""}\n
//
// The host's ports are reached through a HostConnector: AF_VSOCK to CID 2
// in the guest, anything that gives a stream socket in the tests.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "base/unique_fd.h"

namespace openshell::runtime::guest {

inline constexpr uint16_t kProxyPort = 3128;  // the sandbox's HTTP_PROXY, as in a container
inline constexpr uint16_t kDnsPort = 53;
inline constexpr size_t kMaxRelayedConnections = 256;

// A connected stream socket to the host's `port`, or an invalid fd with
// errno set.
using HostConnector = std::function<UniqueFd(uint32_t port)>;

// AF_VSOCK to the host (CID 2, VMADDR_CID_HOST), from a reserved port
// (kReservedPortFirst to 1023): binding one takes CAP_NET_BIND_SERVICE,
// which the init has and the sandbox's processes do not, so the host
// takes a connection from any other port as not the init's (their seccomp
// filter refuses AF_VSOCK sockets too). EADDRINUSE when every one is taken.
inline constexpr uint32_t kReservedPortFirst = 512;
UniqueFd connect_to_host(uint32_t port);

// Brings the loopback interface up (the kernel leaves it down). Throws Error.
void bring_up_loopback();

// A socket on 127.0.0.1:port (0: any free one): TCP listening, or UDP bound.
// Throws Error naming the port.
UniqueFd listen_loopback_tcp(uint16_t port);
UniqueFd bind_loopback_udp(uint16_t port);

// {"pid":N,"exe":"...","untrusted":"..."} and a newline.
std::string identity_line(pid_t pid, const std::string& exe, const std::string& untrusted);

// The identity line for the client of `conn` (a connection accepted on a
// loopback listener): the newest process holding the client's socket, or
// pid 0 and exe "" when none is found.
std::string identity_of_client(int conn);

// Copies bytes both ways between a and b until both directions ended (an
// end's EOF is passed on as a shutdown of the other's writing side) or one
// fails. Neither side's slowness blocks the other direction.
void splice_both_ways(int a, int b);

// One relayed connection: the identity line to a new connection to the
// host's `host_port`, then splice_both_ways. Returns when it ends.
void relay_connection(UniqueFd conn, uint32_t host_port, const HostConnector& connect);

// Accepts on listener forever; each connection is relayed in a process of
// its own, at most max_connections at a time (further ones wait in the
// listen backlog). Reaps its own children: run it in a process of its own.
[[noreturn]] void serve_egress(int listener, uint32_t host_port, const HostConnector& connect,
                               size_t max_connections = kMaxRelayedConnections);

// Relays the queries arriving on udp (a bound datagram socket) over one DNS
// stream to the host's `host_port`, made when the first query arrives and
// made again when it ends. Query IDs are rewritten on the way out (two
// callers may use the same one) and restored on the way back; a query
// without an answer in 10 seconds is forgotten. Forever: run it in a process
// of its own.
[[noreturn]] void serve_dns(int udp, uint32_t host_port, const HostConnector& connect);

}  // namespace openshell::runtime::guest
