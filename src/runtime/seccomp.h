// Loading the seccomp filter (the default profile is compiled at build time).
#pragma once

#include <linux/filter.h>

#include "base/child_failure.h"

namespace openshell::runtime::seccomp {

struct Program {
  const sock_filter* filter = nullptr;
  unsigned short length = 0;
  // SECCOMP_FILTER_FLAG_* passed to seccomp(2) with it (LOG, SPEC_ALLOW).
  unsigned flags = 0;
};

// The built-in default profile.
Program default_program();

// Child side: installs the program (no_new_privs must already be set).
bool install(const Program& program, ChildFailure* failure) noexcept;

// A second, small filter that sends every connect(2) of the sandbox to a
// seccomp user-notification listener, so that the owner sees which process
// connects each socket (the egress proxy's binaries rule: see
// egress/connect_watch.h). The owner answers each with "continue": the
// kernel then performs the connect itself, as if there were no filter.
//
// A process may have only one listener among its filters: a program in the
// sandbox that installs a filter with a listener of its own gets EBUSY.
//
// Child side, no_new_privs already set: returns the listener's fd
// (close-on-exec), or -errno when the kernel cannot: no user notification
// or no pidfd_getfd(2) (before Linux 5.6), which the owner needs to look at
// the socket; then connects are not sent anywhere.
int install_connect_listener() noexcept;

}  // namespace openshell::runtime::seccomp
