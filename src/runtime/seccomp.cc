#include "runtime/seccomp.h"

#include <linux/seccomp.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "seccomp_default.h"

namespace openshell::runtime::seccomp {

Program default_program() {
  return Program{generated::kDefaultFilter,
                 static_cast<unsigned short>(sizeof generated::kDefaultFilter /
                                             sizeof generated::kDefaultFilter[0])};
}

bool install(const Program& program, ChildFailure* failure) noexcept {
  sock_fprog prog{program.length, const_cast<sock_filter*>(program.filter)};
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
    return child::fail(failure, errno, "install the seccomp filter");
  return true;
}

}  // namespace openshell::runtime::seccomp
