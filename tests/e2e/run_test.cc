// openshell run: what a user sees — output, exit codes, errors, the
// sandbox's view of processes, files, users and environment.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <sstream>
#include <string>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;
using testing::StartsWith;

namespace e2e {
namespace {

// The text without the blanks around it (wc pads its numbers).
std::string trimmed(const std::string& text) {
  const char* blanks = " \t\n";
  auto first = text.find_first_not_of(blanks);
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(blanks) - first + 1);
}

int count_lines(const std::string& text) {
  int n = 0;
  for (char c : text) n += c == '\n';
  return n;
}

class Run : public ModeTest {};
E2E_ALL_MODES(Run);

TEST_P(Run, PassesStdoutAndExitStatus) {
  Result r = sandbox(mode(), {}, {"sh", "-c", "echo hello; echo oops >&2; exit 42"});
  EXPECT_EQ(r.status, 42) << r.err;
  EXPECT_EQ(r.out, "hello\n");
  EXPECT_EQ(r.err, "oops\n");
}

TEST_P(Run, CommandWithoutDoubleDash) {
  Result r = openshell(mode(), {"run", "--rootfs", rootfs(), "echo", "a", "-n"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "a -n\n");
}

TEST_P(Run, PassesStdin) {
  Options o;
  o.stdin_data = "line one\nline two\n";
  Result r = sandbox(mode(), {}, {"wc", "-l"}, o);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(trimmed(r.out), "2");
}

TEST_P(Run, DeathBySignalGives128PlusN) {
  EXPECT_EQ(sandbox(mode(), {}, {"sh", "-c", "kill -KILL $$"}).status, 137);
  EXPECT_EQ(sandbox(mode(), {}, {"sh", "-c", "kill -TERM $$"}).status, 143);
}

TEST_P(Run, CommandNotFoundIs127) {
  Result r = sandbox(mode(), {}, {"/no/such/command"});
  EXPECT_EQ(r.status, 127);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("/no/such/command"));
  EXPECT_EQ(sandbox(mode(), {}, {"no-such-command-in-path"}).status, 127);
}

TEST_P(Run, CommandNotExecutableIs126) {
  Result r = sandbox(mode(), {}, {"/etc/passwd"});
  EXPECT_EQ(r.status, 126);
  EXPECT_THAT(r.err, HasSubstr("Permission denied"));
}

TEST_P(Run, BadInputGetsOneLineAnd125) {
  struct Case {
    std::vector<std::string> args;
    std::string says;
  };
  const std::string missing = scratch() + "/no-such-rootfs";
  const std::vector<Case> cases = {
      {{"run", "--bogus", "--", "true"}, "unknown option --bogus"},
      {{"run", "--rootfs", missing, "--", "true"}, missing},
      {{"run", "--rootfs", rootfs(), "--memory", "64Q", "--", "true"}, "--memory 64Q"},
      {{"run", "--rootfs", rootfs(), "--pids", "-3", "--", "true"}, "--pids"},
      {{"run", "--rootfs", rootfs(), "--cpus", "lots", "--", "true"}, "--cpus lots"},
      {{"run", "--rootfs", rootfs(), "--bind", "/nonexistent-src:/x", "--", "true"},
       "/nonexistent-src"},
      {{"run", "--rootfs", rootfs(), "--bind", "/tmp:relative", "--", "true"}, "--bind"},
      {{"run", "--rootfs", rootfs(), "--user", "nosuchuser", "--", "true"}, "nosuchuser"},
      {{"run", "--rootfs", rootfs(), "--hostname", "Not_A_Label", "--", "true"}, "--hostname"},
      {{"run", "--rootfs", rootfs(), "--seccomp", "maybe", "--", "true"}, "--seccomp"},
      {{"run", "--rootfs", rootfs(), "--cap-add", "FLY", "--", "true"}, "FLY"},
      {{"run", "--rootfs", rootfs(), "--rlimit", "bananas=3", "--", "true"}, "bananas"},
      {{"run", "--rootfs", rootfs(), "--policy", scratch() + "/none.toml", "--", "true"},
       "none.toml"},
      {{"run", "--rootfs", rootfs()}, "no command"},
      {{"frobnicate"}, "unknown command 'frobnicate'"},
  };
  for (const auto& c : cases) {
    Result r = openshell(mode(), c.args);
    EXPECT_EQ(r.status, 125) << testing::PrintToString(c.args) << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << testing::PrintToString(c.args) << ": " << r.err;
    EXPECT_THAT(r.err, StartsWith("openshell: "));
    EXPECT_THAT(r.err, HasSubstr(c.says)) << testing::PrintToString(c.args);
    EXPECT_EQ(r.out, "");
  }
}

TEST_P(Run, MalformedPolicyNamesFileLineAndField) {
  std::string policy = write_file(scratch() + "/bad-" + mode_name(mode()) + ".toml",
                                  "version = 1\n[filesystem_policy]\nread_write = [\"tmp\"]\n");
  Result r = sandbox(mode(), {"--policy", policy}, {"true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr(policy + ":3: filesystem_policy.read_write[0]"));
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
}

TEST_P(Run, HelpAndVersion) {
  Result help = openshell(mode(), {"run", "--help"});
  EXPECT_EQ(help.status, 0);
  EXPECT_THAT(help.out, HasSubstr("--rootfs"));
  EXPECT_THAT(help.out, HasSubstr("Examples:"));
  Result version = openshell(mode(), {"--version"});
  EXPECT_EQ(version.status, 0);
  EXPECT_THAT(version.out, StartsWith("openshell "));
}

TEST_P(Run, NewNamespacesForEverything) {
  // Inside, every namespace differs from the host's.
  Result r = sandbox(mode(), {},
                     {"sh", "-c",
                      "for n in user mnt pid net uts ipc cgroup; do "
                      "readlink /proc/self/ns/$n; done"});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* ns : {"user", "mnt", "pid", "net", "uts", "ipc", "cgroup"}) {
    char host[128] = {};
    ASSERT_GT(::readlink((std::string("/proc/self/ns/") + ns).c_str(), host, sizeof host - 1), 0);
    EXPECT_THAT(r.out, HasSubstr(std::string(ns) + ":[")) << ns;
    EXPECT_THAT(r.out, Not(HasSubstr(host))) << "shares the host's " << ns << " namespace";
  }
}

TEST_P(Run, InitIsPid1AndOnlyOurProcessesAreVisible) {
  Result r = sandbox(
      mode(), {},
      {"sh", "-c", "cat /proc/1/cmdline | tr '\\0' ' '; echo; ls /proc | grep -c '^[0-9]'"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("openshell-init __init"));
  // init, sh, ls, grep (and perhaps cat/tr finishing): never the host's hundreds.
  int count = std::stoi(r.out.substr(r.out.find('\n') + 1));
  EXPECT_LE(count, 6);
}

TEST_P(Run, OnlyLoopbackNetwork) {
  Result r = sandbox(
      mode(), {}, {"sh", "-c", "cat /proc/net/dev | tail -n +3 | cut -d: -f1; ls /sys/class/net"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "    lo\nlo\n");
}

TEST_P(Run, NetlinkToolsWork) {
  // ip(8) speaks netlink over a raw netlink socket, which the filter allows.
  Result r = sandbox(mode(), {}, {"ip", "-o", "link"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(": lo: <LOOPBACK,UP"));
}

TEST_P(Run, HostnameDefaultsAndOption) {
  EXPECT_EQ(sandbox(mode(), {}, {"hostname"}).out, "sandbox\n");
  EXPECT_EQ(sandbox(mode(), {"--hostname", "agent-7"}, {"hostname"}).out, "agent-7\n");
}

TEST_P(Run, DefaultUserIsNotRoot) {
  Result r = sandbox(mode(), {}, {"id"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith("uid=1000(sandbox) gid=1000(sandbox)"));
}

TEST_P(Run, UserOption) {
  EXPECT_THAT(sandbox(mode(), {"--user", "0"}, {"id", "-u"}).out, "0\n");
  EXPECT_THAT(sandbox(mode(), {"--user", "sandbox"}, {"id", "-un"}).out, "sandbox\n");
  Result r = sandbox(mode(), {"--user", "1234:4321"}, {"sh", "-c", "id -u; id -g"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "1234\n4321\n");
}

TEST_P(Run, EnvironmentIsCleanAndSetByOptions) {
  Options o;
  o.env = {"OSH_SECRET=hunter2", "OSH_PASS=through"};
  Result r = sandbox(
      mode(), {"--env", "A=1", "-e", "B=two words", "--env", "OSH_PASS", "--env", "OSH_UNSET"},
      {"env"}, o);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("A=1\n"));
  EXPECT_THAT(r.out, HasSubstr("B=two words\n"));
  EXPECT_THAT(r.out, HasSubstr("OSH_PASS=through\n"));
  EXPECT_THAT(r.out, HasSubstr("PATH=/usr/local/sbin:"));
  EXPECT_THAT(r.out, Not(HasSubstr("OSH_SECRET")));
  EXPECT_THAT(r.out, Not(HasSubstr("OSH_UNSET")));
  EXPECT_THAT(r.out, Not(HasSubstr("LANG=")));
}

TEST_P(Run, RepeatableOptionsTakeOneValueEach) {
  // Without "--", the first word that is not an option's value is the command.
  Result r = openshell(mode(), {"run", "--rootfs", rootfs(), "-e", "A=1", "-e", "B=2", "env"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("A=1\nB=2\n"));
}

TEST_P(Run, WorkdirIsCreatedAndOwnedByTheUser) {
  Result r = sandbox(mode(), {"--workdir", "/work/deep"},
                     {"sh", "-c", "pwd; stat -c %U /work/deep; touch mine && echo wrote"});
  // Also where the image's / belongs to an unmapped host root (rootless):
  // the throw-away layer makes it, owned by the user.
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "/work/deep\nsandbox\nwrote\n");
}

TEST_P(Run, ThrowAwayWritableLayer) {
  std::string before = file_contents(rootfs() + "/etc/hostname");
  Result r = sandbox(mode(), {"--user", "0"},
                     {"sh", "-c", "echo changed > /etc/hostname && cat /etc/hostname"});
  if (mode() == Mode::kRoot) {
    // As root the image's files are owned by root inside (an idmapped lower layer).
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.out, "changed\n");
  } else {
    // Rootless, they belong to an unmapped host root: root inside may not
    // write them, and says why.
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_EQ(r.out, "");
    EXPECT_EQ(r.err, "sh: can't create /etc/hostname: Permission denied\n");
  }
  // A file of its own it may write, in every mode: the layer is writable.
  Result own =
      sandbox(mode(), {"--user", "0"}, {"sh", "-c", "echo mine > /new-file && cat /new-file"});
  EXPECT_EQ(own.status, 0) << own.err;
  EXPECT_EQ(own.out, "mine\n");
  // Whatever happened inside, the image is untouched and the next run sees it as it was.
  EXPECT_EQ(file_contents(rootfs() + "/etc/hostname"), before);
  EXPECT_EQ(sandbox(mode(), {}, {"cat", "/etc/hostname"}).out, before);
}

TEST_P(Run, TmpIsPrivateAndWritable) {
  Result r = sandbox(mode(), {}, {"sh", "-c", "echo x > /tmp/f && ls /tmp && stat -c %a /tmp"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "f\n1777\n");
  EXPECT_EQ(sandbox(mode(), {}, {"ls", "/tmp"}).out, "");
}

TEST_P(Run, ReadOnlyRoot) {
  Result r = sandbox(mode(), {"--read-only", "--user", "0"},
                     {"sh", "-c", "touch /etc/x; touch /tmp/y && echo tmp-ok"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "tmp-ok\n");
  EXPECT_THAT(r.err, HasSubstr("Read-only file system"));
}

TEST_P(Run, HostRootIsReadOnlyWithPrivateTmpAndRun) {
  // The host's files are there, read-only, even one anybody may write; its
  // /tmp and /run are not there.
  std::string shared = "/var/tmp/osh-e2e-writable-" + mode_name(mode());
  write_file(shared, "host\n", 0666);
  Result r = openshell(mode(), {"run", "--rootfs", "host", "--", "/bin/sh", "-c",
                                "cat " + shared +
                                    "; ls -A /tmp | wc -l; ls -A /run | wc -l; "
                                    "echo changed > " +
                                    shared + "; test -d " + scratch() + " || echo no-scratch"});
  std::string after = file_contents(shared);
  ::unlink(shared.c_str());
  EXPECT_EQ(r.out, "host\n0\n0\nno-scratch\n");
  EXPECT_THAT(r.err, HasSubstr("Read-only file system"));
  EXPECT_EQ(after, "host\n");
}

TEST_P(Run, BindMounts) {
  std::string data = make_dir(mode(), "bind-" + mode_name(mode()), 0777);
  write_file(data + "/in", "from host\n", 0644);
  Result rw = sandbox(mode(), {"--bind", data + ":/data"},
                      {"sh", "-c", "cat /data/in && echo from sandbox > /data/out"});
  EXPECT_EQ(rw.status, 0) << rw.err;
  EXPECT_EQ(rw.out, "from host\n");
  EXPECT_EQ(file_contents(data + "/out"), "from sandbox\n");

  Result ro = sandbox(mode(), {"--bind", data + ":/data:ro"}, {"sh", "-c", "echo x > /data/out2"});
  EXPECT_EQ(ro.status, 1) << ro.err;
  EXPECT_EQ(ro.err, "sh: can't create /data/out2: Read-only file system\n");
  EXPECT_EQ(::access((data + "/out2").c_str(), F_OK), -1);

  // A single file.
  // A single file, over one of the image's.
  Result file =
      sandbox(mode(), {"--bind", data + "/in:/etc/hostname:ro"}, {"cat", "/etc/hostname"});
  EXPECT_EQ(file.out, "from host\n") << file.err;
}

TEST_P(Run, BindMountsKeepFileOwners) {
  // The sandbox user's files in a bind mount belong, on the host, to the
  // host user it stands for: uid 1000 as root (an idmapped mount), the
  // caller rootless.
  uid_t owner = mode() == Mode::kRoot ? 1000 : uid_of(mode());
  gid_t group = mode() == Mode::kRoot ? 1000 : gid_of(mode());
  std::string dir = make_dir(mode(), "owned-" + mode_name(mode()), 0755);
  ASSERT_EQ(::chown(dir.c_str(), owner, group), 0);
  Result r = sandbox(mode(), {"--bind", dir + ":/sandbox"},
                     {"sh", "-c", "stat -c '%U %u' /sandbox; echo hi > /sandbox/made"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "sandbox 1000\n");
  struct stat st;
  ASSERT_EQ(::stat((dir + "/made").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, owner);
  EXPECT_EQ(st.st_gid, group);
}

TEST_P(Run, BindsNeverActAsHostRoot) {
  // A root-owned directory anyone may write: whatever the sandbox does there,
  // even as root inside, nothing it leaves belongs to the host's root.
  std::string dir = scratch() + "/rootowned-" + mode_name(mode());
  ::mkdir(dir.c_str(), 0777);
  ::chmod(dir.c_str(), 0777);
  ASSERT_EQ(::chown(dir.c_str(), 0, 0), 0);
  Result r = sandbox(mode(), {"--user", "0", "--bind", dir + ":/b"},
                     {"sh", "-c", "touch /b/x && chmod 4755 /b/x; ls -ln /b"});
  EXPECT_EQ(r.status, 0) << r.err;
  struct stat st;
  ASSERT_EQ(::stat((dir + "/x").c_str(), &st), 0) << r.out << r.err;
  EXPECT_NE(st.st_uid, 0u);
  EXPECT_NE(st.st_gid, 0u);
}

TEST_P(Run, MinimalDevWithoutHostDevices) {
  Result r =
      sandbox(mode(), {},
              {"sh", "-c", "ls /dev | sort | tr '\\n' ' '; echo x > /dev/null && echo null-ok"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out,
            "fd full null ptmx pts random shm stderr stdin stdout tty urandom zero null-ok\n");
}

TEST_P(Run, ProcAndSysAreConfined) {
  // Masked: /proc/keys and /proc/timer_list read empty, /sys/firmware is
  // an empty directory; /proc/sys and /sys are read-only, even for root.
  Result r = sandbox(mode(), {"--user", "0"},
                     {"sh", "-c",
                      "cat /proc/keys /proc/timer_list | wc -c; ls /sys/firmware | wc -l; "
                      "echo 1 > /proc/sys/kernel/ns_last_pid; echo x > /sys/kernel/uevent_helper; "
                      "test -e /proc/sysrq-trigger && wc -c < /proc/sysrq-trigger"});
  EXPECT_THAT(r.err, HasSubstr("/proc/sys/kernel/ns_last_pid: Read-only file system"));
  EXPECT_THAT(r.err, HasSubstr("/sys/kernel/uevent_helper: Read-only file system"));
  // Where the kernel has it, /proc/sysrq-trigger is masked too (it reads empty).
  const bool has_sysrq = ::access("/proc/sysrq-trigger", F_OK) == 0;
  EXPECT_EQ(r.out, has_sysrq ? "0\n0\n0\n" : "0\n0\n") << "has /proc/sysrq-trigger: " << has_sysrq;
}

TEST_P(Run, RlimitsAndNoCoreDumps) {
  Result r = sandbox(mode(), {"--rlimit", "nofile=64:128"},
                     {"sh", "-c", "ulimit -c; ulimit -n; ulimit -Hn"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "0\n64\n128\n");
}

TEST_P(Run, TtyGivesThePtyFromTheSandboxDevpts) {
  Options o;
  o.pty = true;
  o.rows = 31;
  o.cols = 97;
  Result r = sandbox(mode(), {"-t"}, {"sh", "-c", "tty; stty size; id -un"}, o);
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, HasSubstr("/dev/pts/0\r\n31 97\r\nsandbox\r\n"));
}

TEST_P(Run, ForwardsSignals) {
  // The main process traps INT; openshell forwards it and passes the status.
  Options o;
  o.signal_when = "ready";
  o.signal = SIGINT;
  Result r =
      sandbox(mode(), {},
              // Builtins only: a child killed by the same SIGINT would make the shell's
              // reaction depend on timing.
              {"sh", "-c", "trap 'echo got-int; exit 7' INT; echo ready; while :; do :; done"}, o);
  EXPECT_EQ(r.status, 7) << r.err;
  EXPECT_EQ(r.out, "ready\ngot-int\n");

  o.signal = SIGTERM;
  r = sandbox(mode(), {}, {"sh", "-c", "echo ready; sleep 30"}, o);
  EXPECT_EQ(r.status, 143) << r.err;
  EXPECT_FALSE(r.timed_out);
}

TEST_P(Run, KilledOwnerTakesTheSandboxWithIt) {
  // SIGKILL to openshell itself: the init sees its lifeline close and ends
  // everything; the fixture then checks nothing is left.
  Options o;
  o.signal_when = "ready";
  o.signal = SIGKILL;
  Result r = sandbox(mode(), {}, {"sh", "-c", "cat /proc/self/uid_map; echo ready; sleep 30"}, o);
  EXPECT_EQ(r.status, 128 + SIGKILL);
  for (int i = 0; i < 1500 && !leftover_processes().empty(); ++i) ::usleep(20000);
  // Its cgroups (every sandbox has a pids limit) go with them: a helper
  // of openshell's removes them once they are empty.
  for (int i = 0; i < 1500 && !new_since(leftover_cgroups(), cgroups_before_).empty(); ++i)
    ::usleep(20000);
  // As root, so does its claim on the host ids it ran as (named by their
  // first uid, which the sandbox's uid_map shows).
  if (mode() != Mode::kRoot) return;
  std::istringstream map(r.out);
  std::string inside, outside;
  ASSERT_TRUE(map >> inside >> outside) << r.out;
  const std::string claim = "/var/lib/openshell/id-ranges/" + outside;
  for (int i = 0; i < 500 && ::access(claim.c_str(), F_OK) == 0; ++i) ::usleep(20000);
  EXPECT_NE(::access(claim.c_str(), F_OK), 0) << claim << " outlived the run killed with -9";
}

// Where the kernel runs no memfd (vm.memfd_noexec=2, in a pid namespace of
// this test's own with its own /proc: not the host's), the init is the
// binary itself, and a run works as before.
TEST_P(Run, WithoutExecutableMemfdsTheBinaryItselfIsTheInit) {
  if (mode() != Mode::kRoot) GTEST_SKIP() << "a pid namespace's sysctl is set as root";
  if (::access("/proc/sys/vm/memfd_noexec", W_OK) != 0)
    GTEST_SKIP() << "this kernel has no vm.memfd_noexec";
  const std::string host_setting = file_contents("/proc/sys/vm/memfd_noexec");
  const std::string script = "echo 2 > /proc/sys/vm/memfd_noexec && exec '" + binary() +
                             "' -v run --rootfs '" + rootfs() + "' -- cat /proc/1/comm";
  FILE* p = ::popen(("unshare -fp --mount-proc sh -c \"" + script + "\" 2>&1").c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_THAT(out, HasSubstr("memfd_create for the init's program: Permission denied: this "
                             "binary is the init"));
  EXPECT_THAT(out, HasSubstr("osh-init\n"));
  // The host's own setting is untouched.
  EXPECT_EQ(file_contents("/proc/sys/vm/memfd_noexec"), host_setting);
}

}  // namespace
}  // namespace e2e
