#include "namespaces/network.h"

#include <arpa/inet.h>
#include <linux/netlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

namespace openshell::namespaces {

bool bring_up_loopback(ChildFailure* f) noexcept {
  int s = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (s < 0) return child::fail(f, errno, "socket for the loopback interface");
  ifreq ifr{};
  child::copy(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
  ifr.ifr_flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING;
  int rc = ::ioctl(s, SIOCSIFFLAGS, &ifr);
  int err = errno;
  ::close(s);
  if (rc != 0) return child::fail(f, err, "bring up", "lo");
  return true;
}

bool make_egress_sockets(int* proxy_fd, int* dns_fd, ChildFailure* f) noexcept {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (tcp < 0) return child::fail(f, errno, "socket for the egress proxy");
  int one = 1;
  ::setsockopt(tcp, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  addr.sin_port = htons(kProxyPort);
  if (::bind(tcp, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(tcp, 1024) != 0) {
    int err = errno;
    ::close(tcp);
    return child::fail(f, err, "listen on 127.0.0.1:3128 for the egress proxy");
  }
  int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (udp < 0) {
    int err = errno;
    ::close(tcp);
    return child::fail(f, err, "socket for the DNS stub");
  }
  addr.sin_port = htons(kDnsPort);
  if (::bind(udp, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(tcp);
    ::close(udp);
    return child::fail(f, err, "bind 127.0.0.1:53 for the DNS stub");
  }
  *proxy_fd = tcp;
  *dns_fd = udp;
  return true;
}

int make_sock_diag_socket() noexcept {
  return ::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
}

}  // namespace openshell::namespaces
