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
  // SECCOMP_FILTER_FLAG_LOG and _SPEC_ALLOW, when the profile's "flags" ask
  // for them: flags of seccomp(2) itself, not part of the program, so the
  // install must pass them. TSYNC is never here: the child has one thread.
  unsigned flags = 0;
  runtime::seccomp::Program program() const {
    return {code.data(), static_cast<unsigned short>(code.size()), flags};
  }
};

// Reads the profile as runc does: a system call name libseccomp does not
// know is skipped (profiles name calls newer than the kernel), a rule that
// repeats the default action is dropped, conditions all on one argument are
// alternatives and on several must all hold. SCMP_ACT_NOTIFY and a listener
// are refused. The no_new_privs bit is left to the caller.
//
// Throws Error, one line naming the field, e.g.
// "config.json: linux.seccomp.syscalls[3].action: \"SCMP_ACT_FOO\" is not a seccomp action".
SeccompFilter compile_seccomp(const nlohmann::json& profile);

}  // namespace openshell::oci
