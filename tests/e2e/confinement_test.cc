// Confinement: every attempt to get out of the sandbox must fail, as root and
// rootless. The probe (osh-probe) tries one thing per run and says whether
// the kernel let it.
#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::StartsWith;

namespace e2e {
namespace {

class Confinement : public ModeTest {
 protected:
  Result probe(const std::vector<std::string>& probe_args,
               const std::vector<std::string>& run_args = {}) {
    std::vector<std::string> command = {"osh-probe"};
    command.insert(command.end(), probe_args.begin(), probe_args.end());
    return sandbox(mode(), run_args, command);
  }
  // The probe's action must be refused with the given errno name.
  void ExpectDenied(const std::vector<std::string>& probe_args, const std::string& errno_name,
                    const std::vector<std::string>& run_args = {}) {
    Result r = probe(probe_args, run_args);
    EXPECT_EQ(r.status, 1) << testing::PrintToString(probe_args) << " was not refused: " << r.out
                           << r.err;
    EXPECT_THAT(r.out, HasSubstr("denied: " + errno_name)) << testing::PrintToString(probe_args);
  }

  // A system call only the filter can refuse: run as root inside with every
  // capability, the probe gets exactly the filter's errno. The negative
  // control, the same probe with the filter off, must print control_out (by
  // default "ok": the call worked; empty: any answer but a refusal for want
  // of permission, for calls made with arguments the kernel refuses after
  // its permission checks), so that the refusal is the filter's. Where the
  // kernel refuses the control for reasons of its own (a capability of the
  // host's, a sysctl, a kernel without the call), the case skips, saying so.
  void ExpectFilterRefuses(const std::vector<std::string>& probe_args,
                           const std::string& errno_name = "EPERM",
                           const std::string& control_out = "ok\n",
                           const std::vector<std::string>& run_args = {}, Options options = {}) {
    const std::string what = "osh-probe " + join(probe_args);
    std::vector<std::string> command = {"osh-probe"};
    command.insert(command.end(), probe_args.begin(), probe_args.end());
    std::vector<std::string> filter_only = kFilterOnly, unconfined = kUnconfined;
    filter_only.insert(filter_only.end(), run_args.begin(), run_args.end());
    unconfined.insert(unconfined.end(), run_args.begin(), run_args.end());
    Result r = sandbox(mode(), filter_only, command, options);
    r.out = without_cr(r.out);
    EXPECT_EQ(r.status, 1) << what << " was not refused by the filter: " << r.out << r.err;
    EXPECT_EQ(r.out, "denied: " + errno_name + " (" + errno_text(errno_name) + ")\n") << what;

    Result control = sandbox(mode(), unconfined, command, options);
    control.out = without_cr(control.out);
    bool kernel_refused = false;
    for (const char* err : {"EPERM", "EACCES", "ENOSYS", "EIO"})
      kernel_refused =
          kernel_refused || control.out.rfind(std::string("denied: ") + err + " ", 0) == 0;
    if (control.status == 1 && kernel_refused && control.out != control_out) {
      GTEST_SKIP() << what << ": the kernel refuses it even with --seccomp unconfined ("
                   << trimmed(control.out) << "), so the refusal above may not be the filter's";
    }
    if (control_out.empty()) {
      EXPECT_TRUE(control.status == 0 ||
                  (control.status == 1 && control.out.rfind("denied: ", 0) == 0))
          << what << " with --seccomp unconfined: " << control.out << control.err;
      return;
    }
    EXPECT_EQ(control.status, control_out.rfind("denied: ", 0) == 0 ? 1 : 0)
        << what << " with --seccomp unconfined: " << control.out << control.err;
    EXPECT_EQ(control.out, control_out) << what << " with --seccomp unconfined";
  }

  static std::string join(const std::vector<std::string>& words) {
    std::string out;
    for (const std::string& w : words) out += (out.empty() ? "" : " ") + w;
    return out;
  }
  // A terminal's output ends its lines in "\r\n".
  static std::string without_cr(std::string s) {
    s.erase(std::remove(s.begin(), s.end(), '\r'), s.end());
    return s;
  }
  static std::string trimmed(std::string s) {
    while (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  // The text the probe prints beside the errno names these tests expect.
  static std::string errno_text(const std::string& name) {
    if (name == "EPERM") return std::strerror(EPERM);
    if (name == "ENOSYS") return std::strerror(ENOSYS);
    return "?";
  }

  // Root inside with every capability: only the filter stands in the way.
  const std::vector<std::string> kFilterOnly = {"--user", "0", "--cap-add", "ALL"};
  // The same, unfiltered: the negative control.
  const std::vector<std::string> kUnconfined = {"--user", "0",         "--cap-add",
                                                "ALL",    "--seccomp", "unconfined"};
};
E2E_ALL_MODES(Confinement);

TEST_P(Confinement, NoCapabilitiesNoNewPrivsSeccompOn) {
  for (const std::vector<std::string>& user : {std::vector<std::string>{}, {"--user", "0"}}) {
    Result r = probe({"status"}, user);
    ASSERT_EQ(r.status, 0) << r.err;
    for (const char* set : {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"})
      EXPECT_THAT(r.out, HasSubstr(std::string(set) + ":\t0000000000000000")) << set;
    EXPECT_THAT(r.out, HasSubstr("NoNewPrivs:\t1"));
    EXPECT_THAT(r.out, HasSubstr("Seccomp:\t2"));
  }
}

TEST_P(Confinement, CapAddKeepsOnlyThatCapability) {
  Result r = probe({"status"}, {"--cap-add", "NET_ADMIN"});
  ASSERT_EQ(r.status, 0) << r.err;
  // CAP_NET_ADMIN is bit 12: 0x1000.
  for (const char* set : {"CapPrm", "CapEff", "CapBnd", "CapAmb"})
    EXPECT_THAT(r.out, HasSubstr(std::string(set) + ":\t0000000000001000")) << set;
}

TEST_P(Confinement, SeccompUnconfinedIsExplicit) {
  Result r = probe({"status"}, {"--seccomp", "unconfined"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Seccomp:\t0"));
  EXPECT_THAT(r.out, HasSubstr("NoNewPrivs:\t1"));
}

// The escape battery. The system calls the filter refuses are tried where
// nothing else would refuse them (root inside, every capability), each with
// its negative control (the same without the filter, which must work).
TEST_P(Confinement, MountIsRefused) { ExpectFilterRefuses({"mount"}); }
TEST_P(Confinement, UmountIsRefused) { ExpectFilterRefuses({"umount", "/proc"}); }
TEST_P(Confinement, NewUserNamespaceIsRefused) {
  ExpectFilterRefuses({"unshare-user"});
  ExpectFilterRefuses({"clone-newuser"});
  // busybox's unshare, as a user would type it.
  Result r = sandbox(mode(), kFilterOnly, {"unshare", "-U", "true"});
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_EQ(r.err, "unshare: unshare(0x10000000): Operation not permitted\n");
  Result control = sandbox(mode(), kUnconfined, {"unshare", "-U", "true"});
  EXPECT_EQ(control.status, 0) << control.out << control.err;
}
TEST_P(Confinement, Clone3FallsBackWithEnosys) { ExpectFilterRefuses({"clone3"}, "ENOSYS"); }
TEST_P(Confinement, SetnsIsRefused) { ExpectFilterRefuses({"setns"}); }
TEST_P(Confinement, PtraceIsRefused) {
  ExpectFilterRefuses({"ptrace", "child"});
  // A host process is not even visible.
  Result r = probe({"kill", std::to_string(::getpid())}, kFilterOnly);
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_EQ(r.out, "denied: ESRCH (No such process)\n");
}
TEST_P(Confinement, KeyringsAreRefused) {
  ExpectFilterRefuses({"keyctl"});
  ExpectFilterRefuses({"add_key"});
}
TEST_P(Confinement, PerfAndUserfaultfdAreRefused) {
  ExpectFilterRefuses({"perf_event_open"});
  ExpectFilterRefuses({"userfaultfd"});
}
// Unconfined, bpf in a user namespace needs kernel.unprivileged_bpf_disabled=0.
TEST_P(Confinement, BpfIsRefused) { ExpectFilterRefuses({"bpf"}); }
TEST_P(Confinement, IoUringIsRefused) { ExpectFilterRefuses({"io_uring"}); }
TEST_P(Confinement, KernelLoadingIsRefused) {
  // Unconfined these pass only with the host's own CAP_SYS_BOOT,
  // CAP_SYS_MODULE and CAP_DAC_READ_SEARCH, which no user namespace gives:
  // they skip after their filtered half, saying so.
  ExpectFilterRefuses({"kexec_load"}, "EPERM", "denied: EINVAL (Invalid argument)\n");
  ExpectFilterRefuses({"init_module"}, "EPERM", "denied: ENOEXEC (Exec format error)\n");
  ExpectFilterRefuses({"open_by_handle_at"}, "EPERM", "");
}
// A system call the kernel has and the profile does not allow: unfiltered it
// needs no privilege at all (a file handle of /tmp, a tmpfs).
TEST_P(Confinement, SyscallsOutsideTheProfileAreRefused) {
  ExpectFilterRefuses({"name_to_handle_at", "/tmp"});
}
TEST_P(Confinement, RawAndPacketSocketsAreRefused) {
  ExpectFilterRefuses({"raw-socket"});
  ExpectFilterRefuses({"packet-socket"});
  Result r = probe({"tcp-socket"});
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_EQ(r.out, "ok\n");
}
TEST_P(Confinement, PrivilegedFileOperationsAreRefused) {
  ExpectFilterRefuses({"chroot", "/tmp"});
  ExpectFilterRefuses({"sethostname"});
  // Not the filter's: the kernel makes no device nodes in a user namespace,
  // and the sandbox has no capabilities to change its ids.
  ExpectDenied({"mknod", "/tmp/null"}, "EPERM", kFilterOnly);
  // EINVAL where 0 does not even exist inside (a single-id map).
  ExpectDenied({"setuid", "0"}, mode() == Mode::kRootlessSingle ? "EINVAL" : "EPERM");
}
TEST_P(Confinement, KernelTunablesAreReadOnly) {
  ExpectDenied({"write", "/proc/sys/kernel/hostname", "escaped"}, "EROFS", {"--user", "0"});
  ExpectDenied({"write", "/sys/kernel/uevent_helper", "/escape"}, "EROFS", {"--user", "0"});
  Result r = probe({"read", "/proc/keys"}, {"--user", "0"});
  EXPECT_EQ(r.out, "ok: 0 bytes\n");
}
TEST_P(Confinement, TerminalInjectionIsRefused) {
  Options o;
  o.pty = true;
  // Unfiltered, the terminal echoes the injected "x" before the probe's "ok".
  ExpectFilterRefuses({"tiocsti"}, "EPERM", "xok\n", {"--tty"}, o);
}

// A TCP listener on the host's loopback, and on its first non-loopback
// address: neither is reachable, and refusal is immediate.
TEST_P(Confinement, HostPortsAreUnreachable) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener, 4), 0);
  socklen_t len = sizeof addr;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  std::string port = std::to_string(ntohs(addr.sin_port));

  ExpectDenied({"connect", "127.0.0.1", port}, "ECONNREFUSED");
  ExpectDenied({"connect", "127.0.0.1", port}, "ECONNREFUSED", {"--user", "0", "--cap-add", "ALL"});

  // The host's own address (if it has one besides loopback): no route out.
  ifaddrs* list = nullptr;
  std::string host_ip;
  if (::getifaddrs(&list) == 0) {
    for (ifaddrs* i = list; i; i = i->ifa_next) {
      if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
      auto* in = reinterpret_cast<sockaddr_in*>(i->ifa_addr);
      if (ntohl(in->sin_addr.s_addr) >> 24 == 127) continue;
      char text[INET_ADDRSTRLEN];
      host_ip = ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
      break;
    }
    ::freeifaddrs(list);
  }
  ::close(listener);
  if (host_ip.empty()) GTEST_SKIP() << "the host has no IPv4 address besides loopback to try";
  ExpectDenied({"connect", host_ip, port}, "ENETUNREACH");
}

TEST_P(Confinement, NoHostFileDescriptorsEnter) {
  // An fd the caller forgot to close (not close-on-exec), pointing at the host's /.
  int leaked = ::open("/", O_RDONLY | O_DIRECTORY);
  ASSERT_GE(leaked, 3);
  Options o;
  o.leak_fds = {leaked};
  Result r = sandbox(mode(), {}, {"osh-probe", "fds"}, o);
  ::close(leaked);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ok: 0,1,2\n");
}

// CVE-2019-5736: nothing in the sandbox may write the openshell binary.
TEST_P(Confinement, InitImageCannotBeWritten) {
  std::string before = file_contents(binary());
  // PID 1 is not dumpable: its /proc entries are closed to the sandbox.
  ExpectDenied({"exe-write", "/proc/1/exe"}, "EACCES", {"--user", "0"});
  // Even at the weakest (root inside, CAP_SYS_PTRACE, no seccomp) the image
  // is a read-only mount: a handle on it cannot be reopened for writing.
  Result r = probe({"exe-reopen", "1"},
                   {"--user", "0", "--cap-add", "SYS_PTRACE", "--seccomp", "unconfined"});
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("reopen for writing: denied:"));
  // A script whose interpreter is /proc/self/exe runs the sealed image too.
  std::string dir = make_dir(mode(), "evil-" + mode_name(mode()), 0755);
  write_file(dir + "/evil", "#!/proc/self/exe\n", 0755);
  Result evil = sandbox(mode(), {"--bind", dir + ":/evil:ro", "--user", "0"}, {"/evil/evil"});
  // The init's own program ran (and refused to be anything but the init),
  // not a failure to start the sandbox.
  EXPECT_EQ(evil.status, 125) << evil.err;
  EXPECT_EQ(evil.err, "openshell: __init is internal to the runtime\n");
  EXPECT_EQ(file_contents(binary()), before);
}

TEST_P(Confinement, InitImageIsSealed) {
  // With the weakest settings the sandbox can open its PID 1's program: a
  // memfd sealed against writes, growth, shrinking and unsealing (runtime/
  // init_image.h), so no sandbox changes what a later one runs.
  Result r = probe({"exe-seals", "/proc/1/exe"},
                   {"--user", "0", "--cap-add", "SYS_PTRACE", "--seccomp", "unconfined"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "ok: sealed\n");
}

TEST_P(Confinement, LandlockConfinesFilesystem) {
  std::string policy = write_file(scratch() + "/fs-" + mode_name(mode()) + ".toml", R"(version = 1
[filesystem_policy]
include_workdir = false
read_only = ["/bin", "/usr", "/etc", "/proc", "/dev"]
read_write = ["/tmp", "/dev/null"]
)");
  std::vector<std::string> run = {"--policy", policy, "--user", "0"};
  // Allowed: reading system files, writing /tmp.
  Result r = sandbox(mode(), run, {"sh", "-c", "cat /etc/hostname && echo x > /tmp/x && echo ok"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "sandbox\nok\n");
  // Refused: writing anywhere else, even as root inside.
  ExpectDenied({"write", "/home/sandbox/x"}, "EACCES", run);
  ExpectDenied({"write", "/etc/x"}, "EACCES", run);
  ExpectDenied({"read", "/root"}, "EACCES", run);
}

TEST_P(Confinement, LandlockPolicyWithoutWorkdirKeepsRootReadOnly) {
  // include_workdir defaults to true, and the default workdir is /: that must
  // not turn into a read-write rule for the whole root.
  std::string policy = write_file(scratch() + "/wd-" + mode_name(mode()) + ".toml", R"(version = 1
[filesystem_policy]
read_only = ["/bin", "/usr", "/etc", "/proc", "/dev", "/home"]
read_write = ["/tmp"]
)");
  ExpectDenied({"write", "/home/sandbox/x"}, "EACCES", {"--policy", policy});
}

TEST_P(Confinement, LandlockHardRequirementRefusesMissingPaths) {
  std::string hard = write_file(scratch() + "/hard-" + mode_name(mode()) + ".toml", R"(version = 1
[filesystem_policy]
read_only = ["/bin", "/usr", "/no/such/dir"]
[landlock]
compatibility = "hard_requirement"
)");
  Result r = sandbox(mode(), {"--policy", hard}, {"true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("/no/such/dir"));

  std::string soft = write_file(scratch() + "/soft-" + mode_name(mode()) + ".toml", R"(version = 1
[filesystem_policy]
read_only = ["/bin", "/usr", "/no/such/dir"]
)");
  r = sandbox(mode(), {"--policy", soft}, {"true"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("warning"));
  EXPECT_THAT(r.err, HasSubstr("/no/such/dir"));
}

}  // namespace
}  // namespace e2e
