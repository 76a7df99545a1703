#include "runtime/cgroup.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "runtime/cleanup.h"
#include "test_util.h"

namespace openshell::runtime {
namespace {

using openshell::testing::path_exists;
using openshell::testing::read_file;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

std::vector<std::string> keys(const CgroupLayout& layout) {
  std::vector<std::string> out;
  for (const auto& [name, h] : layout.controllers) out.push_back(name);
  return out;
}

// --- CgroupLayout::parse -------------------------------------------------------

// This machine: v1 controllers each at /sys/fs/cgroup/<c>, the memory cgroup
// nested, and an (almost empty) cgroup2 at /sys/fs/cgroup/unified.
constexpr const char* kHybridCgroup =
    "9:name=systemd:/\n"
    "8:pids:/\n"
    "7:blkio:/\n"
    "6:freezer:/\n"
    "5:devices:/\n"
    "4:memory:/process_api/abc\n"
    "3:cpuset:/\n"
    "2:cpuacct:/\n"
    "1:cpu:/\n"
    "0::/\n";

constexpr const char* kHybridMountinfo =
    "22 1 0:20 / / rw,relatime - overlay overlay rw,lowerdir=/l,upperdir=/u,workdir=/w\n"
    "23 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n"
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
    "36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices\n"
    "37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer\n"
    "38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio\n"
    "39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids\n"
    "40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n"
    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(CgroupLayoutParse, HybridHost) {
  CgroupLayout layout = CgroupLayout::parse(kHybridCgroup, kHybridMountinfo);
  ASSERT_TRUE(layout.unified.has_value());
  EXPECT_EQ(layout.unified->dir, "/sys/fs/cgroup/unified");
  EXPECT_THAT(keys(layout), UnorderedElementsAre("cpu", "cpuacct", "cpuset", "memory", "devices",
                                                 "freezer", "blkio", "pids"));
  EXPECT_EQ(layout.controllers.at("memory").dir, "/sys/fs/cgroup/memory/process_api/abc");
  EXPECT_EQ(layout.controllers.at("pids").dir, "/sys/fs/cgroup/pids");
  EXPECT_EQ(layout.controllers.at("cpu").dir, "/sys/fs/cgroup/cpu");
}

// systemd's hybrid layout: co-mounted cpu,cpuacct, optional fields in mountinfo.
TEST(CgroupLayoutParse, SystemdHybridWithCoMountedControllers) {
  constexpr const char* cgroup =
      "4:cpu,cpuacct:/user.slice\n"
      "3:memory:/user.slice/user-1000.slice\n"
      "1:name=systemd:/user.slice/user-1000.slice/session-2.scope\n"
      "0::/user.slice/user-1000.slice/session-2.scope\n";
  constexpr const char* mountinfo =
      "25 24 0:22 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755\n"
      "26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime shared:10 - cgroup2 "
      "cgroup2 rw,nsdelegate\n"
      "27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup "
      "rw,xattr,name=systemd\n"
      "30 25 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:14 - "
      "cgroup cgroup rw,cpu,cpuacct\n"
      "31 25 0:28 / /sys/fs/cgroup/memory rw,nosuid shared:15 - cgroup cgroup rw,memory\n";
  CgroupLayout layout = CgroupLayout::parse(cgroup, mountinfo);
  ASSERT_TRUE(layout.unified.has_value());
  EXPECT_EQ(layout.unified->dir,
            "/sys/fs/cgroup/unified/user.slice/user-1000.slice/session-2.scope");
  EXPECT_THAT(keys(layout), UnorderedElementsAre("cpu", "cpuacct", "memory"));
  EXPECT_EQ(layout.controllers.at("cpu").dir, "/sys/fs/cgroup/cpu,cpuacct/user.slice");
  EXPECT_EQ(layout.controllers.at("cpuacct").dir, "/sys/fs/cgroup/cpu,cpuacct/user.slice");
  EXPECT_EQ(layout.controllers.at("memory").dir,
            "/sys/fs/cgroup/memory/user.slice/user-1000.slice");
}

TEST(CgroupLayoutParse, PureV2) {
  CgroupLayout layout = CgroupLayout::parse(
      "0::/user.slice/user-1000.slice/session-3.scope\n",
      "24 1 0:22 / / rw - ext4 /dev/sda1 rw\n"
      "35 24 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 "
      "rw,nsdelegate,memory_recursiveprot\n");
  ASSERT_TRUE(layout.unified.has_value());
  EXPECT_EQ(layout.unified->dir, "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope");
  EXPECT_THAT(layout.controllers, IsEmpty());
}

TEST(CgroupLayoutParse, EscapedMountpointAndNonRootMount) {
  CgroupLayout layout = CgroupLayout::parse(
      "4:memory:/docker/abc\n"
      "0::/outer/inner/job\n",
      "50 40 0:30 /outer /mnt/my\\040cgroups rw,relatime - cgroup2 cgroup2 rw\n"
      "51 40 0:31 /docker/abc /sys/fs/cgroup/mem\\134ory rw,relatime - cgroup cgroup rw,memory\n");
  ASSERT_TRUE(layout.unified.has_value());
  EXPECT_EQ(layout.unified->dir, "/mnt/my cgroups/inner/job");
  ASSERT_EQ(layout.controllers.count("memory"), 1u);
  EXPECT_EQ(layout.controllers.at("memory").dir, "/sys/fs/cgroup/mem\\ory");
}

TEST(CgroupLayoutParse, EscapeAtEndOfField) {
  CgroupLayout layout =
      CgroupLayout::parse("0::/\n", "50 40 0:30 / /mnt/cg\\040 rw,relatime - cgroup2 cgroup2 rw\n");
  ASSERT_TRUE(layout.unified.has_value());
  EXPECT_EQ(layout.unified->dir, "/mnt/cg ");
}

TEST(CgroupLayoutParse, NothingWithoutMatchingLines) {
  // cgroup2 mounted, but this process has no "0::" line: no unified hierarchy.
  CgroupLayout layout = CgroupLayout::parse(
      "4:memory:/\n", "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n");
  EXPECT_FALSE(layout.unified.has_value());
  EXPECT_THAT(layout.controllers, IsEmpty());

  layout = CgroupLayout::parse("", "");
  EXPECT_FALSE(layout.unified.has_value());
  EXPECT_THAT(layout.controllers, IsEmpty());

  // Garbage lines are skipped.
  layout = CgroupLayout::parse("garbage\n0::/\n", "short line\n - cgroup2\n");
  EXPECT_FALSE(layout.unified.has_value());
}

TEST(CgroupLayoutParse, FirstMountOfAHierarchyWins) {
  CgroupLayout layout =
      CgroupLayout::parse("0::/\n3:pids:/\n",
                          "41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
                          "42 31 0:38 / /elsewhere rw - cgroup2 cgroup2 rw\n"
                          "43 31 0:39 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids\n"
                          "44 31 0:39 / /other/pids rw - cgroup cgroup rw,pids\n");
  ASSERT_TRUE(layout.unified.has_value());
  EXPECT_EQ(layout.unified->dir, "/sys/fs/cgroup");
  EXPECT_EQ(layout.controllers.at("pids").dir, "/sys/fs/cgroup/pids");
}

// Regression (fixed): the mount's root is stripped from our path as a string prefix, with no
// check that it ends at a path component: root "/docker/abc" and path
// "/docker/abcdef/x" give "/sys/fs/cgroupdef/x", a directory that is not in
// the hierarchy at all.
TEST(CgroupLayoutParse, MountRootIsAPathPrefixNotAStringPrefix) {
  CgroupLayout layout = CgroupLayout::parse(
      "0::/docker/abcdef/x\n", "50 40 0:30 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  // Not below the mount's root: the path is taken as it is, inside the mount.
  ASSERT_TRUE(layout.unified.has_value());
  EXPECT_EQ(layout.unified->dir, "/sys/fs/cgroup/docker/abcdef/x");
}

// --- CgroupSet::create on fake trees ---------------------------------------------

class CgroupSetTest : public ::testing::Test {
 protected:
  std::string mkdir(const std::string& name) {
    std::string dir = tmp_ / name;
    std::filesystem::create_directories(dir);
    return dir;
  }
  // Removes the knob files that a fake tree keeps (a real cgroupfs has no
  // such files to remove), so that rmdir can work.
  static void unlink_files(const std::string& dir) {
    std::error_code ignored;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ignored))
      if (entry.is_regular_file()) ::unlink(entry.path().c_str());
  }

  TempDir tmp_;
};

Limits all_limits() {
  Limits limits;
  limits.memory_bytes = 64ull << 20;
  limits.pids = 100;
  limits.cpus = 1.5;
  return limits;
}

TEST_F(CgroupSetTest, PureV2WritesEveryKnob) {
  std::string parent = mkdir("v2");
  write_file(parent + "/cgroup.subtree_control", "memory pids cpu\n");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{parent};
  std::vector<std::string> not_enforced;

  CgroupSet set = CgroupSet::create(layout, "sbx", all_limits(), &not_enforced);
  EXPECT_THAT(not_enforced, IsEmpty());
  const std::string dir = parent + "/sbx";
  EXPECT_THAT(set.dirs(), ElementsAre(dir));
  EXPECT_EQ(read_file(dir + "/memory.max"), "67108864");
  EXPECT_EQ(read_file(dir + "/memory.swap.max"), "0");
  EXPECT_EQ(read_file(dir + "/pids.max"), "100");
  EXPECT_EQ(read_file(dir + "/cpu.max"), "150000 100000");
  EXPECT_FALSE(path_exists(dir + "/memory.limit_in_bytes"));
  EXPECT_EQ(read_file(parent + "/cgroup.subtree_control"), "memory pids cpu\n");  // untouched

  // The fd for CLONE_INTO_CGROUP is the new directory.
  ASSERT_GE(set.unified_fd(), 0);
  struct stat by_fd, by_path;
  ASSERT_EQ(::fstat(set.unified_fd(), &by_fd), 0);
  ASSERT_EQ(::stat(dir.c_str(), &by_path), 0);
  EXPECT_EQ(by_fd.st_ino, by_path.st_ino);
  EXPECT_EQ(by_fd.st_dev, by_path.st_dev);
}

TEST_F(CgroupSetTest, CpuQuotaHasTheKernelMinimum) {
  std::string parent = mkdir("v2");
  write_file(parent + "/cgroup.subtree_control", "cpu");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{parent};
  Limits limits;
  limits.cpus = 0.001;
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
  EXPECT_EQ(read_file(parent + "/sbx/cpu.max"), "1000 100000");
  EXPECT_FALSE(path_exists(parent + "/sbx/memory.max"));
  EXPECT_FALSE(path_exists(parent + "/sbx/pids.max"));
}

TEST_F(CgroupSetTest, V2EnablesAnAvailableController) {
  std::string parent = mkdir("v2");
  write_file(parent + "/cgroup.subtree_control", "");
  write_file(parent + "/cgroup.controllers", "cpuset cpu io memory pids\n");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{parent};
  Limits limits;
  limits.memory_bytes = 8ull << 20;
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
  EXPECT_THAT(not_enforced, IsEmpty());
  EXPECT_EQ(read_file(parent + "/cgroup.subtree_control"), "+memory");
  EXPECT_EQ(read_file(parent + "/sbx/memory.max"), "8388608");
  EXPECT_GE(set.unified_fd(), 0);
}

TEST_F(CgroupSetTest, V1ControllersInSeparateHierarchies) {
  std::string memory = mkdir("memory/process_api/abc");
  std::string pids = mkdir("pids");
  std::string cpu = mkdir("cpu");
  CgroupLayout layout;
  layout.controllers["memory"] = {memory};
  layout.controllers["pids"] = {pids};
  layout.controllers["cpu"] = {cpu};
  std::vector<std::string> not_enforced;

  CgroupSet set = CgroupSet::create(layout, "sbx", all_limits(), &not_enforced);
  EXPECT_THAT(not_enforced, IsEmpty());
  EXPECT_EQ(set.unified_fd(), -1);
  EXPECT_THAT(set.dirs(), UnorderedElementsAre(memory + "/sbx", pids + "/sbx", cpu + "/sbx"));
  EXPECT_EQ(read_file(memory + "/sbx/memory.limit_in_bytes"), "67108864");
  EXPECT_FALSE(path_exists(memory + "/sbx/memory.max"));
  // Swap accounting off (no memsw knob): nothing is made up.
  EXPECT_FALSE(path_exists(memory + "/sbx/memory.memsw.limit_in_bytes"));
  EXPECT_EQ(read_file(pids + "/sbx/pids.max"), "100");
  EXPECT_EQ(read_file(cpu + "/sbx/cpu.cfs_period_us"), "100000");
  EXPECT_EQ(read_file(cpu + "/sbx/cpu.cfs_quota_us"), "150000");
  EXPECT_FALSE(path_exists(cpu + "/sbx/cpu.max"));
}

// An OCI config's cgroupsPath: that path below each hierarchy's top, with
// its parents, whatever cgroup this process is in, and limits or not.
TEST_F(CgroupSetTest, AnAbsolutePathIsMadeInEveryHierarchy) {
  std::string memory_top = mkdir("memory");
  std::string cpu_top = mkdir("cpu,cpuacct");
  std::string freezer_top = mkdir("freezer");
  CgroupLayout layout;
  layout.controllers["memory"] = {mkdir("memory/own"), memory_top, "/"};
  layout.controllers["cpu"] = {mkdir("cpu,cpuacct/own"), cpu_top, "/"};
  layout.controllers["cpuacct"] = layout.controllers["cpu"];
  layout.controllers["freezer"] = {mkdir("freezer/own"), freezer_top, "/"};
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "/default/ctr", Limits{}, &not_enforced);
  EXPECT_THAT(not_enforced, IsEmpty());
  EXPECT_THAT(set.dirs(),
              UnorderedElementsAre(memory_top + "/default/ctr", cpu_top + "/default/ctr",
                                   freezer_top + "/default/ctr"));
  EXPECT_TRUE(path_exists(freezer_top + "/default/ctr"));
  // A limit lands in its own hierarchy's directory.
  set.remove();
  Limits limits;
  limits.pids = 7;
  std::string pids_top = mkdir("pids");
  layout.controllers["pids"] = {mkdir("pids/own"), pids_top, "/"};
  CgroupSet with = CgroupSet::create(layout, "/default/ctr", limits, &not_enforced);
  EXPECT_EQ(read_file(pids_top + "/default/ctr/pids.max"), "7");
  // Only the last part goes: /default may hold other containers.
  unlink_files(pids_top + "/default/ctr");
  with.remove();
  EXPECT_FALSE(path_exists(memory_top + "/default/ctr"));
  EXPECT_TRUE(path_exists(memory_top + "/default"));
  EXPECT_THROW(CgroupSet::create(layout, "/default/../escape", Limits{}, &not_enforced), Error);
}

TEST_F(CgroupSetTest, HybridUsesV1WhenUnifiedLacksTheController) {
  // Like this machine: cgroup2 holds only hugetlb.
  std::string unified = mkdir("unified");
  write_file(unified + "/cgroup.subtree_control", "");
  write_file(unified + "/cgroup.controllers", "hugetlb\n");
  std::string memory = mkdir("memory");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{unified};
  layout.controllers["memory"] = {memory};
  Limits limits;
  limits.memory_bytes = 64ull << 20;
  std::vector<std::string> not_enforced;

  CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
  EXPECT_THAT(not_enforced, IsEmpty());
  EXPECT_EQ(set.unified_fd(), -1);
  EXPECT_THAT(set.dirs(), ElementsAre(memory + "/sbx"));
  EXPECT_FALSE(path_exists(unified + "/sbx"));
  EXPECT_EQ(read_file(unified + "/cgroup.subtree_control"), "");
  EXPECT_EQ(read_file(memory + "/sbx/memory.limit_in_bytes"), "67108864");
}

TEST_F(CgroupSetTest, V1HierarchyHoldingTwoControllersGetsOneDirectory) {
  std::string shared = mkdir("cpu,memory");
  CgroupLayout layout;
  layout.controllers["memory"] = {shared};
  layout.controllers["cpu"] = {shared};
  Limits limits;
  limits.memory_bytes = 64ull << 20;
  limits.cpus = 2;
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
  EXPECT_THAT(set.dirs(), ElementsAre(shared + "/sbx"));
  EXPECT_EQ(read_file(shared + "/sbx/memory.limit_in_bytes"), "67108864");
  EXPECT_EQ(read_file(shared + "/sbx/cpu.cfs_quota_us"), "200000");
}

TEST_F(CgroupSetTest, MissingControllerIsNamedByItsFlag) {
  std::string parent = mkdir("v2");
  write_file(parent + "/cgroup.subtree_control", "pids");
  write_file(parent + "/cgroup.controllers", "pids");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{parent};
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", all_limits(), &not_enforced);
  EXPECT_THAT(not_enforced, ElementsAre("--memory: no cgroup hierarchy has the memory controller",
                                        "--cpus: no cgroup hierarchy has the cpu controller"));
  EXPECT_EQ(read_file(parent + "/sbx/pids.max"), "100");
  EXPECT_FALSE(path_exists(parent + "/sbx/memory.max"));
  EXPECT_FALSE(path_exists(parent + "/sbx/cpu.max"));
}

TEST_F(CgroupSetTest, NoHierarchyAtAll) {
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(CgroupLayout{}, "sbx", all_limits(), &not_enforced);
  EXPECT_TRUE(set.empty());
  EXPECT_EQ(set.unified_fd(), -1);
  ASSERT_EQ(not_enforced.size(), 3u);
  EXPECT_THAT(not_enforced[0], HasSubstr("--memory"));
  EXPECT_THAT(not_enforced[1], HasSubstr("--pids"));
  EXPECT_THAT(not_enforced[2], HasSubstr("--cpus"));
}

TEST_F(CgroupSetTest, NoLimitsMakesNothing) {
  std::string parent = mkdir("v2");
  write_file(parent + "/cgroup.subtree_control", "memory pids cpu");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{parent};
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", Limits{}, &not_enforced);
  EXPECT_TRUE(set.empty());
  EXPECT_THAT(not_enforced, IsEmpty());
  EXPECT_FALSE(path_exists(parent + "/sbx"));
}

// As root, EACCES cannot be provoked; a parent that is a regular file makes
// mkdir fail with ENOTDIR, which is not a permission problem and must throw.
TEST_F(CgroupSetTest, UnexpectedMkdirErrorThrows) {
  std::string not_a_dir = tmp_ / "memory";
  write_file(not_a_dir, "");
  CgroupLayout layout;
  layout.controllers["memory"] = {not_a_dir};
  Limits limits;
  limits.memory_bytes = 64ull << 20;
  std::vector<std::string> not_enforced;
  try {
    CgroupSet::create(layout, "sbx", limits, &not_enforced);
    FAIL() << "create() did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("create cgroup " + not_a_dir + "/sbx: Not a directory"));
  }
}

// An unwritable parent is a limit not enforced, not an error. Needs a non-root
// uid: as root, the test drops to nobody in a child.
TEST_F(CgroupSetTest, UnwritableParentIsReportedNotThrown) {
  std::string v2 = mkdir("v2");
  write_file(v2 + "/cgroup.subtree_control", "pids");
  std::string v1 = mkdir("memory");
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  ASSERT_EQ(::chmod(v2.c_str(), 0555), 0);
  ASSERT_EQ(::chmod(v1.c_str(), 0555), 0);
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{v2};
  layout.controllers["memory"] = {v1};
  Limits limits;
  limits.memory_bytes = 64ull << 20;
  limits.pids = 10;

  auto report = openshell::testing::run_in_child([&](openshell::testing::ChildWriter& out) {
    if (::geteuid() == 0 &&
        (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0)) {
      out.say("SKIP cannot drop to uid 65534");
      return;
    }
    std::vector<std::string> not_enforced;
    try {
      CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
      out.result("unified_fd", set.unified_fd(), 0);
      out.result("dirs", static_cast<long>(set.dirs().size()), 0);
      for (const auto& line : not_enforced) out.say(line);
    } catch (const std::exception& e) {
      out.say(std::string("THREW ") + e.what());
    }
  });
  if (report.text.find("SKIP") == 0) GTEST_SKIP() << report.text;
  ASSERT_TRUE(report.exited_cleanly());
  EXPECT_EQ(report.at("unified_fd").ret, -1);
  EXPECT_EQ(report.at("dirs").ret, 0);
  EXPECT_EQ(report.text, "--pids: cannot create cgroup " + v2 + "/sbx: Permission denied\n" +
                             "--memory: cannot create cgroup " + v1 + "/sbx: Permission denied\n");
}

TEST_F(CgroupSetTest, AttachWritesThePidToV1DirsOnly) {
  std::string v2 = mkdir("v2");
  write_file(v2 + "/cgroup.subtree_control", "memory");
  std::string pids = mkdir("pids");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{v2};
  layout.controllers["pids"] = {pids};
  Limits limits;
  limits.memory_bytes = 64ull << 20;
  limits.pids = 5;
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
  EXPECT_THAT(set.dirs(), ElementsAre(v2 + "/sbx", pids + "/sbx"));  // v2 first
  set.attach(4242);
  EXPECT_EQ(read_file(pids + "/sbx/cgroup.procs"), "4242");
  EXPECT_FALSE(path_exists(v2 + "/sbx/cgroup.procs"));  // v2 is joined by clone3
}

// remove() uses rmdir, as a cgroupfs wants; on a fake tree the knob files
// must go first.
TEST_F(CgroupSetTest, RemoveDeletesTheDirectories) {
  std::string v2 = mkdir("v2");
  write_file(v2 + "/cgroup.subtree_control", "pids");
  std::string memory = mkdir("memory");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{v2};
  layout.controllers["memory"] = {memory};
  Limits limits;
  limits.memory_bytes = 64ull << 20;
  limits.pids = 5;
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
  ASSERT_EQ(set.dirs().size(), 2u);
  unlink_files(v2 + "/sbx");
  unlink_files(memory + "/sbx");

  set.remove();
  EXPECT_FALSE(path_exists(v2 + "/sbx"));
  EXPECT_FALSE(path_exists(memory + "/sbx"));
  EXPECT_TRUE(set.empty());
  EXPECT_EQ(set.unified_fd(), -1);
  set.remove();  // idempotent
  EXPECT_TRUE(path_exists(v2));
}

TEST_F(CgroupSetTest, DestructorRemoves) {
  std::string v2 = mkdir("v2");
  write_file(v2 + "/cgroup.subtree_control", "pids");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{v2};
  Limits limits;
  limits.pids = 5;
  std::vector<std::string> not_enforced;
  {
    CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
    ASSERT_TRUE(path_exists(v2 + "/sbx"));
    unlink_files(v2 + "/sbx");
  }
  EXPECT_FALSE(path_exists(v2 + "/sbx"));
}

TEST_F(CgroupSetTest, MoveAssignmentHandsOverOwnership) {
  std::string v2 = mkdir("v2");
  write_file(v2 + "/cgroup.subtree_control", "pids");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{v2};
  Limits limits;
  limits.pids = 5;
  std::vector<std::string> not_enforced;
  CgroupSet owner;
  {
    CgroupSet made = CgroupSet::create(layout, "sbx", limits, &not_enforced);
    owner = std::move(made);
    EXPECT_TRUE(made.empty());
  }
  EXPECT_TRUE(path_exists(v2 + "/sbx"));  // the moved-from set removed nothing
  EXPECT_THAT(owner.dirs(), ElementsAre(v2 + "/sbx"));
  EXPECT_GE(owner.unified_fd(), 0);
  unlink_files(v2 + "/sbx");
  owner = CgroupSet();
  EXPECT_FALSE(path_exists(v2 + "/sbx"));
}

// On a directory that rmdir cannot remove for a reason other than EBUSY,
// remove() gives up at once (a warning), forgets it, and does not throw.
TEST_F(CgroupSetTest, RemoveGivesUpOnNonBusyErrors) {
  std::string v2 = mkdir("v2");
  write_file(v2 + "/cgroup.subtree_control", "pids");
  CgroupLayout layout;
  layout.unified = CgroupLayout::Hierarchy{v2};
  Limits limits;
  limits.pids = 5;
  std::vector<std::string> not_enforced;
  CgroupSet set = CgroupSet::create(layout, "sbx", limits, &not_enforced);
  set.remove();  // pids.max is still there: ENOTEMPTY
  EXPECT_TRUE(set.empty());
  EXPECT_TRUE(path_exists(v2 + "/sbx/pids.max"));
}

// The gateway's cleanup of a sandbox whose supervisor is gone: a process
// still in the sandbox's cgroup (its init had not yet seen its lifeline
// close) is ended, and the cgroup goes. A real pids cgroup of this host.
TEST(RemoveCgroups, EndsWhatStillRunsInTheCgroupAndRemovesIt) {
  CgroupLayout layout = CgroupLayout::discover();
  auto pids = layout.controllers.find("pids");
  if (pids == layout.controllers.end()) GTEST_SKIP() << "no v1 pids hierarchy here";
  const std::string name = "openshell-unit-" + std::to_string(::getpid());
  const std::string dir = pids->second.dir + "/" + name;
  if (::mkdir(dir.c_str(), 0755) != 0)
    GTEST_SKIP() << "cannot make a cgroup here: " << dir << ": " << std::strerror(errno);
  int joined[2];
  ASSERT_EQ(::pipe(joined), 0);
  pid_t child = ::fork();
  if (child == 0) {
    const std::string me = std::to_string(::getpid());
    if (::write(::open((dir + "/cgroup.procs").c_str(), O_WRONLY), me.data(), me.size()) < 0)
      ::_exit(1);
    ::close(joined[0]);
    ::close(joined[1]);  // joined: the parent's read sees its end
    ::pause();
    ::_exit(0);
  }
  ::close(joined[1]);
  char byte;
  EXPECT_EQ(::read(joined[0], &byte, 1), 0);
  ::close(joined[0]);
  EXPECT_THAT(read_file(dir + "/cgroup.procs"), HasSubstr(std::to_string(child)));
  remove_cgroups(name);
  const bool removed = !path_exists(dir);
  EXPECT_TRUE(removed) << dir;
  if (!removed) ::kill(child, SIGKILL);  // not by remove_cgroups: the test's own cleanup
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  if (!removed) ::rmdir(dir.c_str());
}

}  // namespace
}  // namespace openshell::runtime
