#include "auth/peer.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <sstream>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace openshell::auth {

namespace {

// The value of a "Name:\t..." line of a /proc status or fdinfo text.
bool field(const std::string& text, const std::string& name, std::string* value) {
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind(name + ":", 0) != 0) continue;
    *value = line.substr(name.size() + 1);
    return true;
  }
  return false;
}

int depth_of(const std::string& nspid) {
  std::istringstream words(nspid);
  long pid;
  int depth = 0;
  while (words >> pid) {
    if (pid <= 0) return 0;
    ++depth;
  }
  return depth;
}

bool read_text(const std::string& path, std::string* text) {
  auto content = files::try_read(path);
  if (!content) return false;
  *text = std::move(*content);
  return true;
}

}  // namespace

int nspid_depth(const std::string& status_text) {
  std::string nspid;
  return field(status_text, "NSpid", &nspid) ? depth_of(nspid) : 0;
}

// The peer's pid as SO_PEERCRED gives it is translated into our pid
// namespace: 0 when the peer is not visible from here, else it lives in our
// namespace or a descendant, and the length of its NSpid line (its pids from
// the namespace of our /proc down to its own) tells which. A pidfd of the
// peer (SO_PEERPIDFD) pins the process, so a pid reused after the peer exited
// is never mistaken for it; its fdinfo says "Pid: -1" once the peer is gone.
std::string peer_in_sandbox(int fd) {
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0)
    return errno_message("the peer's credentials (SO_PEERCRED)", errno);
  if (cred.pid <= 0) return "the peer's process is not visible from this pid namespace";

  // Our own depth never changes: read once (a thread-safe static).
  static const int own_depth = [] {
    std::string self;
    return read_text("/proc/self/status", &self) ? nspid_depth(self) : 0;
  }();
  if (own_depth == 0) return "/proc/self/status has no NSpid line (or cannot be read)";

  int pidfd = -1;
  length = sizeof pidfd;
  std::string info;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD, &pidfd, &length) == 0 && pidfd >= 0) {
    UniqueFd owned(pidfd);
    if (!read_text("/proc/self/fdinfo/" + std::to_string(pidfd), &info))
      return "cannot read the fdinfo of the peer's pidfd";
  } else if (errno == ENOPROTOOPT) {
    // Older kernels: the pid itself (a pid reused in between could mislead us,
    // but only towards a process of a pid namespace as deep as the peer's).
    if (!read_text("/proc/" + std::to_string(cred.pid) + "/status", &info))
      return "the peer's process (pid " + std::to_string(cred.pid) + ") is gone";
  } else {
    // The kernel has no pidfd for a process that has exited.
    return errno_message("the peer's process (pid " + std::to_string(cred.pid) +
                             ") is gone: a pidfd of it (SO_PEERPIDFD)",
                         errno);
  }
  std::string pid;
  if (field(info, "Pid", &pid) && std::atol(pid.c_str()) <= 0)
    return "the peer's process (pid " + std::to_string(cred.pid) + ") has exited";
  int peer_depth = nspid_depth(info);
  if (peer_depth == 0)
    return "the pid namespace of the peer (pid " + std::to_string(cred.pid) + ") is unknown";
  if (peer_depth != own_depth)
    return "the peer (pid " + std::to_string(cred.pid) +
           ") is inside a sandbox (another pid namespace)";
  return "";
}

}  // namespace openshell::auth
