// Loading the seccomp filter (the default profile is compiled at build time).
#pragma once

#include <linux/filter.h>

#include "base/child_failure.h"

namespace openshell::runtime::seccomp {

struct Program {
  const sock_filter* filter = nullptr;
  unsigned short length = 0;
};

// The built-in default profile.
Program default_program();

// Child side: installs the program (no_new_privs must already be set).
bool install(const Program& program, ChildFailure* failure) noexcept;

}  // namespace openshell::runtime::seccomp
