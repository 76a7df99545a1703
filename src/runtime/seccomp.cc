#include "runtime/seccomp.h"

#include <linux/audit.h>
#include <linux/seccomp.h>
#include <stddef.h>
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
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, program.flags, &prog) != 0)
    return child::fail(failure, errno, "install the seccomp filter");
  return true;
}

namespace {

constexpr uint32_t kArch = offsetof(seccomp_data, arch);
constexpr uint32_t kNr = offsetof(seccomp_data, nr);

// connect(2) by any way a process of this architecture can ask for it.
// Other system calls pass (the default profile judges them).
#if defined(__x86_64__)
// Natively, as x32 (the same number with bit 30), and as i386 through
// int 0x80: connect and socketcall (the owner answers the socketcalls that
// are not connects at once, and does not credit any of them: it looks only
// at native connects).
constexpr sock_filter kConnectFilter[] = {
    /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArch),
    /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, 3),
    /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kNr),
    /* 3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_connect, 6, 0),
    /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_connect | 0x40000000U, 5, 4),
    /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_I386, 0, 3),
    /* 6 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kNr),
    /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 362 /* i386 connect */, 2, 0),
    /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 102 /* i386 socketcall */, 1, 0),
    /* 9 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    /* 10 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
};
#elif defined(__aarch64__)
// Natively; every call of another architecture (AArch32) is sent, for its
// numbers differ (the default profile kills such processes anyway).
constexpr sock_filter kConnectFilter[] = {
    /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArch),
    /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_AARCH64, 0, 3),
    /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kNr),
    /* 3 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_connect, 1, 0),
    /* 4 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    /* 5 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
};
#else
#error "the connect filter knows no system call numbers for this architecture"
#endif

}  // namespace

int install_connect_listener() noexcept {
  // The owner takes the connecting socket with pidfd_getfd (Linux 5.6,
  // after the "continue" answer of 5.5): without it, no filter at all, for
  // a listener nobody can answer usefully would only slow every connect.
  if (::syscall(SYS_pidfd_getfd, -1, 0, 0) == 0 || errno == ENOSYS) return -ENOSYS;
  sock_fprog prog{static_cast<unsigned short>(sizeof kConnectFilter / sizeof kConnectFilter[0]),
                  const_cast<sock_filter*>(kConnectFilter)};
  long fd =
      ::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
  if (fd < 0) return -errno;
  return static_cast<int>(fd);
}

}  // namespace openshell::runtime::seccomp
