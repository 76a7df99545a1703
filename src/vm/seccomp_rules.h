// What each kind of VMM thread may ask of the kernel once the guest runs:
// the system calls, the ioctl request numbers (matched exactly), and the
// calls that may map or protect memory only without PROT_EXEC. Anything
// else kills the VMM process (SECCOMP_RET_KILL_PROCESS): one sandbox's VMM,
// never its supervisor. tools/vmm_seccomp_gen compiles these rules with
// libseccomp into BPF programs at build time (vmm_seccomp.h); confine.h
// installs them.
#pragma once

#include <vector>

namespace openshell::vm::seccomp_rules {

enum class Thread { kMain, kVcpu, kDevice };
inline constexpr Thread kThreads[] = {Thread::kMain, Thread::kVcpu, Thread::kDevice};

struct ThreadRules {
  const char* name;                       // "vcpu": the generated program's name
  std::vector<const char*> syscalls;      // allowed with any arguments
  std::vector<const char*> without_exec;  // allowed when arg 2 has no PROT_EXEC
  std::vector<unsigned long> ioctls;      // ioctl allowed with these requests only
};

const ThreadRules& rules(Thread thread);

}  // namespace openshell::vm::seccomp_rules
