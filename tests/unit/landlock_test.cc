#include "runtime/landlock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "test_util.h"

namespace openshell::runtime::landlock {
namespace {

using openshell::testing::ChildReport;
using openshell::testing::ChildWriter;
using openshell::testing::path_exists;
using openshell::testing::read_file;
using openshell::testing::run_in_child;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::AnyOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// The kernel's uapi values (include/uapi/linux/landlock.h).
constexpr uint64_t kExecute = 1ULL << 0;
constexpr uint64_t kWriteFile = 1ULL << 1;
constexpr uint64_t kReadFile = 1ULL << 2;
constexpr uint64_t kReadDir = 1ULL << 3;
constexpr uint64_t kMakeDir = 1ULL << 7;
constexpr uint64_t kRefer = 1ULL << 13;
constexpr uint64_t kTruncate = 1ULL << 14;
constexpr uint64_t kIoctlDev = 1ULL << 15;

policy::Policy fs_policy(
    std::vector<std::string> read_only, std::vector<std::string> read_write,
    bool include_workdir = true,
    policy::LandlockCompatibility compatibility = policy::LandlockCompatibility::kBestEffort) {
  policy::Policy p;
  p.has_filesystem_policy = true;
  p.filesystem.include_workdir = include_workdir;
  p.filesystem.read_only = std::move(read_only);
  p.filesystem.read_write = std::move(read_write);
  p.landlock = compatibility;
  return p;
}

// --- rights -----------------------------------------------------------------------

TEST(LandlockRights, PerAbi) {
  EXPECT_EQ(fs_rights_for_abi(0), 0u);
  EXPECT_EQ(fs_rights_for_abi(-1), 0u);
  EXPECT_EQ(fs_rights_for_abi(1), 0x1fffu);  // execute .. make_sym
  EXPECT_EQ(fs_rights_for_abi(2), 0x1fffu | kRefer);
  EXPECT_EQ(fs_rights_for_abi(3), 0x1fffu | kRefer | kTruncate);
  EXPECT_EQ(fs_rights_for_abi(4), fs_rights_for_abi(3));  // ABI 4 added network rights only
  EXPECT_EQ(fs_rights_for_abi(5), 0xffffu);
  EXPECT_EQ(fs_rights_for_abi(7), 0xffffu);
}

TEST(LandlockRights, MonotoneInAbi) {
  for (int abi = 0; abi < 12; ++abi) {
    uint64_t lower = fs_rights_for_abi(abi), higher = fs_rights_for_abi(abi + 1);
    EXPECT_EQ(lower & higher, lower) << "ABI " << abi + 1 << " lost rights of ABI " << abi;
  }
}

TEST(LandlockRights, Subsets) {
  EXPECT_EQ(read_only_rights(), kExecute | kReadFile | kReadDir);
  EXPECT_EQ(read_only_rights() & kWriteFile, 0u);
  EXPECT_EQ(read_only_rights() & ~fs_rights_for_abi(1), 0u);  // all known since ABI 1
  EXPECT_EQ(file_rights(), kExecute | kWriteFile | kReadFile | kTruncate | kIoctlDev);
  EXPECT_EQ(file_rights() & (kReadDir | kMakeDir), 0u);  // directory-only rights excluded
}

// --- plan ----------------------------------------------------------------------------

TEST(LandlockPlan, RulesFromPolicy) {
  Plan p = plan(fs_policy({"/usr", "/etc"}, {"/tmp"}), "/work", 3);
  EXPECT_TRUE(p.enabled);
  EXPECT_FALSE(p.hard);
  EXPECT_EQ(p.abi, 3);
  EXPECT_EQ(p.handled_fs, fs_rights_for_abi(3));
  EXPECT_EQ(p.scoped, 0u);
  ASSERT_EQ(p.rules.size(), 4u);
  EXPECT_EQ(p.rules[0].path, "/usr");
  EXPECT_EQ(p.rules[0].access, read_only_rights());
  EXPECT_EQ(p.rules[1].path, "/etc");
  EXPECT_EQ(p.rules[1].access, read_only_rights());
  EXPECT_EQ(p.rules[2].path, "/tmp");
  EXPECT_EQ(p.rules[2].access, fs_rights_for_abi(3));
  EXPECT_EQ(p.rules[3].path, "/work");  // include_workdir
  EXPECT_EQ(p.rules[3].access, fs_rights_for_abi(3));
}

TEST(LandlockPlan, WorkdirOnlyWhenIncludedAndKnown) {
  Plan p = plan(fs_policy({"/usr"}, {}, /*include_workdir=*/false), "/work", 5);
  ASSERT_EQ(p.rules.size(), 1u);
  EXPECT_EQ(p.rules[0].path, "/usr");
  p = plan(fs_policy({"/usr"}, {}, true), "", 5);
  ASSERT_EQ(p.rules.size(), 1u);
}

TEST(LandlockPlan, ScopesFromAbi6) {
  EXPECT_EQ(plan(fs_policy({}, {}), "", 5).scoped, 0u);
  EXPECT_EQ(plan(fs_policy({}, {}), "", 6).scoped, 3u);  // abstract unix sockets and signals
  EXPECT_EQ(plan(fs_policy({}, {}), "", 7).handled_fs, 0xffffu);
}

TEST(LandlockPlan, NoFilesystemPolicyDisables) {
  policy::Policy p;
  p.landlock = policy::LandlockCompatibility::kHardRequirement;
  Plan result = plan(p, "/work", 0);  // nothing asked, nothing required
  EXPECT_FALSE(result.enabled);
  EXPECT_THAT(result.rules, IsEmpty());
  EXPECT_FALSE(plan(policy::Policy{}, "/work", 7).enabled);
}

TEST(LandlockPlan, NoLandlock) {
  Plan best = plan(fs_policy({"/usr"}, {"/tmp"}), "/", 0);
  EXPECT_FALSE(best.enabled);
  EXPECT_THAT(best.rules, IsEmpty());
  try {
    plan(fs_policy({"/usr"}, {"/tmp"}, true, policy::LandlockCompatibility::kHardRequirement), "/",
         0);
    FAIL() << "hard_requirement without Landlock did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("hard_requirement"));
  }
}

TEST(LandlockPlan, OldAbiWithHardRequirementThrows) {
  auto hard = fs_policy({"/usr"}, {}, true, policy::LandlockCompatibility::kHardRequirement);
  try {
    plan(hard, "", 2);
    FAIL() << "ABI 2 accepted under hard_requirement";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("truncation"));
  }
  EXPECT_THROW(plan(hard, "", 1), Error);
  Plan p = plan(hard, "", 3);
  EXPECT_TRUE(p.enabled);
  EXPECT_TRUE(p.hard);
  // Best effort takes what ABI 2 has.
  Plan best = plan(fs_policy({"/usr"}, {"/tmp"}), "", 2);
  EXPECT_TRUE(best.enabled);
  EXPECT_EQ(best.handled_fs & kTruncate, 0u);
  EXPECT_EQ(best.rules[1].access, fs_rights_for_abi(2));
}

// --- apply, in a child ---------------------------------------------------------------

class LandlockApplyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    abi_ = abi_version();
    if (abi_ == 0) GTEST_SKIP() << "Landlock is not available on this kernel";
    write_file(tmp_ / "ro/existing.txt", "hello");
    write_file(tmp_ / "rw/keep.txt", "");
    write_file(tmp_ / "files/allowed.txt", "a");
    write_file(tmp_ / "files/other.txt", "b");
    write_file(tmp_ / "outside/secret.txt", "s");
  }

  // Applies the plan in a child with no_new_privs, reports "apply" and the
  // skipped list, then runs the checks.
  ChildReport apply_in_child(const Plan& p, const std::function<void(ChildWriter&)>& checks,
                             int extra_exec_fd = -1) {
    return run_in_child([&](ChildWriter& out) {
      if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) ::_exit(3);
      char skipped[512] = {};
      ChildFailure failure;
      bool ok = apply(p, extra_exec_fd, skipped, sizeof skipped, &failure);
      out.result("apply", ok ? 0 : -1, failure.err);
      out.say(std::string("skipped=") + skipped);
      if (!ok) out.say(std::string("failure=") + failure.what + " " + failure.detail);
      checks(out);
    });
  }

  static void try_open(ChildWriter& out, const char* name, const std::string& path, int flags) {
    int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
    RECORD(out, name, fd);
    if (fd >= 0) ::close(fd);
  }

  int abi_ = 0;
  TempDir tmp_;
};

TEST_F(LandlockApplyTest, EnforcesReadOnlyAndReadWrite) {
  Plan p = plan(
      fs_policy({tmp_ / "ro", tmp_ / "missing"}, {tmp_ / "rw", tmp_ / "files/allowed.txt"}, false),
      "", abi_);
  const std::string dir = tmp_.path();
  auto report = apply_in_child(p, [&](ChildWriter& out) {
    try_open(out, "read ro", dir + "/ro/existing.txt", O_RDONLY);
    try_open(out, "write ro", dir + "/ro/existing.txt", O_WRONLY);
    try_open(out, "create in ro", dir + "/ro/new.txt", O_WRONLY | O_CREAT);
    RECORD(out, "mkdir in ro", ::mkdir((dir + "/ro/sub").c_str(), 0755));
    RECORD(out, "truncate ro", ::truncate((dir + "/ro/existing.txt").c_str(), 0));
    int fd = ::open((dir + "/rw/new.txt").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    RECORD(out, "create in rw", fd);
    if (fd >= 0) {
      RECORD(out, "write in rw", ::write(fd, "x", 1));
      ::close(fd);
    }
    RECORD(out, "mkdir in rw", ::mkdir((dir + "/rw/sub").c_str(), 0755));
    RECORD(out, "unlink in rw", ::unlink((dir + "/rw/keep.txt").c_str()));
    try_open(out, "write allowed file", dir + "/files/allowed.txt", O_WRONLY);
    try_open(out, "write sibling file", dir + "/files/other.txt", O_WRONLY);
    try_open(out, "read sibling file", dir + "/files/other.txt", O_RDONLY);
    try_open(out, "read outside", dir + "/outside/secret.txt", O_RDONLY);
    RECORD(out, "signal parent", ::kill(::getppid(), 0));
  });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  ASSERT_EQ(report.at("apply").ret, 0) << report.text;
  EXPECT_THAT(report.text, HasSubstr("skipped=" + (tmp_ / "missing") + "\n"));

  auto allowed = [&](const char* name) {
    EXPECT_GE(report.at(name).ret, 0) << name << ": " << strerror(report.at(name).err);
  };
  auto denied = [&](const char* name) {
    EXPECT_EQ(report.at(name).ret, -1) << name << " was allowed";
    EXPECT_EQ(report.at(name).err, EACCES) << name << ": " << strerror(report.at(name).err);
  };
  allowed("read ro");
  denied("write ro");
  denied("create in ro");
  denied("mkdir in ro");
  if (abi_ >= 3) denied("truncate ro");
  allowed("create in rw");
  allowed("write in rw");
  allowed("mkdir in rw");
  allowed("unlink in rw");
  allowed("write allowed file");
  denied("write sibling file");
  denied("read sibling file");
  denied("read outside");
  // Signals are scoped from ABI 6; before, the parent outside may be signalled.
  if (abi_ >= 6) {
    EXPECT_EQ(report.at("signal parent").ret, -1) << "signals are scoped from ABI 6";
    EXPECT_THAT(report.at("signal parent").err, AnyOf(EPERM, EACCES));
  } else {
    EXPECT_EQ(report.at("signal parent").ret, 0) << "ABI " << abi_ << " scopes no signals";
  }

  EXPECT_EQ(read_file(tmp_ / "ro/existing.txt"), "hello");
  EXPECT_FALSE(path_exists(tmp_ / "ro/new.txt"));
  EXPECT_EQ(read_file(tmp_ / "rw/new.txt"), "x");
}

TEST_F(LandlockApplyTest, MissingPathFailsUnderHardRequirement) {
  Plan p = plan(fs_policy({tmp_ / "ro", tmp_ / "missing"}, {tmp_ / "rw"}, false,
                          policy::LandlockCompatibility::kHardRequirement),
                "", abi_);
  const std::string outside = tmp_ / "outside/new.txt";
  auto report = apply_in_child(
      p, [&](ChildWriter& out) { try_open(out, "create outside", outside, O_WRONLY | O_CREAT); });
  ASSERT_TRUE(report.exited_cleanly()) << report.text;
  EXPECT_EQ(report.at("apply").ret, -1);
  EXPECT_EQ(report.at("apply").err, ENOENT);
  EXPECT_THAT(report.text, HasSubstr("failure=landlock: policy path " + (tmp_ / "missing")));
  EXPECT_THAT(report.text, HasSubstr("skipped=\n"));
  // Nothing was restricted.
  EXPECT_GE(report.at("create outside").ret, 0);
}

TEST_F(LandlockApplyTest, DisabledPlanRestrictsNothing) {
  Plan p;  // no filesystem policy
  const std::string outside = tmp_ / "outside/new.txt";
  auto report = apply_in_child(
      p, [&](ChildWriter& out) { try_open(out, "create outside", outside, O_WRONLY | O_CREAT); });
  ASSERT_TRUE(report.exited_cleanly());
  EXPECT_EQ(report.at("apply").ret, 0);
  EXPECT_GE(report.at("create outside").ret, 0);
}

// Regression (landlock.cc apply, fixed): the init image may be a sealed memfd (mounts.cc
// seal_self() falls back to one when a detached mount of the binary cannot be
// made), and apply() means to ignore it ("a memfd cannot carry a rule and
// needs none"), but it tolerates only EBADF and EINVAL from
// landlock_add_rule, while the kernel answers EBADFD for a file on an
// internal mount such as a memfd's. apply() then fails with
// "landlock_add_rule (init image): File descriptor in bad state", and a
// sandbox with a filesystem policy cannot start on that path.
TEST_F(LandlockApplyTest, MemfdInitImageIsAccepted) {
  Plan p = plan(fs_policy({tmp_ / "ro"}, {}, false), "", abi_);
  int memfd = ::memfd_create("openshell-unit", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  auto report = apply_in_child(
      p, [](ChildWriter&) {}, memfd);
  ::close(memfd);
  ASSERT_TRUE(report.exited_cleanly());
  EXPECT_EQ(report.at("apply").ret, 0) << report.text << strerror(report.at("apply").err);
}

}  // namespace
}  // namespace openshell::runtime::landlock
