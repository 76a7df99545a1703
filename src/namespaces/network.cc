#include "namespaces/network.h"

#include <arpa/inet.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include "base/unique_fd.h"

namespace openshell::namespaces {

bool bring_up_loopback(ChildFailure* f) noexcept {
  UniqueFd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) return child::fail(f, errno, "socket for the loopback interface");
  ifreq ifr{};
  child::copy(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  if (::ioctl(s.get(), SIOCSIFFLAGS, &ifr) != 0) return child::fail(f, errno, "bring up", "lo");
  return true;
}

bool make_egress_sockets(int* proxy_fd, int* dns_fd, ChildFailure* f) noexcept {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // UniqueFd: its destructor is a close(2), fit for the child before exec.
  UniqueFd tcp(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!tcp) return child::fail(f, errno, "socket for the egress proxy");
  int one = 1;
  ::setsockopt(tcp.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  addr.sin_port = htons(kProxyPort);
  if (::bind(tcp.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(tcp.get(), 1024) != 0)
    return child::fail(f, errno, "listen on 127.0.0.1:3128 for the egress proxy");
  UniqueFd udp(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!udp) return child::fail(f, errno, "socket for the DNS stub");
  addr.sin_port = htons(kDnsPort);
  if (::bind(udp.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    return child::fail(f, errno, "bind 127.0.0.1:53 for the DNS stub");
  *proxy_fd = tcp.release();
  *dns_fd = udp.release();
  return true;
}

int make_sock_diag_socket() noexcept {
  return ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
}

}  // namespace openshell::namespaces
