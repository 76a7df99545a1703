#include "cli/run_options.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/files.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "base/vm_host.h"
#include "runtime/landlock.h"
#include "test_util.h"

namespace openshell::cli {
namespace {

using openshell::testing::error_of;
using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// --- parse_bind --------------------------------------------------------------------

TEST(ParseBind, SourceAndDestination) {
  namespaces::BindSpec b = parse_bind("data:/work");
  EXPECT_EQ(b.source, "data");
  EXPECT_EQ(b.target, "/work");
  EXPECT_FALSE(b.read_only);
}

TEST(ParseBind, Modes) {
  EXPECT_TRUE(parse_bind("/a:/b:ro").read_only);
  EXPECT_FALSE(parse_bind("/a:/b:rw").read_only);
}

TEST(ParseBind, BadForms) {
  EXPECT_THAT(error_of([] { parse_bind("/a"); }), StartsWith("--bind /a: expected SRC:DST"));
  EXPECT_THAT(error_of([] { parse_bind("/a:/b:ro:x"); }), HasSubstr("expected SRC:DST"));
  EXPECT_THAT(error_of([] { parse_bind("/a:/b:x"); }),
              StartsWith("--bind /a:/b:x: the third part must be 'ro' or 'rw'"));
  EXPECT_THAT(error_of([] { parse_bind("/a:/b:RO"); }), HasSubstr("third part"));
  EXPECT_THAT(error_of([] { parse_bind(":/b"); }), HasSubstr("empty path"));
  EXPECT_THAT(error_of([] { parse_bind("/a:"); }), HasSubstr("empty path"));
  EXPECT_THAT(error_of([] { parse_bind("/a:b"); }),
              StartsWith("--bind /a:b: the destination must be absolute"));
}

// --- parse_rlimit ------------------------------------------------------------------

TEST(ParseRlimit, SoftOnlySetsBoth) {
  runtime::Rlimit r = parse_rlimit("nofile=1024");
  EXPECT_EQ(r.resource, RLIMIT_NOFILE);
  EXPECT_EQ(r.soft, 1024u);
  EXPECT_EQ(r.hard, 1024u);
}

TEST(ParseRlimit, SoftAndHard) {
  runtime::Rlimit r = parse_rlimit("nofile=10:20");
  EXPECT_EQ(r.soft, 10u);
  EXPECT_EQ(r.hard, 20u);
  r = parse_rlimit("stack=8388608:unlimited");
  EXPECT_EQ(r.resource, RLIMIT_STACK);
  EXPECT_EQ(r.soft, 8388608u);
  EXPECT_EQ(r.hard, RLIM_INFINITY);
}

TEST(ParseRlimit, Unlimited) {
  runtime::Rlimit r = parse_rlimit("core=unlimited");
  EXPECT_EQ(r.resource, RLIMIT_CORE);
  EXPECT_EQ(r.soft, RLIM_INFINITY);
  EXPECT_EQ(r.hard, RLIM_INFINITY);
}

TEST(ParseRlimit, Errors) {
  EXPECT_THAT(error_of([] { parse_rlimit("bogus=1"); }),
              StartsWith("--rlimit bogus=1: unknown limit 'bogus' (one of: as, core,"));
  EXPECT_THAT(error_of([] { parse_rlimit("NOFILE=1"); }), HasSubstr("unknown limit"));
  EXPECT_THAT(error_of([] { parse_rlimit("nofile=20:10"); }),
              StartsWith("--rlimit nofile=20:10: the soft limit is above the hard one"));
  EXPECT_THAT(error_of([] { parse_rlimit("nofile"); }), HasSubstr("expected NAME=SOFT[:HARD]"));
  EXPECT_THAT(error_of([] { parse_rlimit("nofile=abc"); }),
              HasSubstr("'abc' is not a number or 'unlimited'"));
  EXPECT_THAT(error_of([] { parse_rlimit("nofile="); }), HasSubstr("is not a number"));
  EXPECT_THAT(error_of([] { parse_rlimit("nofile=10:"); }), HasSubstr("is not a number"));
  EXPECT_THAT(error_of([] { parse_rlimit("nofile=-1"); }), HasSubstr("is not a number"));
}

// Regression (fixed): the soft > hard check is skipped whenever soft is "unlimited"; setrlimit
// then fails with EINVAL inside the sandbox instead of a clear error here.
TEST(ParseRlimit, UnlimitedSoftAboveFiniteHardIsRefused) {
  EXPECT_THAT(error_of([] { parse_rlimit("nofile=unlimited:10"); }),
              HasSubstr("the soft limit is above the hard one"));
}

// --- env_entries -------------------------------------------------------------------
// (how entries merge: MergeEnv.* in container_spec_test.cc)

TEST(EnvEntries, PassesTheCallersValue) {
  ScopedEnv set("OPENSHELL_UNIT_PASS", "from caller");
  EXPECT_THAT(env_entries({"A=1", "OPENSHELL_UNIT_PASS", "B="}),
              ElementsAre("A=1", "OPENSHELL_UNIT_PASS=from caller", "B="));
  // Through the builder: the caller's value replaces an earlier one.
  RunOptions o;
  o.command = {"true"};
  o.env = {"OPENSHELL_UNIT_PASS=old", "OPENSHELL_UNIT_PASS"};
  runtime::ContainerSpec spec = build_spec(o);
  EXPECT_THAT(spec.env, Contains("OPENSHELL_UNIT_PASS=from caller"));
  EXPECT_THAT(spec.env, Not(Contains("OPENSHELL_UNIT_PASS=old")));
}

TEST(EnvEntries, SkipsAnUnsetVariable) {
  ScopedEnv unset("OPENSHELL_UNIT_UNSET", nullptr);
  EXPECT_THAT(env_entries({"A=1", "OPENSHELL_UNIT_UNSET"}), ElementsAre("A=1"));
}

TEST(EnvEntries, BadKeysThrow) {
  EXPECT_THAT(error_of([] { env_entries({"=x"}); }),
              StartsWith("--env =x: expected KEY=VALUE or KEY"));
  EXPECT_THAT(error_of([] { env_entries({""}); }), HasSubstr("expected KEY=VALUE"));
  EXPECT_THAT(error_of([] { env_entries({"A B=1"}); }), HasSubstr("expected KEY=VALUE"));
  EXPECT_THAT(error_of([] { env_entries({"A\tB"}); }), HasSubstr("expected KEY=VALUE"));
}

// --- build_spec --------------------------------------------------------------------

RunOptions with_command() {
  RunOptions o;
  o.command = {"true"};
  return o;
}

TEST(BuildSpec, Defaults) {
  runtime::ContainerSpec spec = build_spec(with_command());
  EXPECT_THAT(spec.argv, ElementsAre("true"));
  EXPECT_EQ(spec.fs.root, namespaces::RootKind::kHost);
  EXPECT_EQ(spec.fs.workdir, "/");
  EXPECT_EQ(spec.uid, runtime::kDefaultUid);
  EXPECT_EQ(spec.gid, runtime::kDefaultGid);
  EXPECT_EQ(spec.hostname, "sandbox");
  EXPECT_TRUE(spec.seccomp);
  EXPECT_EQ(spec.cap_add, 0u);
  EXPECT_EQ(spec.limits.pids, openshell::limits::kDefaultPids);  // the only limit by default
  EXPECT_FALSE(spec.limits.memory_bytes || spec.limits.cpus);
  EXPECT_FALSE(spec.landlock.enabled);  // no policy, no Landlock
  EXPECT_EQ(spec.cgroup_name, "openshell-run-" + std::to_string(::getpid()));
  EXPECT_THAT(spec.env, Contains(StartsWith("PATH=/usr/local/sbin:")));
  // HOME is the default user's home in the root's /etc/passwd (the host's
  // here), "/" when it is not listed.
  std::string home = "/";
  if (auto passwd = files::try_read("/etc/passwd"))
    for (const auto& line : text::split(*passwd, '\n')) {
      auto fields = text::split(line, ':');
      if (fields.size() >= 6 && fields[2] == "1000") {
        home = fields[5];
        break;
      }
    }
  EXPECT_THAT(spec.env, Contains("HOME=" + home));
  EXPECT_THAT(spec.env, Contains("HOSTNAME=sandbox"));
}

TEST(BuildSpec, NoCommandThrows) {
  EXPECT_THAT(error_of([] { build_spec(RunOptions{}); }), StartsWith("run: no command given"));
}

TEST(BuildSpec, Memory) {
  RunOptions o = with_command();
  o.memory = "64Q";
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--memory 64Q: not a size"));
  o.memory = "1M";
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--memory 1M: below the minimum of 4M"));
  o.memory = "4M";
  EXPECT_EQ(build_spec(o).limits.memory_bytes, 4u << 20);
  o.memory = "1.5G";
  EXPECT_EQ(build_spec(o).limits.memory_bytes, 3ull << 29);
}

TEST(BuildSpec, TmpfsSizes) {
  RunOptions o = with_command();
  const uint64_t total = openshell::limits::memory_total();
  ASSERT_GT(total, 0u);
  EXPECT_EQ(build_spec(o).fs.tmp_size, openshell::limits::default_tmp_size(std::nullopt, total));
  EXPECT_EQ(build_spec(o).fs.shm_size, openshell::limits::default_shm_size(std::nullopt, total));
  o.memory = "64M";
  EXPECT_EQ(build_spec(o).fs.tmp_size, 64u << 20);
  EXPECT_EQ(build_spec(o).fs.shm_size, 32u << 20);
  o.tmp_size = "8M";
  o.shm_size = "2M";
  EXPECT_EQ(build_spec(o).fs.tmp_size, 8u << 20);
  EXPECT_EQ(build_spec(o).fs.shm_size, 2u << 20);
  o.tmp_size = "512k";
  EXPECT_THAT(error_of([&] { build_spec(o); }),
              StartsWith("--tmp-size 512k: below the minimum of 1M"));
  o.tmp_size = "lots";
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--tmp-size lots: not a size"));
}

TEST(BuildSpec, Pids) {
  RunOptions o = with_command();
  EXPECT_EQ(build_spec(o).limits.pids, openshell::limits::kDefaultPids);
  o.pids = "0";
  EXPECT_FALSE(build_spec(o).limits.pids);
  o.pids = "x";
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--pids x: not a number of processes"));
  o.pids = "-5";
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--pids -5:"));
  o.pids = "4194305";
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--pids 4194305:"));
  o.pids = "64";
  EXPECT_EQ(build_spec(o).limits.pids, 64u);
}

TEST(BuildSpec, Cpus) {
  RunOptions o = with_command();
  for (const char* bad : {"abc", "0", "-1", "5000"}) {
    o.cpus = bad;
    EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--cpus " + std::string(bad) + ":"));
  }
  o.cpus = "1.5";
  EXPECT_EQ(build_spec(o).limits.cpus, 1.5);
}

TEST(BuildSpec, Hostname) {
  RunOptions o = with_command();
  o.hostname = "Bad_Name";
  EXPECT_THAT(error_of([&] { build_spec(o); }),
              StartsWith("--hostname Bad_Name: must be a DNS label"));
  o.hostname = "box-1";
  runtime::ContainerSpec spec = build_spec(o);
  EXPECT_EQ(spec.hostname, "box-1");
  EXPECT_THAT(spec.env, Contains("HOSTNAME=box-1"));
}

TEST(BuildSpec, Seccomp) {
  RunOptions o = with_command();
  o.seccomp = "bogus";
  EXPECT_THAT(error_of([&] { build_spec(o); }),
              StartsWith("--seccomp bogus: expected 'default' or 'unconfined'"));
  o.seccomp = "unconfined";
  EXPECT_FALSE(build_spec(o).seccomp);
  o.seccomp = "default";
  EXPECT_TRUE(build_spec(o).seccomp);
}

TEST(BuildSpec, CoreDumpsOffUnlessGiven) {
  RunOptions o = with_command();
  runtime::ContainerSpec spec = build_spec(o);
  ASSERT_EQ(spec.rlimits.size(), 1u);
  EXPECT_EQ(spec.rlimits[0].resource, RLIMIT_CORE);
  EXPECT_EQ(spec.rlimits[0].soft, 0u);
  EXPECT_EQ(spec.rlimits[0].hard, 0u);

  o.rlimits = {"nofile=64"};
  spec = build_spec(o);
  ASSERT_EQ(spec.rlimits.size(), 2u);
  EXPECT_EQ(spec.rlimits[0].resource, RLIMIT_CORE);
  EXPECT_EQ(spec.rlimits[1].resource, RLIMIT_NOFILE);

  o.rlimits = {"core=100"};
  spec = build_spec(o);
  ASSERT_EQ(spec.rlimits.size(), 1u);
  EXPECT_EQ(spec.rlimits[0].resource, RLIMIT_CORE);
  EXPECT_EQ(spec.rlimits[0].soft, 100u);

  o.rlimits = {"nofile=bad"};
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--rlimit nofile=bad"));
}

TEST(BuildSpec, EnvironmentNeverHoldsTheCallers) {
  ScopedEnv secret("OPENSHELL_UNIT_SECRET", "hunter2");
  ScopedEnv home("HOME", "/home/caller");
  RunOptions o = with_command();
  runtime::ContainerSpec spec = build_spec(o);
  for (const auto& entry : spec.env) {
    EXPECT_THAT(entry, Not(HasSubstr("OPENSHELL_UNIT_SECRET"))) << entry;
    EXPECT_THAT(entry, Not(HasSubstr("hunter2"))) << entry;
    EXPECT_NE(entry, "HOME=/home/caller");
  }
  EXPECT_EQ(spec.env.size(), 3u);  // PATH, HOME, HOSTNAME

  // Unless asked for by name.
  o.env = {"OPENSHELL_UNIT_SECRET", "EXTRA=1"};
  spec = build_spec(o);
  EXPECT_THAT(spec.env, Contains("OPENSHELL_UNIT_SECRET=hunter2"));
  EXPECT_THAT(spec.env, Contains("EXTRA=1"));
}

TEST(BuildSpec, TtyAddsTerm) {
  ScopedEnv term("TERM", "vt100");
  RunOptions o = with_command();
  o.tty = true;
  runtime::ContainerSpec spec = build_spec(o);
  EXPECT_TRUE(spec.tty);
  EXPECT_THAT(spec.env, Contains("TERM=vt100"));
}

TEST(BuildSpec, UserResolvedInTheRootfs) {
  TempDir rootfs;
  write_file(rootfs / "etc/passwd", "sandbox:x:1234:1235::/home/sb:/bin/sh\n");
  write_file(rootfs / "etc/group", "staff:x:50:\n");
  RunOptions o = with_command();
  o.rootfs = rootfs.path();
  o.user = "sandbox";
  runtime::ContainerSpec spec = build_spec(o);
  EXPECT_EQ(spec.fs.root, namespaces::RootKind::kDirectory);
  EXPECT_EQ(spec.fs.rootfs, rootfs.path());
  EXPECT_EQ(spec.uid, 1234u);
  EXPECT_EQ(spec.gid, 1235u);
  EXPECT_THAT(spec.env, Contains("HOME=/home/sb"));

  o.user = "sandbox:staff";
  EXPECT_EQ(build_spec(o).gid, 50u);
  o.user = "nosuch";
  EXPECT_THAT(error_of([&] { build_spec(o); }),
              HasSubstr("no such user in " + rootfs.path() + "/etc/passwd"));
}

TEST(BuildSpec, PolicyRunAsUserUnlessUserGiven) {
  TempDir tmp;
  write_file(tmp / "rootfs/etc/passwd",
             "sandbox:x:1234:1235::/home/sb:/bin/sh\nother:x:2000:2000::/o:/bin/sh\n");
  write_file(tmp / "rootfs/etc/group", "staff:x:50:\n");
  write_file(tmp / "policy.toml",
             "version = 1\n[process]\nrun_as_user = \"sandbox\"\nrun_as_group = \"staff\"\n");
  RunOptions o = with_command();
  o.rootfs = tmp / "rootfs";
  o.policy = tmp / "policy.toml";
  runtime::ContainerSpec spec = build_spec(o);
  EXPECT_EQ(spec.uid, 1234u);
  EXPECT_EQ(spec.gid, 50u);
  o.user = "other";
  spec = build_spec(o);
  EXPECT_EQ(spec.uid, 2000u);
  EXPECT_EQ(spec.gid, 2000u);
}

// Without a filesystem policy no Landlock rule keeps /proc/PID/mem from
// being written: /proc is mounted read-only instead.
TEST(BuildSpec, ProcIsReadOnlyWithoutAFilesystemPolicy) {
  TempDir tmp;
  RunOptions o = with_command();
  EXPECT_TRUE(build_spec(o).fs.proc_read_only);
  write_file(tmp / "net.toml",
             "version = 1\n[network_policies.x]\nendpoints = [ { host = \"a.example.com\", port = "
             "443 } ]\n");
  o.policy = tmp / "net.toml";
  EXPECT_TRUE(build_spec(o).fs.proc_read_only);
  write_file(tmp / "fs.toml",
             "version = 1\n[filesystem_policy]\nread_only = [\"/usr\", \"/proc\"]\n");
  o.policy = tmp / "fs.toml";
  EXPECT_FALSE(build_spec(o).fs.proc_read_only);  // Landlock decides
}

TEST(BuildSpec, BadPolicyFileThrows) {
  TempDir tmp;
  RunOptions o = with_command();
  o.policy = tmp / "absent.toml";
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("policy " + (tmp / "absent.toml")));
}

TEST(BuildSpec, PolicyFilesystemBecomesLandlockRules) {
  if (runtime::landlock::abi_version() == 0) GTEST_SKIP() << "Landlock is not available";
  TempDir tmp;
  write_file(tmp / "policy.toml",
             "version = 1\n[filesystem_policy]\ninclude_workdir = true\nread_only = [\"/usr\"]\n"
             "read_write = [\"/tmp\"]\n");
  RunOptions o = with_command();
  o.policy = tmp / "policy.toml";
  o.workdir = "/work";
  runtime::ContainerSpec spec = build_spec(o);
  EXPECT_TRUE(spec.landlock.enabled);
  ASSERT_EQ(spec.landlock.rules.size(), 3u);
  EXPECT_EQ(spec.landlock.rules[0].path, "/usr");
  EXPECT_EQ(spec.landlock.rules[0].access, runtime::landlock::read_only_rights());
  EXPECT_EQ(spec.landlock.rules[1].path, "/tmp");
  EXPECT_EQ(spec.landlock.rules[2].path, "/work");
}

// Regression (fixed): without --workdir the workdir is "/", and include_workdir (true by
// default) then adds a read-write Landlock rule for "/": everything becomes
// writable and read_only means nothing. The policy parser refuses "/" in
// read_write for exactly this reason.
TEST(BuildSpec, DefaultWorkdirDoesNotMakeRootWritable) {
  TempDir tmp;
  write_file(tmp / "policy.toml",
             "version = 1\n[filesystem_policy]\nread_only = [\"/usr\"]\nread_write = [\"/tmp\"]\n");
  RunOptions o = with_command();
  o.policy = tmp / "policy.toml";
  runtime::ContainerSpec spec = build_spec(o);
  ASSERT_TRUE(spec.landlock.enabled);
  ASSERT_THAT(spec.landlock.rules,
              Contains(::testing::Field(&runtime::landlock::Rule::path, "/usr")));
  for (const auto& rule : spec.landlock.rules)
    EXPECT_FALSE(rule.path == "/" && (rule.access & ~runtime::landlock::read_only_rights()))
        << "read-write rule for /";
}

// Regression (fixed): the policy refuses run_as_user "root" and "0", but "00" resolves to
// uid 0 all the same.
TEST(BuildSpec, PolicyCannotRunAsRoot) {
  TempDir tmp;
  write_file(tmp / "policy.toml", "version = 1\n[process]\nrun_as_user = \"00\"\n");
  RunOptions o = with_command();
  o.policy = tmp / "policy.toml";
  EXPECT_EQ(
      error_of([&] { build_spec(o); }),
      o.policy + ":3: process.run_as_user: must not be root (unless process.allow_root = true)");
}

TEST(BuildSpec, PolicyCannotRunAsARootAlias) {
  // Names whose ids are 0 in the sandbox's files are root too.
  TempDir tmp;
  ::mkdir((tmp / "etc").c_str(), 0755);
  write_file(tmp / "etc/passwd",
             "toor:x:0:0::/root:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\n");
  write_file(tmp / "etc/group", "wheel:x:0:\nsandbox:x:1000:\n");
  write_file(tmp / "user.toml", "version = 1\n[process]\nrun_as_user = \"toor\"\n");
  write_file(tmp / "group.toml",
             "version = 1\n[process]\nrun_as_user = \"sandbox\"\nrun_as_group = \"wheel\"\n");
  RunOptions o = with_command();
  o.rootfs = tmp.path();
  o.policy = tmp / "user.toml";
  EXPECT_THAT(error_of([&] { build_spec(o); }), HasSubstr("run_as_user: toor is root"));
  o.policy = tmp / "group.toml";
  EXPECT_THAT(error_of([&] { build_spec(o); }), HasSubstr("run_as_group: wheel is root's group"));
}

TEST(BuildSpec, CapAddAndBinds) {
  RunOptions o = with_command();
  o.cap_add = {"NET_ADMIN"};
  o.binds = {"/src:/dst:ro"};
  runtime::ContainerSpec spec = build_spec(o);
  EXPECT_EQ(spec.cap_add, uint64_t{1} << 12);
  ASSERT_EQ(spec.fs.binds.size(), 1u);
  EXPECT_EQ(spec.fs.binds[0].target, "/dst");
  EXPECT_TRUE(spec.fs.binds[0].read_only);

  o.cap_add = {"NOT_A_CAP"};
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--cap-add NOT_A_CAP"));
  o.cap_add = {};
  o.binds = {"nodest"};
  EXPECT_THAT(error_of([&] { build_spec(o); }), StartsWith("--bind nodest"));
}

// --- --vm ---------------------------------------------------------------------------

TEST(PlanVm, FlagsThenThePolicysVmThenTheDefaults) {
  TempDir dir;
  write_file(dir / "vmlinux", "a kernel");
  const std::string kernel = dir / "vmlinux";
  ScopedEnv no_variable("OPENSHELL_VM_KERNEL", nullptr);
  SandboxVm vm = plan_vm("--cpu", "", "", "", "", kernel, true);
  EXPECT_EQ(vm.vcpus, 1u);
  EXPECT_EQ(vm.memory_mib, 512u);
  EXPECT_EQ(vm.kernel, kernel);
  const std::string policy = "version = 1\n[vm]\nvcpus = 3\nmemory = \"2G\"\n";
  vm = plan_vm("--cpu", "", "", policy, "p.toml", kernel, true);
  EXPECT_EQ(vm.vcpus, 3u);
  EXPECT_EQ(vm.memory_mib, 2048u);
  // --cpu and --memory win over the policy, rounded up.
  vm = plan_vm("--cpu", "1.5", "100000000", policy, "p.toml", kernel, true);
  EXPECT_EQ(vm.vcpus, 2u);
  EXPECT_EQ(vm.memory_mib, 96u);  // 95.4 MiB
  EXPECT_EQ(plan_vm("--cpu", "500m", "1G", "", "", kernel, true).vcpus, 1u);
  EXPECT_EQ(plan_vm("--cpu", "500m", "1G", "", "", kernel, true).memory_mib, 1024u);
}

TEST(PlanVm, RefusalsNameTheOption) {
  TempDir dir;
  write_file(dir / "vmlinux", "a kernel");
  const std::string kernel = dir / "vmlinux";
  EXPECT_THAT(error_of([&] { plan_vm("--cpu", "65", "", "", "", kernel, true); }),
              StartsWith("--cpu 65: a VM has at most 64 vCPUs"));
  EXPECT_THAT(error_of([&] { plan_vm("--cpus", "x", "", "", "", kernel, true); }),
              StartsWith("--cpus x: not a number of CPUs"));
  EXPECT_THAT(error_of([&] { plan_vm("--cpu", "", "32M", "", "", kernel, true); }),
              StartsWith("--memory 32M: a VM's memory is between 64M and 64G"));
  EXPECT_THAT(error_of([&] { plan_vm("--cpu", "", "65G", "", "", kernel, true); }),
              StartsWith("--memory 65G"));
  EXPECT_THAT(error_of([&] {
                plan_vm("--cpu", "", "", "version = 1\n[vm]\nx = 1\n", "p.toml", kernel, true);
              }),
              StartsWith("p.toml:3: vm.x: unknown field"));
}

TEST(PlanVm, TheKernelFromTheFlagTheVariableOrTheDefault) {
  TempDir dir;
  write_file(dir / "vmlinux", "a kernel");
  write_file(dir / "other", "another");
  {
    ScopedEnv variable("OPENSHELL_VM_KERNEL", (dir / "other").c_str());
    EXPECT_EQ(plan_vm("--cpu", "", "", "", "", "", true).kernel, dir / "other");
    EXPECT_EQ(plan_vm("--cpu", "", "", "", "", dir / "vmlinux", true).kernel, dir / "vmlinux");
  }
  {
    // Relative to the working directory, made absolute.
    ScopedEnv no_variable("OPENSHELL_VM_KERNEL", nullptr);
    const std::string cwd = files::canonical(".", "cwd");
    ASSERT_EQ(::chdir(dir.path().c_str()), 0);
    const std::string resolved = plan_vm("--cpu", "", "", "", "", "vmlinux", true).kernel;
    ASSERT_EQ(::chdir(cwd.c_str()), 0);
    EXPECT_EQ(resolved, files::canonical(dir / "vmlinux", "kernel"));
    EXPECT_THAT(error_of([&] { plan_vm("--cpu", "", "", "", "", dir / "none", true); }),
                StartsWith("--vm-kernel " + (dir / "none") + ": No such file or directory"));
    if (!files::exists(vm_host::kPackagedKernel)) {
      EXPECT_EQ(error_of([] { plan_vm("--cpu", "", "", "", "", "", true); }),
                "--vm: no guest kernel (give --vm-kernel PATH or set OPENSHELL_VM_KERNEL; "
                "rootfs-tools/build-guest-kernel builds one)");
    }
    // For a remote gateway the path is its host's: kept as given, or left to it.
    EXPECT_EQ(plan_vm("--cpu", "", "", "", "", "/there/vmlinux", false).kernel, "/there/vmlinux");
    EXPECT_EQ(plan_vm("--cpu", "", "", "", "", "", false).kernel, "");
    EXPECT_THAT(error_of([] { plan_vm("--cpu", "", "", "", "", "vmlinux", false); }),
                HasSubstr("absolute path there"));
  }
}

TEST(PlanRun, VmFillsTheSpecsVmNotItsLimits) {
  TempDir dir;
  write_file(dir / "vmlinux", "a kernel");
  RunOptions o = with_command();
  o.vm = true;
  o.vm_kernel = dir / "vmlinux";
  o.memory = "256M";
  o.cpus = "2";
  RunPlan plan = plan_run(o);
  ASSERT_TRUE(plan.sandbox.vm);
  EXPECT_EQ(plan.sandbox.vm->vcpus, 2u);
  EXPECT_EQ(plan.sandbox.vm->memory_mib, 256u);
  EXPECT_FALSE(plan.sandbox.memory_bytes);
  EXPECT_FALSE(plan.sandbox.cpus);
  // The host's root is no guest's disk.
  EXPECT_EQ(error_of([&] { plan.sandbox.validate(); }),
            "--vm needs an image: the host's root cannot be a guest's disk");
  o.vm = false;
  EXPECT_EQ(error_of([&] { plan_run(o); }), "--vm-kernel: only with --vm");
  o.vm_kernel.clear();
  EXPECT_FALSE(plan_run(o).sandbox.vm);
  EXPECT_TRUE(plan_run(o).sandbox.memory_bytes);
}

// What a micro-VM cannot honour is refused in one line naming the option,
// never dropped.
TEST(PlanRun, VmRefusesWhatAGuestCannotHonour) {
  TempDir dir;
  write_file(dir / "vmlinux", "a kernel");
  auto refusal = [&](auto change) {
    RunOptions o = with_command();
    o.vm = true;
    o.vm_kernel = dir / "vmlinux";
    change(o);
    return error_of([&] { plan_run(o); });
  };
  EXPECT_EQ(refusal([](RunOptions& o) { o.binds = {"/etc:/e"}; }),
            "--bind /etc:/e: not with --vm (a micro-VM sees only its disks)");
  EXPECT_EQ(refusal([](RunOptions& o) { o.tty = true; }),
            "--tty: not with --vm (the main process runs on the guest's console; exec -t has a "
            "terminal)");
  EXPECT_EQ(refusal([](RunOptions& o) { o.read_only = true; }),
            "--read-only: not with --vm (a micro-VM's root is its own disk)");
  EXPECT_EQ(refusal([](RunOptions& o) { o.cap_add = {"NET_ADMIN"}; }),
            "--cap-add: not with --vm (the guest's processes keep no capabilities)");
  EXPECT_EQ(refusal([](RunOptions& o) { o.seccomp = "unconfined"; }),
            "--seccomp unconfined: not with --vm (the guest's filter is fixed)");
  EXPECT_EQ(refusal([](RunOptions& o) { o.rlimits = {"nofile=10"}; }),
            "--rlimit: not with --vm (not in the guest yet)");
  EXPECT_EQ(refusal([](RunOptions& o) { o.network_log = "/tmp/x"; }),
            "--network-log: not with --vm (not for a micro-VM yet)");
}

}  // namespace
}  // namespace openshell::cli
