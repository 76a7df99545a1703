#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/kcmp.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>

#include <gtest/gtest.h>
#include <seccomp.h>

#include "base/error.h"
#include "oci/seccomp_json.h"
#include "test_util.h"

namespace openshell::oci {
namespace {

using nlohmann::json;
using openshell::testing::ChildReport;
using openshell::testing::ChildWriter;
using openshell::testing::run_in_child;

// In a child: no_new_privs, the compiled program, then the calls.
ChildReport run_filtered(const SeccompFilter& filter,
                         const std::function<void(ChildWriter&)>& calls) {
  return run_in_child([&](ChildWriter& out) {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      out.say("no_new_privs failed");
      ::_exit(3);
    }
    ChildFailure failure;
    if (!runtime::seccomp::install(filter.program(), &failure)) {
      out.say(std::string("install failed: ") + failure.message());
      ::_exit(4);
    }
    calls(out);
  });
}

ChildReport run_filtered(const char* profile, const std::function<void(ChildWriter&)>& calls) {
  return run_filtered(compile_seccomp(json::parse(profile)), calls);
}

void expect_refused(const ChildReport& report, const char* name, int err) {
  ASSERT_TRUE(report.has(name)) << name << " not reported: " << report.text;
  EXPECT_EQ(report.at(name).ret, -1) << name << " was not refused";
  EXPECT_EQ(report.at(name).err, err) << name << ": " << strerror(report.at(name).err);
}

void expect_allowed(const ChildReport& report, const char* name) {
  ASSERT_TRUE(report.has(name)) << name << " not reported: " << report.text;
  EXPECT_GE(report.at(name).ret, 0) << name << ": " << strerror(report.at(name).err);
}

// The message compile_seccomp throws, or "(accepted)".
std::string refusal(const std::string& profile) {
  try {
    compile_seccomp(json::parse(profile));
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

bool same_program(const SeccompFilter& a, const SeccompFilter& b) {
  return a.code.size() == b.code.size() &&
         std::memcmp(a.code.data(), b.code.data(), a.code.size() * sizeof(sock_filter)) == 0;
}

// Whether the program compares seccomp_data.arch with this AUDIT_ARCH_*.
bool checks_arch(const SeccompFilter& filter, uint32_t arch) {
  for (const sock_filter& insn : filter.code)
    if (insn.code == (BPF_JMP | BPF_JEQ | BPF_K) && insn.k == arch) return true;
  return false;
}

// mkdirat under a parent that does not exist: unfiltered ENOENT, and no
// directory is ever made.
long mkdir_nowhere() {
  return ::syscall(SYS_mkdirat, AT_FDCWD, "/nonexistent-openshell-unit-test/dir", 0700);
}

TEST(OciSeccompRules, AnErrnoRuleGivesItsErrnoAndLeavesTheRest) {
  const auto calls = [](ChildWriter& out) {
    RECORD(out, "mkdirat", mkdir_nowhere());
    RECORD(out, "getpid", ::syscall(SYS_getpid));
  };
  ChildReport control = run_in_child(calls);
  ChildReport report = run_filtered(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}]})",
                                    calls);
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  expect_refused(control, "mkdirat", ENOENT);
  expect_refused(report, "mkdirat", ENOSYS);
  expect_allowed(report, "getpid");
  EXPECT_NE(report.at("getpid").ret, ::getpid()) << "the child's own pid";
}

TEST(OciSeccompRules, AnAllowListRefusesWhatItDoesNotNameWithTheDefaultErrno) {
  // defaultErrnoRet 13 (EACCES), so that the refusal is visibly the profile's.
  ChildReport report =
      run_filtered(R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 13,
    "syscalls": [
      {"names": ["write", "exit", "exit_group", "getppid"], "action": "SCMP_ACT_ALLOW"},
      {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
       "args": [{"index": 0, "value": 4294967295, "op": "SCMP_CMP_EQ"}]}]})",
                   [](ChildWriter& out) {
                     RECORD(out, "getppid", ::syscall(SYS_getppid));
                     RECORD(out, "umask", ::syscall(SYS_umask, 022));
                     RECORD(out, "personality(query)", ::syscall(SYS_personality, 0xffffffffUL));
                     RECORD(out, "personality(READ_IMPLIES_EXEC)",
                            ::syscall(SYS_personality, READ_IMPLIES_EXEC));
                   });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  EXPECT_EQ(report.at("getppid").ret, ::getpid());
  // umask never fails unfiltered.
  expect_refused(report, "umask", EACCES);
  expect_allowed(report, "personality(query)");
  expect_refused(report, "personality(READ_IMPLIES_EXEC)", EACCES);
}

TEST(OciSeccompRules, ConditionsOnOneArgumentAreAlternatives) {
  // Were they AND'ed, no call could match both and nothing would be refused.
  ChildReport report =
      run_filtered(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["personality"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
      "args": [{"index": 0, "value": 8, "op": "SCMP_CMP_EQ"},
               {"index": 0, "value": 4194304, "op": "SCMP_CMP_EQ"}]}]})",
                   [](ChildWriter& out) {
                     RECORD(out, "personality(8)", ::syscall(SYS_personality, 8));
                     RECORD(out, "personality(READ_IMPLIES_EXEC)",
                            ::syscall(SYS_personality, READ_IMPLIES_EXEC));
                     RECORD(out, "personality(query)", ::syscall(SYS_personality, 0xffffffffUL));
                   });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  expect_refused(report, "personality(8)", EACCES);
  expect_refused(report, "personality(READ_IMPLIES_EXEC)", EACCES);
  expect_allowed(report, "personality(query)");
}

TEST(OciSeccompRules, ConditionsOnSeveralArgumentsMustAllHold) {
  // Were they OR'ed, every Unix socket and every datagram socket would go.
  ChildReport report = run_filtered(
      R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
      "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"},
               {"index": 1, "value": 2, "op": "SCMP_CMP_EQ"}]}]})",
      [](ChildWriter& out) {
        RECORD(out, "AF_UNIX SOCK_DGRAM", ::syscall(SYS_socket, AF_UNIX, SOCK_DGRAM, 0));
        RECORD(out, "AF_UNIX SOCK_STREAM", ::syscall(SYS_socket, AF_UNIX, SOCK_STREAM, 0));
        RECORD(out, "AF_INET SOCK_DGRAM", ::syscall(SYS_socket, AF_INET, SOCK_DGRAM, 0));
      });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  static_assert(AF_UNIX == 1 && SOCK_DGRAM == 2);
  expect_refused(report, "AF_UNIX SOCK_DGRAM", EACCES);
  expect_allowed(report, "AF_UNIX SOCK_STREAM");
  expect_allowed(report, "AF_INET SOCK_DGRAM");
}

// umask(15), umask(16) and umask(17) under a rule "arg0 OP 16" (for
// MASKED_EQ: arg0 & 16 == 16); umask itself never fails.
TEST(OciSeccompRules, EveryComparisonTestsTheArgument) {
  struct Case {
    const char* op;
    bool refused[3];  // umask(15), umask(16), umask(17)
  };
  const Case cases[] = {
      {"SCMP_CMP_NE", {true, false, true}},        {"SCMP_CMP_LT", {true, false, false}},
      {"SCMP_CMP_LE", {true, true, false}},        {"SCMP_CMP_EQ", {false, true, false}},
      {"SCMP_CMP_GE", {false, true, true}},        {"SCMP_CMP_GT", {false, false, true}},
      {"SCMP_CMP_MASKED_EQ", {false, true, true}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.op);
    json profile = json::parse(R"({"defaultAction": "SCMP_ACT_ALLOW",
      "syscalls": [{"names": ["umask"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
                    "args": [{"index": 0, "value": 16, "valueTwo": 16}]}]})");
    profile["syscalls"][0]["args"][0]["op"] = c.op;
    ChildReport report = run_filtered(compile_seccomp(profile), [](ChildWriter& out) {
      RECORD(out, "15", ::syscall(SYS_umask, 15));
      RECORD(out, "16", ::syscall(SYS_umask, 16));
      RECORD(out, "17", ::syscall(SYS_umask, 17));
    });
    ASSERT_TRUE(report.exited_cleanly()) << report.text;
    const char* names[] = {"15", "16", "17"};
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(std::string("umask(") + names[i] + ")");
      if (c.refused[i])
        expect_refused(report, names[i], EACCES);
      else
        expect_allowed(report, names[i]);
    }
  }
}

// MASKED_EQ with a valueTwo: only the masked bits count.
TEST(OciSeccompRules, MaskedEqualComparesTheMaskedBitsWithValueTwo) {
  ChildReport report = run_filtered(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["umask"], "action": "SCMP_ACT_ERRNO", "errnoRet": 13,
      "args": [{"index": 0, "value": 63, "valueTwo": 18, "op": "SCMP_CMP_MASKED_EQ"}]}]})",
                                    [](ChildWriter& out) {
                                      RECORD(out, "022", ::syscall(SYS_umask, 022));
                                      RECORD(out, "0722", ::syscall(SYS_umask, 0722));
                                      RECORD(out, "027", ::syscall(SYS_umask, 027));
                                    });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  expect_refused(report, "022", EACCES);
  expect_refused(report, "0722", EACCES);
  expect_allowed(report, "027");
}

TEST(OciSeccompRules, ActionsReachTheKernel) {
  struct Case {
    const char* action;
    int signal;  // the child dies of it; 0: it lives
    long ret;    // then umask's result ...
    int err;     // ... and errno
  };
  const Case cases[] = {
      {"SCMP_ACT_KILL", SIGSYS, 0, 0},
      {"SCMP_ACT_KILL_THREAD", SIGSYS, 0, 0},
      {"SCMP_ACT_KILL_PROCESS", SIGSYS, 0, 0},
      {"SCMP_ACT_TRAP", SIGSYS, 0, 0},
      {"SCMP_ACT_ERRNO", 0, -1, EPERM},   // no errnoRet: EPERM
      {"SCMP_ACT_TRACE", 0, -1, ENOSYS},  // no tracer: the kernel says ENOSYS
      {"SCMP_ACT_LOG", 0, 022, 0},        // logged and let through
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.action);
    json profile = json::parse(R"({"defaultAction": "SCMP_ACT_ALLOW",
      "syscalls": [{"names": ["umask"]}]})");
    profile["syscalls"][0]["action"] = c.action;
    ChildReport report = run_filtered(compile_seccomp(profile), [](ChildWriter& out) {
      // SIGSYS dumps core: not for a test (a core_pattern pipe ignores
      // RLIMIT_CORE; an undumpable process dumps nothing).
      ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
      ::syscall(SYS_umask, 022);
      RECORD(out, "umask", ::syscall(SYS_umask, 022));
    });
    if (c.signal) {
      ASSERT_TRUE(WIFSIGNALED(report.wait_status)) << report.text;
      EXPECT_EQ(WTERMSIG(report.wait_status), c.signal);
      EXPECT_FALSE(report.has("umask"));
    } else {
      ASSERT_TRUE(report.exited_cleanly()) << report.text;
      ASSERT_TRUE(report.has("umask"));
      EXPECT_EQ(report.at("umask").ret, c.ret);
      EXPECT_EQ(report.at("umask").err, c.err);
    }
  }
}

TEST(OciSeccompRules, UnknownSystemCallNamesAreSkipped) {
  SeccompFilter with_unknown = compile_seccomp(json::parse(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["openshell_no_such_call", "mkdirat", "neither_this"],
                  "action": "SCMP_ACT_ERRNO"},
                 {"names": ["openshell_no_such_call"], "action": "SCMP_ACT_KILL"}]})"));
  SeccompFilter without = compile_seccomp(json::parse(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["mkdirat"], "action": "SCMP_ACT_ERRNO"}]})"));
  EXPECT_TRUE(same_program(with_unknown, without));
  ChildReport report =
      run_filtered(with_unknown, [](ChildWriter& out) { RECORD(out, "mkdirat", mkdir_nowhere()); });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  expect_refused(report, "mkdirat", EPERM);
}

TEST(OciSeccompRules, ARuleThatRepeatsTheDefaultIsDropped) {
  // libseccomp itself refuses such a rule (EACCES).
  SeccompFilter with_repeats = compile_seccomp(json::parse(R"({"defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 1,
    "syscalls": [{"names": ["getpid", "write"], "action": "SCMP_ACT_ALLOW"},
                 {"names": ["mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1},
                 {"names": ["umask"], "action": "SCMP_ACT_ERRNO",
                  "args": [{"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}]}]})"));
  SeccompFilter plain = compile_seccomp(json::parse(R"({"defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 1,
    "syscalls": [{"names": ["getpid", "write"], "action": "SCMP_ACT_ALLOW"}]})"));
  EXPECT_TRUE(same_program(with_repeats, plain));
  // Another errno is another action.
  SeccompFilter other_errno = compile_seccomp(json::parse(R"({"defaultAction": "SCMP_ACT_ERRNO",
    "defaultErrnoRet": 1,
    "syscalls": [{"names": ["getpid", "write"], "action": "SCMP_ACT_ALLOW"},
                 {"names": ["mkdirat"], "action": "SCMP_ACT_ERRNO", "errnoRet": 2}]})"));
  EXPECT_FALSE(same_program(other_errno, plain));
}

TEST(OciSeccompProfile, ArchitecturesJoinTheFilter) {
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
  GTEST_SKIP() << "the architectures below are little-endian";
#endif
  SeccompFilter native = compile_seccomp(json::parse(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "syscalls": [{"names": ["mkdirat"], "action": "SCMP_ACT_ERRNO"}]})"));
  SeccompFilter all = compile_seccomp(json::parse(R"({"defaultAction": "SCMP_ACT_ALLOW",
    "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64",
                      "SCMP_ARCH_ARM"],
    "syscalls": [{"names": ["mkdirat"], "action": "SCMP_ACT_ERRNO"}]})"));
  for (uint32_t arch : std::initializer_list<uint32_t>{AUDIT_ARCH_X86_64, AUDIT_ARCH_I386,
                                                       AUDIT_ARCH_AARCH64, AUDIT_ARCH_ARM})
    EXPECT_TRUE(checks_arch(all, arch)) << std::hex << arch;
  EXPECT_TRUE(checks_arch(native, seccomp_arch_native()));
  EXPECT_FALSE(checks_arch(native, AUDIT_ARCH_ARM));
  EXPECT_FALSE(checks_arch(native, AUDIT_ARCH_I386));
  // libseccomp's other little-endian architectures are taken too.
  EXPECT_EQ(refusal(R"({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_RISCV64",
    "SCMP_ARCH_PPC64LE", "SCMP_ARCH_MIPSEL", "SCMP_ARCH_MIPSEL64", "SCMP_ARCH_MIPSEL64N32"]})"),
            "(accepted)");
}

TEST(OciSeccompProfile, FlagsComeBackForTheInstall) {
  auto flags_of = [](const char* flags) {
    return compile_seccomp(json::parse(std::string(R"({"defaultAction": "SCMP_ACT_ALLOW",
      "flags": )") + flags + "}"))
        .flags;
  };
  EXPECT_EQ(flags_of("[]"), 0u);
  EXPECT_EQ(flags_of(R"(["SECCOMP_FILTER_FLAG_TSYNC"])"), 0u);
  EXPECT_EQ(flags_of(R"(["SECCOMP_FILTER_FLAG_LOG"])"), SECCOMP_FILTER_FLAG_LOG);
  EXPECT_EQ(flags_of(R"(["SECCOMP_FILTER_FLAG_SPEC_ALLOW"])"), SECCOMP_FILTER_FLAG_SPEC_ALLOW);
  EXPECT_EQ(flags_of(R"(["SECCOMP_FILTER_FLAG_TSYNC", "SECCOMP_FILTER_FLAG_LOG",
                         "SECCOMP_FILTER_FLAG_SPEC_ALLOW"])"),
            SECCOMP_FILTER_FLAG_LOG | SECCOMP_FILTER_FLAG_SPEC_ALLOW);
}

// An empty listener path asks for no agent: Go writes "" for an unset one.
TEST(OciSeccompProfile, AnEmptyListenerIsNoListener) {
  EXPECT_EQ(refusal(R"({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "",
                        "listenerMetadata": ""})"),
            "(accepted)");
}

// The shape of Docker's default profile (moby's profiles/seccomp/default.json)
// as the engines write it into config.json for an unprivileged container on
// amd64: errno 1 by default, a long allow list (with calls of kernels newer
// than this libseccomp, and 32-bit ones), personality allowed for a few
// values, clone without namespace flags, clone3 refused with ENOSYS so that
// glibc falls back to clone.
constexpr const char* kDockerDefault = R"({
  "defaultAction": "SCMP_ACT_ERRNO",
  "defaultErrnoRet": 1,
  "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
  "syscalls": [
    {"names": ["accept", "accept4", "access", "adjtimex", "alarm", "bind", "brk", "cachestat",
       "capget", "capset", "chdir", "chmod", "chown", "chown32", "clock_adjtime",
       "clock_adjtime64", "clock_getres", "clock_getres_time64", "clock_gettime",
       "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "close", "close_range",
       "connect", "copy_file_range", "creat", "dup", "dup2", "dup3", "epoll_create",
       "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
       "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "execve", "execveat", "exit",
       "exit_group", "faccessat", "faccessat2", "fadvise64", "fadvise64_64", "fallocate",
       "fanotify_mark", "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32",
       "fchownat", "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr", "flock", "fork",
       "fremovexattr", "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64",
       "fsync", "ftruncate", "ftruncate64", "futex", "futex_requeue", "futex_time64",
       "futex_wait", "futex_waitv", "futex_wake", "futimesat", "getcpu", "getcwd", "getdents",
       "getdents64", "getegid", "getegid32", "geteuid", "geteuid32", "getgid", "getgid32",
       "getgroups", "getgroups32", "getitimer", "getpeername", "getpgid", "getpgrp", "getpid",
       "getppid", "getpriority", "getrandom", "getresgid", "getresgid32", "getresuid",
       "getresuid32", "getrlimit", "get_robust_list", "getrusage", "getsid", "getsockname",
       "getsockopt", "get_thread_area", "gettid", "gettimeofday", "getuid", "getuid32",
       "getxattr", "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch",
       "io_cancel", "ioctl", "io_destroy", "io_getevents", "io_pgetevents",
       "io_pgetevents_time64", "ioprio_get", "ioprio_set", "io_setup", "io_submit", "ipc", "kill",
       "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "lchown",
       "lchown32", "lgetxattr", "link", "linkat", "listen", "listmount", "listxattr",
       "llistxattr", "_llseek", "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64",
       "madvise", "map_shadow_stack", "membarrier", "memfd_create", "memfd_secret", "mincore",
       "mkdir", "mkdirat", "mknod", "mknodat", "mlock", "mlock2", "mlockall", "mmap", "mmap2",
       "mprotect", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive",
       "mq_timedreceive_time64", "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "mremap",
       "mseal", "msgctl", "msgget", "msgrcv", "msgsnd", "msync", "munlock", "munlockall",
       "munmap", "name_to_handle_at", "nanosleep", "newfstatat", "_newselect", "open", "openat",
       "openat2", "pause", "pidfd_open", "pidfd_send_signal", "pipe", "pipe2", "pkey_alloc",
       "pkey_free", "pkey_mprotect", "poll", "ppoll", "ppoll_time64", "prctl", "pread64",
       "preadv", "preadv2", "prlimit64", "process_mrelease", "pselect6", "pselect6_time64",
       "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv",
       "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "remap_file_pages",
       "removexattr", "rename", "renameat", "renameat2", "restart_syscall", "rmdir", "rseq",
       "rt_sigaction", "rt_sigpending", "rt_sigprocmask", "rt_sigqueueinfo", "rt_sigreturn",
       "rt_sigsuspend", "rt_sigtimedwait", "rt_sigtimedwait_time64", "rt_tgsigqueueinfo",
       "sched_getaffinity", "sched_getattr", "sched_getparam", "sched_get_priority_max",
       "sched_get_priority_min", "sched_getscheduler", "sched_rr_get_interval",
       "sched_rr_get_interval_time64", "sched_setaffinity", "sched_setattr", "sched_setparam",
       "sched_setscheduler", "sched_yield", "seccomp", "select", "semctl", "semget", "semop",
       "semtimedop", "semtimedop_time64", "send", "sendfile", "sendfile64", "sendmmsg",
       "sendmsg", "sendto", "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid",
       "setgid32", "setgroups", "setgroups32", "setitimer", "setpgid", "setpriority", "setregid",
       "setregid32", "setresgid", "setresgid32", "setresuid", "setresuid32", "setreuid",
       "setreuid32", "setrlimit", "set_robust_list", "setsid", "setsockopt", "set_thread_area",
       "set_tid_address", "setuid", "setuid32", "setxattr", "shmat", "shmctl", "shmdt", "shmget",
       "shutdown", "sigaltstack", "signalfd", "signalfd4", "sigprocmask", "sigreturn",
       "socket", "socketcall", "socketpair", "splice", "stat", "stat64", "statfs", "statfs64",
       "statmount", "statx", "symlink", "symlinkat", "sync", "sync_file_range", "syncfs",
       "sysinfo", "tee", "tgkill", "time", "timer_create", "timer_delete", "timer_getoverrun",
       "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "timerfd_create",
       "timerfd_gettime", "timerfd_gettime64", "timerfd_settime", "timerfd_settime64", "times",
       "tkill", "truncate", "truncate64", "ugetrlimit", "umask", "uname", "unlink", "unlinkat",
       "utime", "utimensat", "utimensat_time64", "utimes", "vfork", "vmsplice", "wait4",
       "waitid", "waitpid", "write", "writev"],
     "action": "SCMP_ACT_ALLOW"},
    {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
     "args": [{"index": 0, "value": 0, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
    {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
     "args": [{"index": 0, "value": 8, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
    {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
     "args": [{"index": 0, "value": 131072, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
    {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
     "args": [{"index": 0, "value": 131080, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
    {"names": ["personality"], "action": "SCMP_ACT_ALLOW",
     "args": [{"index": 0, "value": 4294967295, "valueTwo": 0, "op": "SCMP_CMP_EQ"}]},
    {"names": ["arch_prctl"], "action": "SCMP_ACT_ALLOW"},
    {"names": ["modify_ldt"], "action": "SCMP_ACT_ALLOW"},
    {"names": ["clone"], "action": "SCMP_ACT_ALLOW",
     "args": [{"index": 0, "value": 2114060288, "valueTwo": 0, "op": "SCMP_CMP_MASKED_EQ"}]},
    {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": 38}
  ]
})";

TEST(OciSeccompProfile, DockerDefaultProfileCompilesAndConfines) {
  SeccompFilter filter = compile_seccomp(json::parse(kDockerDefault));
  EXPECT_LE(filter.code.size(), static_cast<size_t>(BPF_MAXINSNS));
  EXPECT_EQ(filter.flags, 0u);
  const auto calls = [](ChildWriter& out) {
    RECORD(out, "getppid", ::syscall(SYS_getppid));
    RECORD(out, "personality(query)", ::syscall(SYS_personality, 0xffffffffUL));
    RECORD(out, "personality(READ_IMPLIES_EXEC)", ::syscall(SYS_personality, READ_IMPLIES_EXEC));
    // glibc's fork is clone(SIGCHLD | CLONE_CHILD_*): no namespace flags.
    pid_t child = ::fork();
    if (child == 0) ::_exit(7);
    int status = 0;
    if (child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status))
      out.result("fork", WEXITSTATUS(status), 0);
    else
      RECORD(out, "fork", -1);
    long rc = ::syscall(SYS_clone, CLONE_NEWUTS | SIGCHLD, nullptr, nullptr, nullptr, 0);
    if (rc == 0) ::_exit(0);
    if (rc > 0) ::waitpid(static_cast<pid_t>(rc), nullptr, 0);
    RECORD(out, "clone(CLONE_NEWUTS)", rc);
    RECORD(out, "clone3", ::syscall(SYS_clone3, nullptr, 0));
    RECORD(out, "unshare(CLONE_NEWUTS)", ::syscall(SYS_unshare, CLONE_NEWUTS));
    RECORD(out, "kcmp", ::syscall(SYS_kcmp, ::getpid(), ::getpid(), KCMP_VM, 0, 0));
  };
  ChildReport control = run_in_child(calls);
  ChildReport report = run_filtered(filter, [&](ChildWriter& out) {
    calls(out);
    // Not run unfiltered: it would switch off the host's process accounting.
    RECORD(out, "acct", ::syscall(SYS_acct, nullptr));
  });
  ASSERT_TRUE(control.exited_cleanly()) << control.text;
  ASSERT_TRUE(report.exited_cleanly()) << report.text;

  EXPECT_EQ(report.at("getppid").ret, ::getpid());
  expect_allowed(report, "personality(query)");
  EXPECT_EQ(report.at("fork").ret, 7) << strerror(report.at("fork").err);
  expect_refused(report, "personality(READ_IMPLIES_EXEC)", EPERM);
  expect_refused(report, "clone(CLONE_NEWUTS)", EPERM);
  expect_refused(report, "unshare(CLONE_NEWUTS)", EPERM);
  expect_refused(report, "acct", EPERM);
  expect_refused(report, "kcmp", EPERM);
  // Unfiltered, clone3 with size 0 is EINVAL: the ENOSYS is the profile's.
  expect_refused(control, "clone3", EINVAL);
  expect_refused(report, "clone3", ENOSYS);
  // kcmp of one's own memory needs no privilege: unfiltered it is 0 (or
  // ENOSYS without CONFIG_KCMP), never EPERM.
  EXPECT_FALSE(control.at("kcmp").ret == -1 && control.at("kcmp").err == EPERM);
  // As root the namespace calls work unfiltered: their EPERM above is the
  // profile's.
  if (::geteuid() == 0) {
    expect_allowed(control, "clone(CLONE_NEWUTS)");
    expect_allowed(control, "unshare(CLONE_NEWUTS)");
  }
}

TEST(OciSeccompRefusals, TheExampleMessage) {
  EXPECT_EQ(refusal(R"({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
      {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
      {"names": ["write"], "action": "SCMP_ACT_ALLOW"},
      {"names": ["close"], "action": "SCMP_ACT_ALLOW"},
      {"names": ["open"], "action": "SCMP_ACT_FOO"}]})"),
            "config.json: linux.seccomp.syscalls[3].action: \"SCMP_ACT_FOO\" is not a seccomp "
            "action");
}

TEST(OciSeccompRefusals, EveryBadFieldIsNamedInOneLine) {
  struct Case {
    std::string profile;
    const char* message;  // a part of the message, from the field on
  };
  // A profile around one rule.
  auto rule = [](const std::string& text) {
    return R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [)" + text + "]}";
  };
  auto arg = [&](const std::string& text) {
    return rule(R"({"names": ["read"], "action": "SCMP_ACT_ERRNO", "args": [)" + text + "]}");
  };
  const Case cases[] = {
    {"[]", "linux.seccomp: must be an object, not []"},
    {"{}", "linux.seccomp.defaultAction: is required"},
    {R"({"defaultAction": 3})", "linux.seccomp.defaultAction: must be a string, not 3"},
    {R"({"defaultAction": "SCMP_ACT_FOO"})",
     "linux.seccomp.defaultAction: \"SCMP_ACT_FOO\" is not a seccomp action"},
    {R"({"defaultAction": "SCMP_ACT_NOTIFY"})",
     "linux.seccomp.defaultAction: \"SCMP_ACT_NOTIFY\" is not supported"},
    {R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": "x"})",
     "linux.seccomp.defaultErrnoRet: must be a non-negative integer, not \"x\""},
    {R"({"defaultAction": "SCMP_ACT_ERRNO", "defaultErrnoRet": 4095})",
     "linux.seccomp.defaultErrnoRet: 4095 is not an errno"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": "/run/agent.sock"})",
     "linux.seccomp.listenerPath: is not supported"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "listenerMetadata": "x"})",
     "linux.seccomp.listenerMetadata: is not supported"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "architectures": "SCMP_ARCH_X86_64"})",
     "linux.seccomp.architectures: must be an array"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "architectures": [62]})",
     "linux.seccomp.architectures[0]: must be a string, not 62"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_Z80"]})",
     "linux.seccomp.architectures[0]: \"SCMP_ARCH_Z80\" is not an architecture libseccomp "
     "knows"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "architectures": ["SCMP_ARCH_x86_64"]})",
     "linux.seccomp.architectures[0]: \"SCMP_ARCH_x86_64\" is not an architecture"},
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    {R"({"defaultAction": "SCMP_ACT_ALLOW",
           "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_S390X"]})",
     "linux.seccomp.architectures[1]: \"SCMP_ARCH_S390X\" has the other byte order"},
#endif
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "flags": "SECCOMP_FILTER_FLAG_LOG"})",
     "linux.seccomp.flags: must be an array"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "flags": [2]})",
     "linux.seccomp.flags[0]: must be a string, not 2"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW",
           "flags": ["SECCOMP_FILTER_FLAG_LOG", "SECCOMP_FILTER_FLAG_NEW_LISTENER"]})",
     "linux.seccomp.flags[1]: \"SECCOMP_FILTER_FLAG_NEW_LISTENER\" is not a seccomp flag"},
    {R"({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": {}})",
     "linux.seccomp.syscalls: must be an array"},
    {rule(R"("read")"), "linux.seccomp.syscalls[0]: must be an object, not \"read\""},
    {rule(R"({"action": "SCMP_ACT_ERRNO"})"), "linux.seccomp.syscalls[0].names: is required"},
    {rule(R"({"names": "read", "action": "SCMP_ACT_ERRNO"})"),
     "linux.seccomp.syscalls[0].names: must be an array, not \"read\""},
    {rule(R"({"names": ["read", 0], "action": "SCMP_ACT_ERRNO"})"),
     "linux.seccomp.syscalls[0].names[1]: must be a string, not 0"},
    {rule(R"({"names": [""], "action": "SCMP_ACT_ERRNO"})"),
     "linux.seccomp.syscalls[0].names[0]: \"\" is not a system call name"},
    {rule(R"({"names": ["read"]})"), "linux.seccomp.syscalls[0].action: is required"},
    {rule(R"({"names": ["read"], "action": ["SCMP_ACT_ERRNO"]})"),
     "linux.seccomp.syscalls[0].action: must be a string"},
    {rule(R"({"names": ["read"], "action": "SCMP_ACT_ALLOW"},
               {"names": ["write"], "action": "SCMP_ACT_NOTIFY"})"),
     "linux.seccomp.syscalls[1].action: \"SCMP_ACT_NOTIFY\" is not supported"},
    {rule(R"({"names": ["read"], "action": "SCMP_ACT_ERRNO", "errnoRet": "38"})"),
     "linux.seccomp.syscalls[0].errnoRet: must be a non-negative integer, not \"38\""},
    {rule(R"({"names": ["read"], "action": "SCMP_ACT_ERRNO", "errnoRet": -1})"),
     "linux.seccomp.syscalls[0].errnoRet: must be a non-negative integer, not -1"},
    {rule(R"({"names": ["read"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1.5})"),
     "linux.seccomp.syscalls[0].errnoRet: must be a non-negative integer, not 1.5"},
    {rule(R"({"names": ["read"], "action": "SCMP_ACT_TRACE", "errnoRet": 70000})"),
     "linux.seccomp.syscalls[0].errnoRet: 70000 does not fit a trace value"},
    {rule(R"({"names": ["read"], "action": "SCMP_ACT_ERRNO", "args": {}})"),
     "linux.seccomp.syscalls[0].args: must be an array"},
    {arg("1"), "linux.seccomp.syscalls[0].args[0]: must be an object, not 1"},
    {arg(R"({"index": 0, "value": 1, "op": "SCMP_CMP_EQ"},
              {"index": 0, "value": 2, "op": "SCMP_CMP_XX"})"),
     "linux.seccomp.syscalls[0].args[1].op: \"SCMP_CMP_XX\" is not a seccomp comparison"},
    {arg(R"({"index": 0, "value": 1, "op": 4})"),
     "linux.seccomp.syscalls[0].args[0].op: must be a string, not 4"},
    {arg(R"({"index": 0, "value": 1})"), "linux.seccomp.syscalls[0].args[0].op: is required"},
    {arg(R"({"value": 1, "op": "SCMP_CMP_EQ"})"),
     "linux.seccomp.syscalls[0].args[0].index: is required"},
    {arg(R"({"index": "0", "value": 1, "op": "SCMP_CMP_EQ"})"),
     "linux.seccomp.syscalls[0].args[0].index: must be a non-negative integer, not \"0\""},
    {arg(R"({"index": 6, "value": 1, "op": "SCMP_CMP_EQ"})"),
     "linux.seccomp.syscalls[0].args[0].index: 6 is not an argument"},
    {arg(R"({"index": 0, "op": "SCMP_CMP_EQ"})"),
     "linux.seccomp.syscalls[0].args[0].value: is required"},
    {arg(R"({"index": 0, "value": "1", "op": "SCMP_CMP_EQ"})"),
     "linux.seccomp.syscalls[0].args[0].value: must be a non-negative integer, not \"1\""},
    {arg(R"({"index": 0, "value": -1, "op": "SCMP_CMP_EQ"})"),
     "linux.seccomp.syscalls[0].args[0].value: must be a non-negative integer, not -1"},
    {arg(R"({"index": 0, "value": 1, "valueTwo": true, "op": "SCMP_CMP_MASKED_EQ"})"),
     "linux.seccomp.syscalls[0].args[0].valueTwo: must be a non-negative integer, not true"},
    {arg(R"({"index": 0, "value": 1, "op": "SCMP_CMP_EQ"},
              {"index": 1, "value": 1, "op": "SCMP_CMP_EQ"},
              {"index": 0, "value": 2, "op": "SCMP_CMP_EQ"})"),
     "linux.seccomp.syscalls[0].args[2].index: argument 0 is tested by args[0] too"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.profile);
    const std::string message = refusal(c.profile);
    EXPECT_NE(message.find(c.message), std::string::npos) << message;
    EXPECT_EQ(message.rfind("config.json: linux.seccomp", 0), 0u) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace openshell::oci
