// Limits: memory, processes and CPU through cgroups (v2 where the unified
// hierarchy has the controller, v1 otherwise); rootless without a writable
// cgroup, the sandbox runs and says which limit is not enforced.
#include <unistd.h>

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
  Result r = sandbox(mode(), {"--pids", "5"}, {"osh-probe", "fork", "20"});
  if (!enforced(r)) {
    ASSERT_TRUE(is_rootless(mode())) << r.err;
    EXPECT_THAT(r.err, HasSubstr("--pids"));
    EXPECT_EQ(r.status, 0);
    GTEST_SKIP() << "pids limit not enforceable for this user here: " << r.err;
  }
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
  EXPECT_LT(cpu_ms, 600) << "a 0.2-CPU quota let the spinner use " << cpu_ms << " ms in 1 s";
}

TEST_P(Limits, RootlessSaysWhichLimitIsNotEnforced) {
  Result r = sandbox(mode(), {"--memory", "128M", "--pids", "100"}, {"echo", "ran"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "ran\n");
  if (is_rootless(mode()) && !enforced(r)) {
    EXPECT_THAT(r.err, HasSubstr("warning: --memory"));
    EXPECT_THAT(r.err, HasSubstr("warning: --pids"));
  } else {
    EXPECT_EQ(r.err, "");
  }
}

TEST_P(Limits, CgroupsAreRemovedAfterFailures) {
  // A failing command and a bad bind after the cgroups exist: the fixture
  // checks that no openshell-* cgroup remains.
  EXPECT_EQ(sandbox(mode(), {"--memory", "64M", "--pids", "50"}, {"/no/such"}).status, 127);
  EXPECT_EQ(sandbox(mode(), {"--memory", "64M", "--workdir", "/proc/nope/x"}, {"true"}).status, 125);
}

}  // namespace
}  // namespace e2e
