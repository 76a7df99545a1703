#include "base/error.h"

#include <fcntl.h>

#include <cerrno>
#include <cstring>

#include "base/unique_fd.h"

namespace openshell {

std::string errno_message(const std::string& what, int err) {
  std::string out = what;
  out += ": ";
  out += std::strerror(err);
  return out;
}

void throw_errno(const std::string& what) { throw_errno(what, errno); }

void throw_errno(const std::string& what, int err) { throw Error(errno_message(what, err)); }

Pipe Pipe::create() {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe");
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

}  // namespace openshell
