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
#include <cstring>
#include <new>
#include <string>
#include <thread>

#include <gtest/gtest.h>

#include "base/files.h"
#include "test_util.h"

namespace openshell::runtime {
namespace {

std::string freezer_line(pid_t pid) {
  auto text = files::try_read("/proc/" + std::to_string(pid) + "/cgroup").value_or("");
  for (size_t start = 0; start < text.size();) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    if (line.find(":freezer:") != std::string::npos) return line;
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

TEST(SandboxFreeze, HoldsEveryProcessOfThePidNamespaceAndLetsThemGo) {
  if (::geteuid() != 0 || !can_freeze()) GTEST_SKIP() << "needs root and a v1 freezer cgroup";
  Counter counter;
  ASSERT_GT(counter.pid(), 0) << "clone3 CLONE_NEWPID: " << std::strerror(errno);
  for (int i = 0; i < 500 && !counter.both_counting(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(counter.both_counting());
  const std::string before = freezer_line(counter.pid());
  const std::string name = "openshell-freeze-test-" + std::to_string(::getpid());
  {
    SandboxFreeze hold(counter.pid(), name);
    EXPECT_EQ(hold.processes(), 2u);
    EXPECT_NE(freezer_line(counter.pid()).find(name), std::string::npos);
    const long frozen = counter.total();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_EQ(counter.total(), frozen) << "a held process ran";
  }
  const long thawed = counter.total();
  for (int i = 0; i < 500 && counter.total() == thawed; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_GT(counter.total(), thawed) << "the processes did not run again";
  EXPECT_EQ(freezer_line(counter.pid()), before);
  EXPECT_FALSE(files::exists("/sys/fs/cgroup/freezer/" + name));
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
