#include "runtime/seccomp.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/io_uring.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#include <net/ethernet.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "test_util.h"

namespace openshell::runtime::seccomp {
namespace {

using openshell::testing::ChildReport;
using openshell::testing::ChildWriter;
using openshell::testing::run_in_child;

// In a child: no_new_privs, the default filter, then the checks.
ChildReport run_confined(const std::function<void(ChildWriter&)>& checks) {
  return run_in_child([&](ChildWriter& out) {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
      out.say("no_new_privs failed");
      ::_exit(3);
    }
    ChildFailure failure;
    if (!install(default_program(), &failure)) {
      out.say(std::string("install failed: ") + failure.message());
      ::_exit(4);
    }
    checks(out);
  });
}

// The call failed with exactly this errno.
void expect_refused(const ChildReport& report, const char* name, int err) {
  ASSERT_TRUE(report.has(name)) << name << " not reported";
  EXPECT_EQ(report.at(name).ret, -1) << name << " was not refused";
  EXPECT_EQ(report.at(name).err, err) << name << ": " << strerror(report.at(name).err);
}

// The negative control: without the filter the same call was not refused
// with err, so that the confined refusal is the filter's.
bool control_passed(const ChildReport& control, const char* name, int err) {
  return control.has(name) && !(control.at(name).ret == -1 && control.at(name).err == err);
}

// Unprivileged, the kernel itself refuses most of what the filter refuses
// (mount, chroot, raw sockets...) with EPERM: those checks mean something
// only as root, where the control shows the call would have worked.
#define SKIP_UNLESS_ROOT()                                                                   \
  do {                                                                                       \
    if (::geteuid() != 0)                                                                    \
      GTEST_SKIP() << "needs root: unprivileged, the kernel refuses these calls with EPERM " \
                      "itself, so the filter's EPERM would prove nothing";                   \
  } while (0)

void expect_allowed(const ChildReport& report, const char* name) {
  ASSERT_TRUE(report.has(name)) << name << " not reported";
  EXPECT_GE(report.at(name).ret, 0) << name << ": " << strerror(report.at(name).err);
}

TEST(SeccompProgram, StartsWithTheArchitectureGuard) {
  Program program = default_program();
  ASSERT_NE(program.filter, nullptr);
  ASSERT_GT(program.length, 6);
  EXPECT_LE(program.length, BPF_MAXINSNS);
  // 0: A = seccomp_data.arch
  EXPECT_EQ(program.filter[0].code, BPF_LD | BPF_W | BPF_ABS);
  EXPECT_EQ(program.filter[0].k, offsetof(seccomp_data, arch));
  // 1: compared with the native architecture
  EXPECT_EQ(program.filter[1].code, BPF_JMP | BPF_JEQ | BPF_K);
#if defined(__x86_64__)
  EXPECT_EQ(program.filter[1].k, AUDIT_ARCH_X86_64);
#elif defined(__aarch64__)
  EXPECT_EQ(program.filter[1].k, AUDIT_ARCH_AARCH64);
#endif
  // 2: A = seccomp_data.nr; then, in the guard, a return of ENOSYS for
  // numbers above the profile's.
  EXPECT_EQ(program.filter[2].code, BPF_LD | BPF_W | BPF_ABS);
  EXPECT_EQ(program.filter[2].k, offsetof(seccomp_data, nr));
  bool enosys = false;
  for (int i = 3; i < 12 && i < program.length; ++i)
    enosys = enosys || (program.filter[i].code == (BPF_RET | BPF_K) &&
                        program.filter[i].k == static_cast<uint32_t>(SECCOMP_RET_ERRNO | ENOSYS));
  EXPECT_TRUE(enosys) << "no ENOSYS return in the guard";
  // The program ends in a return.
  EXPECT_EQ(BPF_CLASS(program.filter[program.length - 1].code), BPF_RET);
}

TEST(SeccompInstall, ReportsAFilterTheKernelRefuses) {
  auto report = run_in_child([](ChildWriter& out) {
    ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    ChildFailure failure;
    bool ok = install(Program{default_program().filter, 0}, &failure);
    out.result("install", ok ? 0 : -1, failure.err);
    out.say(failure.what);
  });
  ASSERT_TRUE(report.exited_cleanly());
  expect_refused(report, "install", EINVAL);
  EXPECT_EQ(report.text, "install the seccomp filter\n");
}

TEST(SeccompDefault, RefusesDangerousCallsWithEperm) {
  SKIP_UNLESS_ROOT();
  const auto checks = [](ChildWriter& out) {
    // A target that does not exist: unfiltered, this is ENOENT, not a mount.
    long rc = ::mount("none", "/nonexistent-openshell-unit-test", "tmpfs", 0, nullptr);
    RECORD(out, "mount", rc);
    rc = ::unshare(CLONE_NEWUSER);
    RECORD(out, "unshare(CLONE_NEWUSER)", rc);
    rc = ::unshare(CLONE_NEWNET);
    RECORD(out, "unshare(CLONE_NEWNET)", rc);
    rc = ::syscall(SYS_clone, CLONE_NEWNS | SIGCHLD, nullptr, nullptr, nullptr, 0);
    if (rc == 0) ::_exit(0);
    RECORD(out, "clone(CLONE_NEWNS)", rc);
    // Reaped before PTRACE_TRACEME below: its SIGCHLD arriving once this
    // process is traced would stop it for a tracer (the test) that never
    // waits for it.
    if (rc > 0) ::waitpid(static_cast<pid_t>(rc), nullptr, 0);
    rc = ::syscall(SYS_setns, -1, 0);
    RECORD(out, "setns", rc);
    rc = ::syscall(SYS_keyctl, 0 /* KEYCTL_GET_KEYRING_ID */, -3 /* session */, 0);
    RECORD(out, "keyctl", rc);
    rc = ::syscall(SYS_bpf, 0, nullptr, 0);
    RECORD(out, "bpf", rc);
    rc = ::ptrace(PTRACE_TRACEME, 0, nullptr, nullptr);
    RECORD(out, "ptrace", rc);
    io_uring_params params{};
    rc = ::syscall(SYS_io_uring_setup, 1, &params);
    RECORD(out, "io_uring_setup", rc);
    rc = ::chroot("/");
    RECORD(out, "chroot", rc);
    rc = ::socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
    RECORD(out, "socket(AF_INET, SOCK_RAW)", rc);
    rc = ::socket(AF_INET6, SOCK_RAW, IPPROTO_ICMPV6);
    RECORD(out, "socket(AF_INET6, SOCK_RAW)", rc);
    rc = ::socket(AF_PACKET, SOCK_RAW, htons(ETH_P_ALL));
    RECORD(out, "socket(AF_PACKET, SOCK_RAW)", rc);
    rc = ::socket(AF_PACKET, SOCK_DGRAM, htons(ETH_P_ALL));
    RECORD(out, "socket(AF_PACKET, SOCK_DGRAM)", rc);
    rc = ::personality(READ_IMPLIES_EXEC);
    RECORD(out, "personality(READ_IMPLIES_EXEC)", rc);
  };
  auto control = run_in_child(checks);
  auto report = run_confined(checks);
  ASSERT_TRUE(control.exited_cleanly()) << control.text;
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  std::string kernel_refused;
  for (const char* name :
       {"mount", "unshare(CLONE_NEWUSER)", "unshare(CLONE_NEWNET)", "clone(CLONE_NEWNS)", "setns",
        "keyctl", "bpf", "ptrace", "io_uring_setup", "chroot", "socket(AF_INET, SOCK_RAW)",
        "socket(AF_INET6, SOCK_RAW)", "socket(AF_PACKET, SOCK_RAW)",
        "socket(AF_PACKET, SOCK_DGRAM)", "personality(READ_IMPLIES_EXEC)"}) {
    expect_refused(report, name, EPERM);
    if (!control_passed(control, name, EPERM)) kernel_refused += std::string(" ") + name;
  }
  if (!kernel_refused.empty())
    GTEST_SKIP() << "without the filter the kernel refuses these with EPERM too, so their "
                    "refusal above may not be the filter's:"
                 << kernel_refused;
}

// clone3 is newer than the profile's argument checks can judge (its flags
// lie behind a pointer): ENOSYS, on which glibc falls back to clone.
TEST(SeccompDefault, NewerCallsGetEnosys) {
  const auto checks = [](ChildWriter& out) {
    // Unfiltered, clone3 with size 0 is EINVAL.
    long rc = ::syscall(SYS_clone3, nullptr, 0);
    RECORD(out, "clone3", rc);
  };
  auto control = run_in_child(checks);
  auto report = run_confined(checks);
  ASSERT_TRUE(control.exited_cleanly()) << control.text;
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  expect_refused(control, "clone3", EINVAL);
  expect_refused(report, "clone3", ENOSYS);
}

// A system call the kernel has and the profile does not allow gets the
// profile's default, EPERM. name_to_handle_at needs no privilege, so its
// control works as any user.
TEST(SeccompDefault, CallsOutsideTheProfileGetEperm) {
  const auto checks = [](ChildWriter& out) {
    char buf[sizeof(file_handle) + MAX_HANDLE_SZ] = {};
    auto* handle = reinterpret_cast<file_handle*>(buf);
    handle->handle_bytes = MAX_HANDLE_SZ;
    int mount_id = 0;
    long rc = ::syscall(SYS_name_to_handle_at, AT_FDCWD, "/proc/self/exe", handle, &mount_id, 0);
    RECORD(out, "name_to_handle_at", rc);
  };
  auto control = run_in_child(checks);
  auto report = run_confined(checks);
  ASSERT_TRUE(control.exited_cleanly()) << control.text;
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  ASSERT_TRUE(control.has("name_to_handle_at"));
  // Unfiltered: a handle, or a file system that makes none; never ENOSYS
  // or EPERM.
  const auto unfiltered = control.at("name_to_handle_at");
  EXPECT_TRUE(unfiltered.ret == 0 || (unfiltered.ret == -1 && unfiltered.err == EOPNOTSUPP))
      << unfiltered.ret << " " << strerror(unfiltered.err);
  expect_refused(report, "name_to_handle_at", EPERM);
}

TEST(SeccompDefault, SocketpairOnlyForUnixSockets) {
  const auto checks = [](ChildWriter& out) {
    int sv[2];
    RECORD(out, "socketpair(AF_UNIX)", ::socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    RECORD(out, "socketpair(AF_VSOCK)", ::socketpair(40 /* AF_VSOCK */, SOCK_STREAM, 0, sv));
    RECORD(out, "socketpair(AF_TIPC)", ::socketpair(30 /* AF_TIPC */, SOCK_STREAM, 0, sv));
  };
  auto control = run_in_child(checks);
  auto report = run_confined(checks);
  ASSERT_TRUE(control.exited_cleanly()) << control.text;
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  // Unfiltered, the kernel answers these itself (no socket pairs of those
  // families), not with EPERM.
  EXPECT_TRUE(control_passed(control, "socketpair(AF_VSOCK)", EPERM));
  EXPECT_TRUE(control_passed(control, "socketpair(AF_TIPC)", EPERM));
  expect_allowed(report, "socketpair(AF_UNIX)");
  expect_refused(report, "socketpair(AF_VSOCK)", EPERM);
  expect_refused(report, "socketpair(AF_TIPC)", EPERM);
}

// The connect filter under the default profile: a second listener (a
// program in the sandbox that wants its own) is refused with EBUSY, and
// once no one holds the listener, connect() fails at once with ENOSYS
// rather than waiting for an answer.
TEST(SeccompConnectListener, OneListenerAndNoWaitWithoutIt) {
  auto report = run_in_child([](ChildWriter& out) {
    if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(3);
    int listener = install_connect_listener();
    out.result("install_connect_listener", listener < 0 ? -1 : listener, -listener);
    if (listener < 0) ::_exit(0);
    ChildFailure failure;
    if (!install(default_program(), &failure)) ::_exit(4);
    int again = install_connect_listener();
    out.result("second listener", again < 0 ? -1 : again, -again);
    ::close(listener);
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(9);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    RECORD(out, "connect", ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr));
  });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  if (report.at("install_connect_listener").ret < 0)
    GTEST_SKIP() << "no connect listener: " << strerror(report.at("install_connect_listener").err);
  expect_refused(report, "second listener", EBUSY);
  expect_refused(report, "connect", ENOSYS);
}

TEST(SeccompDefault, AllowsOrdinaryCalls) {
  auto report = run_confined([](ChildWriter& out) {
    RECORD(out, "getppid", ::getppid());
    RECORD(out, "getpid", ::getpid());
    long rc = ::socket(AF_INET, SOCK_STREAM, 0);
    RECORD(out, "socket(AF_INET, SOCK_STREAM)", rc);
    rc = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    RECORD(out, "socket(AF_INET, SOCK_STREAM|flags)", rc);
    rc = ::socket(AF_INET6, SOCK_DGRAM, 0);
    RECORD(out, "socket(AF_INET6, SOCK_DGRAM)", rc);
    rc = ::socket(AF_UNIX, SOCK_SEQPACKET, 0);
    RECORD(out, "socket(AF_UNIX, SOCK_SEQPACKET)", rc);
    rc = ::socket(AF_NETLINK, SOCK_DGRAM, NETLINK_ROUTE);
    RECORD(out, "socket(AF_NETLINK, SOCK_DGRAM)", rc);
    rc = ::unshare(CLONE_FILES);  // not a namespace flag
    RECORD(out, "unshare(CLONE_FILES)", rc);
    rc = ::personality(0xffffffff);
    RECORD(out, "personality(query)", rc);
    pid_t child = ::fork();
    if (child == 0) ::_exit(7);
    int status = 0;
    if (child > 0 && ::waitpid(child, &status, 0) == child && WIFEXITED(status))
      out.result("fork", WEXITSTATUS(status), 0);
    else
      RECORD(out, "fork", -1);
  });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  EXPECT_EQ(report.at("getppid").ret, ::getpid());
  expect_allowed(report, "getpid");
  EXPECT_NE(report.at("getpid").ret, ::getpid());
  for (const char* name :
       {"socket(AF_INET, SOCK_STREAM)", "socket(AF_INET, SOCK_STREAM|flags)",
        "socket(AF_INET6, SOCK_DGRAM)", "socket(AF_UNIX, SOCK_SEQPACKET)",
        "socket(AF_NETLINK, SOCK_DGRAM)", "unshare(CLONE_FILES)", "personality(query)"})
    expect_allowed(report, name);
  EXPECT_EQ(report.at("fork").ret, 7) << strerror(report.at("fork").err);
}

// Regression (tools/seccomp_gen.cc, with libseccomp 2.5, fixed): the socket rules compare
// argument 0 with == AF_NETLINK in one rule and != AF_PACKET in others;
// libseccomp nests the == test under the != test's "else" branch, where the
// type checks fall through to the default action first. Netlink is then
// allowed only for stream, datagram and seqpacket types, and
// socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE), what ip(8) and most netlink
// users open, gets EPERM, against the profile's "netlink of any type".
TEST(SeccompDefault, AllowsNetlinkOfAnyType) {
  auto report = run_confined([](ChildWriter& out) {
    long rc = ::socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
    RECORD(out, "socket(AF_NETLINK, SOCK_RAW)", rc);
  });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  expect_allowed(report, "socket(AF_NETLINK, SOCK_RAW)");
}

// A pty pair made before the filter goes in; closed at the end of the test.
class SeccompTtyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    master_ = ::posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master_ < 0) GTEST_SKIP() << "no pseudo-terminals here: " << strerror(errno);
    if (::unlockpt(master_) == 0)
      slave_ = ::ioctl(master_, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (slave_ < 0) GTEST_SKIP() << "cannot open a pty slave: " << strerror(errno);
  }
  void TearDown() override {
    if (slave_ >= 0) ::close(slave_);
    if (master_ >= 0) ::close(master_);
  }
  int master_ = -1;
  int slave_ = -1;
};

TEST_F(SeccompTtyTest, AllowsOrdinaryIoctls) {
  const int slave = slave_;
  auto report = run_confined([&](ChildWriter& out) {
    winsize size{};
    RECORD(out, "TIOCGWINSZ", ::ioctl(slave, TIOCGWINSZ, &size));
    int flags = 1;
    RECORD(out, "FIONBIO", ::ioctl(slave, FIONBIO, &flags));
  });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  expect_allowed(report, "TIOCGWINSZ");
  expect_allowed(report, "FIONBIO");
}

// Pushing input into a terminal is refused whatever the terminal, and the
// command's high 32 bits cannot hide it (the kernel reads 32).
TEST_F(SeccompTtyTest, RefusesTerminalInputInjection) {
  SKIP_UNLESS_ROOT();
  const int slave = slave_;
  const auto checks = [&](ChildWriter& out) {
    char c = 'x';
    RECORD(out, "TIOCSTI", ::ioctl(slave, TIOCSTI, &c));
    // The kernel reads the command as 32 bits: high bits must not hide it.
    RECORD(out, "TIOCSTI|1<<32", ::syscall(SYS_ioctl, slave, (1UL << 32) | TIOCSTI, &c));
    RECORD(out, "TIOCLINUX", ::ioctl(slave, 0x541C /* TIOCLINUX */, &c));
  };
  auto control = run_in_child(checks);
  auto report = run_confined(checks);
  ASSERT_TRUE(control.exited_cleanly()) << control.text;
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  // Unfiltered, root may push input into any terminal (unless
  // dev.tty.legacy_tiocsti is 0: EIO), and a pty has no TIOCLINUX.
  if (control.at("TIOCSTI").ret != 0 && control.at("TIOCSTI").err == EIO)
    GTEST_SKIP() << "dev.tty.legacy_tiocsti is 0: the kernel refuses TIOCSTI itself";
  expect_allowed(control, "TIOCSTI");
  expect_allowed(control, "TIOCSTI|1<<32");
  EXPECT_TRUE(control_passed(control, "TIOCLINUX", EPERM));
  expect_refused(report, "TIOCSTI", EPERM);
  expect_refused(report, "TIOCSTI|1<<32", EPERM);
  expect_refused(report, "TIOCLINUX", EPERM);
}

}  // namespace
}  // namespace openshell::runtime::seccomp
