// SandboxFreeze: the processes of a PID namespace stop running while held,
// run on after, and are back in their own freezer cgroup, the one made for
// the hold gone. Needs root and a v1 freezer (the test skips otherwise).
#include "runtime/freeze.h"

#include <linux/sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "base/directory.h"
#include "base/files.h"
#include "runtime/cgroup.h"
#include "test_util.h"

namespace openshell::runtime {
namespace {

// The line of /proc/PID/cgroup for the hierarchy: v1's freezer, or v2's.
std::string cgroup_line(pid_t pid, Freezer which) {
  auto text = files::try_read("/proc/" + std::to_string(pid) + "/cgroup").value_or("");
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (which == Freezer::kV1 ? line.find(":freezer:") != std::string::npos
                              : line.compare(0, 3, "0::") == 0)
      return line;
    start = end + 1;
  }
  return "";
}

// A child in a PID namespace of its own (and its child), counting.
class Counter {
 public:
  Counter() {
    count_ = static_cast<std::atomic<long>*>(::mmap(nullptr, 2 * sizeof(std::atomic<long>),
                                                    PROT_READ | PROT_WRITE,
                                                    MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    new (&count_[0]) std::atomic<long>(0);
    new (&count_[1]) std::atomic<long>(0);
    clone_args args{};
    args.flags = CLONE_NEWPID;
    args.exit_signal = SIGCHLD;
    pid_ = static_cast<pid_t>(::syscall(SYS_clone3, &args, sizeof args));
    if (pid_ == 0) {
      // The init and one child it forks: both must be held.
      int which = ::fork() == 0 ? 1 : 0;
      for (;;) count_[which].fetch_add(1);
    }
  }
  ~Counter() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);  // the namespace's init: its child dies with it
      int status;
      ::waitpid(pid_, &status, 0);
    }
    ::munmap(count_, 2 * sizeof(std::atomic<long>));
  }
  pid_t pid() const { return pid_; }
  long total() const { return count_[0].load() + count_[1].load(); }
  bool both_counting() const { return count_[0].load() > 0 && count_[1].load() > 0; }

 private:
  std::atomic<long>* count_ = nullptr;
  pid_t pid_ = -1;
};

class SandboxFreezeIn : public ::testing::TestWithParam<Freezer> {};

TEST_P(SandboxFreezeIn, HoldsEveryProcessOfThePidNamespaceAndLetsThemGo) {
  if (::geteuid() != 0) GTEST_SKIP() << "moving processes between cgroups needs root";
  const Freezer which = GetParam();
  Counter counter;
  ASSERT_GT(counter.pid(), 0) << "clone3 CLONE_NEWPID: " << std::strerror(errno);
  for (int i = 0; i < 500 && !counter.both_counting(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(counter.both_counting());
  const std::string before = cgroup_line(counter.pid(), which);
  const std::string name = "openshell-freeze-test-" + std::to_string(::getpid());
  {
    std::optional<SandboxFreeze> hold;
    try {
      hold.emplace(counter.pid(), name, which);
    } catch (const Error& e) {
      if (std::string(e.what()).starts_with("no freezer cgroup"))
        GTEST_SKIP() << "this host has no such hierarchy: " << e.what();
      throw;
    }
    EXPECT_EQ(hold->processes(), 2u);
    EXPECT_NE(cgroup_line(counter.pid(), which).find(name), std::string::npos);
    const long frozen = counter.total();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(counter.total(), frozen) << "a held process ran";
  }
  const long thawed = counter.total();
  for (int i = 0; i < 500 && counter.total() == thawed; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GT(counter.total(), thawed) << "the processes did not run again";
  EXPECT_EQ(cgroup_line(counter.pid(), which), before);
}

INSTANTIATE_TEST_SUITE_P(Hierarchies, SandboxFreezeIn,
                         ::testing::Values(Freezer::kV1, Freezer::kV2),
                         [](const ::testing::TestParamInfo<Freezer>& info) {
                           return std::string(info.param == Freezer::kV1 ? "V1Freezer"
                                                                         : "V2CgroupFreeze");
                         });

TEST(SandboxFreeze, ASandboxsOwnV2CgroupIsFrozenInPlace) {
  if (::geteuid() != 0) GTEST_SKIP() << "moving processes between cgroups needs root";
  CgroupLayout layout = CgroupLayout::discover();
  if (!layout.unified) GTEST_SKIP() << "no cgroup v2 hierarchy here";
  const std::string own_name = "openshell-freeze-own-" + std::to_string(::getpid());
  const std::string own = layout.unified->dir + "/" + own_name;
  ASSERT_EQ(::mkdir(own.c_str(), 0755), 0) << own << ": " << std::strerror(errno);
  {
    Counter counter;
    ASSERT_GT(counter.pid(), 0);
    for (int i = 0; i < 500 && !counter.both_counting(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    // The init and its child into the sandbox's own cgroup, as a launch
    // puts them.
    for (const auto& name : files::list_directory("/proc")) {
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      char a[64] = {0}, b[64] = {0};
      ::readlink(("/proc/" + name + "/ns/pid").c_str(), a, sizeof a - 1);
      ::readlink(("/proc/" + std::to_string(counter.pid()) + "/ns/pid").c_str(), b, sizeof b - 1);
      if (std::string(a) != b) continue;
      FILE* procs = std::fopen((own + "/cgroup.procs").c_str(), "w");
      ASSERT_NE(procs, nullptr);
      std::fputs(name.c_str(), procs);
      EXPECT_EQ(std::fclose(procs), 0) << "move " << name << ": " << std::strerror(errno);
    }
    ASSERT_NE(cgroup_line(counter.pid(), Freezer::kV2).find(own_name), std::string::npos)
        << cgroup_line(counter.pid(), Freezer::kV2);
    {
      SandboxFreeze hold(counter.pid(), "openshell-freeze-moved", Freezer::kV2, own_name);
      EXPECT_TRUE(hold.in_place());
      EXPECT_EQ(hold.processes(), 0u);
      EXPECT_NE(cgroup_line(counter.pid(), Freezer::kV2).find(own_name), std::string::npos);
      const long frozen = counter.total();
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      EXPECT_EQ(counter.total(), frozen) << "a held process ran";
    }
    const long thawed = counter.total();
    for (int i = 0; i < 500 && counter.total() == thawed; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_GT(counter.total(), thawed) << "the processes did not run again";
    EXPECT_TRUE(files::exists(own)) << "the sandbox's own cgroup was removed";
  }
  for (int i = 0; i < 100 && ::rmdir(own.c_str()) != 0; ++i) ::usleep(10000);
}

TEST(SandboxFreeze, AnInitThatIsGoneIsAnError) {
  if (::geteuid() != 0 || !can_freeze()) GTEST_SKIP() << "needs root and a v1 freezer cgroup";
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  int status;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(openshell::testing::error_of([&] { SandboxFreeze hold(child, "openshell-gone"); }),
            "the sandbox's init (pid " + std::to_string(child) + ") is gone");
}

}  // namespace
}  // namespace openshell::runtime
