// Limits: memory, processes and CPU through cgroups (v2 where the unified
// hierarchy has the controller, v1 otherwise); rootless without a writable
// cgroup, the sandbox runs and says which limit is not enforced.
#include <unistd.h>

#include <sstream>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;

namespace e2e {
namespace {

class Limits : public ModeTest {
 protected:
  // Whether this mode can write cgroups here (root can; the test users not).
  bool enforced(const Result& r) const { return r.err.find("NOT enforced") == std::string::npos; }
};
E2E_ALL_MODES(Limits);

TEST_P(Limits, MemoryLimitKillsWhatGrowsPastIt) {
  Result r = sandbox(mode(), {"--memory", "64M"}, {"osh-probe", "alloc", "200"});
  if (!enforced(r)) {
    ASSERT_TRUE(is_rootless(mode())) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--memory"));
    EXPECT_EQ(r.status, 0) << "without a cgroup the sandbox still runs";
    GTEST_SKIP() << "memory limit not enforceable for this user here: " << r.err;
  }
  EXPECT_EQ(r.status, 137) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("ran out of memory"));
  // Under the limit, the same program is fine.
  Result small = sandbox(mode(), {"--memory", "64M"}, {"osh-probe", "alloc", "16"});
  EXPECT_EQ(small.status, 0) << small.out << small.err;
}

TEST_P(Limits, PidsLimitStopsForks) {
  // Rootless without a cgroup, RLIMIT_NPROC in the sandbox's own user
  // namespace holds it: enforced in every mode.
  Result r = sandbox(mode(), {"--pids", "5"}, {"osh-probe", "fork", "20"});
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("denied: EAGAIN"));
  // init + probe + at most 3 children.
  EXPECT_THAT(r.out, testing::AnyOf(HasSubstr("forked 3\n"), HasSubstr("forked 2\n")));
}

TEST_P(Limits, CpuQuotaSlowsASpinner) {
  // 0.2 CPUs for one wall-clock second: about 200 ms of CPU time.
  Result r = sandbox(mode(), {"--cpus", "0.2"}, {"osh-probe", "spin", "1000"});
  if (!enforced(r)) {
    ASSERT_TRUE(is_rootless(mode())) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--cpus"));
    GTEST_SKIP() << "cpu limit not enforceable for this user here: " << r.err;
  }
  ASSERT_EQ(r.status, 0) << r.err;
  auto pos = r.out.find("cpu_ms ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  int cpu_ms = std::stoi(r.out.substr(pos + 7));
  // Generous both ways for a loaded 2-core machine: below 600 ms the quota
  // holds; above 20 ms the spinner ran at all (a quota of nothing, or a
  // sandbox that never ran the program, would show 0).
  EXPECT_LT(cpu_ms, 600) << "a 0.2-CPU quota let the spinner use " << cpu_ms << " ms in 1 s";
  EXPECT_GT(cpu_ms, 20) << "a 0.2-CPU quota left the spinner " << cpu_ms << " ms in 1 s";
}

TEST_P(Limits, RootlessSaysWhichLimitIsNotEnforced) {
  Result r = sandbox(mode(), {"--memory", "128M", "--pids", "100"}, {"echo", "ran"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ran\n");
  if (!enforced(r)) {
    // Only where this user has no cgroup to write: root always has one.
    ASSERT_TRUE(is_rootless(mode())) << r.err;
    EXPECT_THAT(r.err, HasSubstr("warning: --memory"));
    // RLIMIT_NPROC holds the pids limit instead: one warning, for --memory.
    EXPECT_THAT(r.err, testing::Not(HasSubstr("--pids")));
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  } else {
    EXPECT_EQ(r.err, "");
    // In silence means enforced: the same limit stops what grows past it.
    Result big =
        sandbox(mode(), {"--memory", "128M", "--pids", "100"}, {"osh-probe", "alloc", "400"});
    EXPECT_EQ(big.status, 137) << big.out << big.err;
  }
}

TEST_P(Limits, CgroupsAreRemovedAfterFailures) {
  // A failing command and a bad bind after the cgroups exist: the fixture
  // checks that no openshell-* cgroup remains.
  EXPECT_EQ(sandbox(mode(), {"--memory", "64M", "--pids", "50"}, {"/no/such"}).status, 127);
  EXPECT_EQ(sandbox(mode(), {"--memory", "64M", "--workdir", "/proc/nope/x"}, {"true"}).status,
            125);
}

// The host's RAM in bytes, from /proc/meminfo.
uint64_t ram_bytes() {
  std::string info = file_contents("/proc/meminfo");
  auto pos = info.find("MemTotal:");
  return pos == std::string::npos ? 0 : std::stoull(info.substr(pos + 9)) * 1024;
}

// The options of the mount at `target` in /proc/mounts text.
std::string mount_options(const std::string& mounts, const std::string& target) {
  std::istringstream in(mounts);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string source, where, type, options;
    fields >> source >> where >> type >> options;
    if (where == target) return options;
  }
  return "";
}

// A fork bomb in a sandbox given no limits stops at the default of 4096
// processes: enforced by the pids cgroup as root, and by RLIMIT_NPROC in
// the sandbox's own user namespace where no cgroup is writable (rootless).
TEST_P(Limits, DefaultPidsLimitStopsAForkBomb) {
  Options slow;
  slow.timeout_s = 120;
  Result r = sandbox(mode(), {}, {"osh-probe", "fork", "6000"}, slow);
  ASSERT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_EQ(r.err, "") << "the default limit is enforced, in silence";
  EXPECT_THAT(r.out, HasSubstr("denied: EAGAIN"));
  auto pos = r.out.find("forked ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  int forked = std::stoi(r.out.substr(pos + 7));
  // 4096 counting the sandbox's init and the probe.
  EXPECT_GE(forked, 4000);
  EXPECT_LE(forked, 4094);
  // --pids 0 lifts it.
  Result free = sandbox(mode(), {"--pids", "0"}, {"osh-probe", "fork", "4200"}, slow);
  EXPECT_EQ(free.status, 0) << free.out << free.err;
  EXPECT_THAT(free.out, HasSubstr("forked 4200"));
}

// /tmp and /dev/shm hold no more than their size: writing past it fails
// with ENOSPC, and so does making more files than their inodes.
TEST_P(Limits, TmpAndShmFillUpAtTheirSize) {
  Result r = sandbox(
      mode(), {"--tmp-size", "4M", "--shm-size", "2M"},
      {"sh", "-c",
       "dd if=/dev/zero of=/tmp/big bs=1M count=16 2>&1 | grep -o 'No space left on device'; "
       "dd if=/dev/zero of=/dev/shm/big bs=1M count=16 2>&1 | grep -o 'No space left on device'; "
       "ls -l /dev/shm/big /tmp/big | awk '{print $5}'; "
       "rm /tmp/big; i=0; while [ $i -lt 5000 ]; do { echo -n > /tmp/f$i; } 2>/dev/null || break; "
       "i=$((i+1)); done; echo files $i"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(r.out, "No space left on device\nNo space left on device\n" + std::to_string(2 << 20) +
                       "\n" + std::to_string(4 << 20) + "\nfiles 4095\n");
}

// A run's throw-away writable layer is in memory as well: bounded by
// --tmp-size like /tmp.
TEST_P(Limits, ThrowAwayRootLayerFillsUpAtTheTmpSize) {
  // Root inside may write /, whoever owns the directory on the host.
  Result r =
      sandbox(mode(), {"--tmp-size", "4M", "--user", "0"},
              {"sh", "-c",
               "dd if=/dev/zero of=/big bs=1M count=16 2>&1 | grep -o 'No space left on device'; "
               "ls -l /big | awk '{print $5}'"});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("No space left on device\n"));
  ASSERT_NE(r.out.find('\n'), std::string::npos);
  EXPECT_LE(std::stoull(r.out.substr(r.out.find('\n') + 1)), 4ull << 20);
}

// With no flags, the sizes are the documented defaults: /tmp a tenth of
// the RAM, /dev/shm half of that (whole MiB), one inode per 16 KiB; with
// --memory, /tmp is the memory limit.
TEST_P(Limits, DefaultTmpfsSizesAreTheDocumentedOnes) {
  const uint64_t mib = 1 << 20;
  const uint64_t tmp = ram_bytes() / 10 / mib * mib, shm = tmp / 2 / mib * mib;
  Result r = sandbox(mode(), {}, {"cat", "/proc/mounts"});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(mount_options(r.out, "/tmp"),
              HasSubstr("size=" + std::to_string(tmp / 1024) +
                        "k,nr_inodes=" + std::to_string(tmp / (16 << 10)) + ","));
  EXPECT_THAT(mount_options(r.out, "/dev/shm"),
              HasSubstr("size=" + std::to_string(shm / 1024) +
                        "k,nr_inodes=" + std::to_string(shm / (16 << 10)) + ","));
  Result limited = sandbox(mode(), {"--memory", "256M"}, {"cat", "/proc/mounts"});
  ASSERT_EQ(limited.status, 0) << limited.err;
  EXPECT_THAT(mount_options(limited.out, "/tmp"), HasSubstr("size=262144k,nr_inodes=16384,"));
  EXPECT_THAT(mount_options(limited.out, "/dev/shm"), HasSubstr("size=131072k,nr_inodes=8192,"));
}

TEST_P(Limits, BadSizesAreRefused) {
  Result r = sandbox(mode(), {"--tmp-size", "100k"}, {"true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("--tmp-size 100k: below the minimum of 1M"));
  r = sandbox(mode(), {"--shm-size", "much"}, {"true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("--shm-size much: not a size"));
}

// The gateway's sandboxes: the defaults are fixed at create and shown by
// `sandbox get`; the gateway's gateway.toml changes them.
class GatewayLimits : public GatewayTest {
 protected:
  GatewayLimits() : GatewayTest("limits-home", /*check_sandbox_files=*/false) {}
};
E2E_ALL_MODES(GatewayLimits);

TEST_P(GatewayLimits, SandboxGetShowsTheDefaults) {
  const uint64_t mib = 1 << 20;
  const uint64_t tmp = ram_bytes() / 10 / mib * mib;
  ASSERT_EQ(os({"sandbox", "create", "--name", "plain", "--from", rootfs()}).status, 0);
  Result get = os({"sandbox", "get", "plain", "-o", "json"});
  ASSERT_EQ(get.status, 0) << get.err;
  EXPECT_THAT(get.out, HasSubstr("\"pids\": 4096"));
  EXPECT_THAT(get.out, HasSubstr("\"tmp_size_bytes\": " + std::to_string(tmp)));
  EXPECT_THAT(get.out, HasSubstr("\"shm_size_bytes\": " + std::to_string(tmp / 2 / mib * mib)));
  Result table = os({"sandbox", "get", "plain"});
  EXPECT_THAT(table.out, HasSubstr("Limits:"));
  EXPECT_THAT(table.out, HasSubstr("pids=4096"));
  // What the sandbox sees is what get says.
  Result mounts = os({"sandbox", "exec", "plain", "--", "cat", "/proc/mounts"});
  EXPECT_THAT(mount_options(mounts.out, "/tmp"),
              HasSubstr("size=" + std::to_string(tmp / 1024) + "k"));

  ASSERT_EQ(os({"sandbox", "create", "--name", "own", "--from", rootfs(), "--pids", "77",
                "--memory", "64M", "--shm-size", "3M"})
                .status,
            0);
  get = os({"sandbox", "get", "own", "-o", "json"});
  EXPECT_THAT(get.out, HasSubstr("\"pids\": 77"));
  EXPECT_THAT(get.out, HasSubstr("\"tmp_size_bytes\": " + std::to_string(64 * mib)));
  EXPECT_THAT(get.out, HasSubstr("\"shm_size_bytes\": " + std::to_string(3 * mib)));
}

TEST_P(GatewayLimits, GatewayConfigurationSetsTheDefaults) {
  write_file(home_ + "/gateway.toml",
             "[sandbox_defaults]\npids = 40\ntmp_size = \"5M\"\nshm_size = \"2M\"\n");
  // Its main process: a fork bomb, stopped at the gateway's default.
  Result r = os({"sandbox", "create", "--name", "bomb", "--from", rootfs(), "--", "osh-probe",
                 "fork", "500"});
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("denied: EAGAIN"));
  auto pos = r.out.find("forked ");
  ASSERT_NE(pos, std::string::npos) << r.out;
  // 40 counting the sandbox's init and the probe; a few forks at least.
  EXPECT_LE(std::stoi(r.out.substr(pos + 7)), 38);
  EXPECT_GE(std::stoi(r.out.substr(pos + 7)), 30);
  Result get = os({"sandbox", "get", "bomb", "-o", "json"});
  EXPECT_THAT(get.out, HasSubstr("\"pids\": 40"));
  EXPECT_THAT(get.out, HasSubstr("\"tmp_size_bytes\": " + std::to_string(5 << 20)));
  EXPECT_THAT(get.out, HasSubstr("\"shm_size_bytes\": " + std::to_string(2 << 20)));
  // A bad configuration: one line naming the file, line and key.
  write_file(home_ + "/gateway.toml", "[sandbox_defaults]\npids = \"many\"\n");
  Result bad = os({"sandbox", "create", "--name", "bad", "--from", rootfs()});
  EXPECT_EQ(bad.status, 125) << bad.err;
  EXPECT_THAT(bad.err, HasSubstr(home_ + "/gateway.toml:2: sandbox_defaults.pids: not a number"));
  EXPECT_EQ(std::count(bad.err.begin(), bad.err.end(), '\n'), 1) << bad.err;
}

}  // namespace
}  // namespace e2e
