// config.json's linux.seccomp (runtime-spec 1.0-1.2) -> a BPF program,
// through libseccomp, in the parent: the child installs it with
// runtime::seccomp::install.
#pragma once

#include <linux/filter.h>

#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/seccomp.h"

namespace openshell::oci {

struct SeccompFilter {
  std::vector<sock_filter> code;
  // SECCOMP_FILTER_FLAG_* the profile's "flags" asked for (those the kernel
  // takes at install; libseccomp's attributes cover the rest).
  unsigned flags = 0;
  runtime::seccomp::Program program() const {
    return {code.data(), static_cast<unsigned short>(code.size())};
  }
};

// Throws Error naming the field, e.g.
// "config.json: linux.seccomp.syscalls[3].action: \"SCMP_ACT_FOO\" is not an action".
SeccompFilter compile_seccomp(const nlohmann::json& profile);

}  // namespace openshell::oci
