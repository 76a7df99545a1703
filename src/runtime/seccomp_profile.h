// The default seccomp profile, modelled on Docker's default: system calls are
// refused with EPERM unless allowed here; those newer than anything this
// profile knows get ENOSYS, so that programs fall back to older calls; a few
// are allowed only with safe arguments.
//
// The profile is data. tools/seccomp_gen compiles it with libseccomp at build
// time into a BPF program that is embedded in the binary, so starting a
// sandbox never compiles a filter.
#pragma once

#include <cstdint>

namespace openshell::runtime::seccomp_profile {

// A system call by name, or by number for those newer than libseccomp's table
// (numbers from 424 on are the same on every architecture).
struct Syscall {
  const char* name;
  int number = -1;
};

// Allowed with any arguments.
extern const Syscall kAllowed[];
extern const int kAllowedCount;

// Named so that the profile "knows" them (EPERM, not ENOSYS), though refused.
extern const Syscall kRefused[];
extern const int kRefusedCount;

// Refused with ENOSYS so that callers fall back (clone3's flags live in
// memory that a filter cannot inspect; glibc falls back to clone).
extern const Syscall kUnavailable[];
extern const int kUnavailableCount;

// Namespace flags that clone and unshare may not carry.
inline constexpr uint64_t kNamespaceFlags = 0x00020000ULL /*NEWNS*/ | 0x02000000ULL /*NEWCGROUP*/ |
                                            0x04000000ULL /*NEWUTS*/ | 0x08000000ULL /*NEWIPC*/ |
                                            0x10000000ULL /*NEWUSER*/ | 0x20000000ULL /*NEWPID*/ |
                                            0x40000000ULL /*NEWNET*/ | 0x00000080ULL /*NEWTIME*/;

}  // namespace openshell::runtime::seccomp_profile
