#include "namespaces/network.h"

#include <net/if.h>
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

}  // namespace openshell::namespaces
