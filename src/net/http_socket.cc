// Unix socket helpers shared by the server, the client and the WebSocket.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "base/error.h"
#include "net/http_internal.h"

namespace openshell::net {
namespace detail {

PeerCredentials peer_credentials(int fd) {
  PeerCredentials peer;
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
  } else {
    // Never let a failed lookup read as root.
    peer.pid = 0;
    peer.uid = static_cast<uid_t>(-1);
    peer.gid = static_cast<gid_t>(-1);
  }
  return peer;
}

void set_cloexec(int fd) {
  int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

// Asio opens sockets without SOCK_CLOEXEC; ours must not leak into children.
UniqueFd open_unix_socket(const std::string& what) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("socket for " + what);
  return fd;
}

bool fill_address(const std::string& path, sockaddr_un& address) {
  address = {};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, path.data(), path.size());
  return true;
}

// True when something accepts connections on path (a live server, not a
// stale file). A full backlog (EAGAIN) also means a live server.
bool server_listens(const std::string& path) {
  sockaddr_un address;
  if (!fill_address(path, address)) return false;
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return false;
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) return true;
  return errno == EAGAIN || errno == EINPROGRESS;
}

}  // namespace detail

std::string untrusted_server(int fd, const std::string& socket_path) {
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0)
    return errno_message("the server at " + socket_path + ": its credentials (SO_PEERCRED)", errno);
  uid_t own = ::geteuid();
  if (cred.uid == own || cred.uid == 0) return "";
  return "the server at " + socket_path + " runs as uid " + std::to_string(cred.uid) +
         ", not as you (uid " + std::to_string(own) +
         ") or root: refusing to talk to it (someone else may be impersonating the gateway)";
}

}  // namespace openshell::net
