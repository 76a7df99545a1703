#include "runtime/cgroup_reaper.h"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

#include "base/error.h"
#include "runtime/cgroup.h"

namespace openshell::runtime {

struct CgroupReaper::Plan {
  std::vector<std::string> dirs;  // read by the helper, never changed once it runs
  std::optional<namespaces::RunRelease> release;
  int done_fd = -1;
};

namespace {

constexpr size_t kStackSize = 64 * 1024;

// The helper. It shares the owner's memory and, until the owner is gone,
// its thread's errno: every call it makes while the owner lives succeeds
// (setpgid of a new process, sigaction of a catchable signal, close_range,
// read), so none writes there.
int reap(void* arg) {
  const auto* plan = static_cast<const CgroupReaper::Plan*>(arg);
  // Out of the terminal's process group (a ^C is the owner's to forward),
  // deaf to signals, holding nothing of the owner's but its pipe.
  ::setpgid(0, 0);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP && (sig < 32 || sig >= SIGRTMIN))
      ::sigaction(sig, &ignore, nullptr);
  const int done_fd = plan->done_fd;
  if (done_fd > 0) ::syscall(SYS_close_range, 0, done_fd - 1, 0);
  ::syscall(SYS_close_range, done_fd + 1, ~0U, 0);
  char byte;
  ssize_t n;
  do n = ::read(done_fd, &byte, 1);
  while (n < 0 && errno == EINTR);
  if (n == 1) ::_exit(0);
  // The owner died: the init ends the sandbox, the cgroups empty. Remove
  // them as soon as they are, for ten seconds at most.
  timespec pause{0, 5 * 1000 * 1000};
  for (int tries = 0; tries < 2000; ++tries) {
    bool left = false;
    for (size_t i = plan->dirs.size(); i-- > 0;)
      if (::rmdir(plan->dirs[i].c_str()) != 0 && errno != ENOENT) left = true;
    if (!left) break;
    ::nanosleep(&pause, nullptr);
  }
  if (plan->release) namespaces::release_run_range(*plan->release);
  ::_exit(0);
}

}  // namespace

CgroupReaper::CgroupReaper(const std::string& name, std::optional<namespaces::RunRelease> release) {
  CgroupLayout layout = CgroupLayout::discover();
  auto plan = std::make_unique<Plan>();
  if (layout.unified) plan->dirs.push_back(layout.unified->dir + "/" + name);
  for (const auto& [controller, hierarchy] : layout.controllers)
    plan->dirs.push_back(hierarchy.dir + "/" + name);
  if (plan->dirs.empty()) return;
  plan->release = std::move(release);
  Pipe pipe = Pipe::create();
  plan->done_fd = pipe.read.get();
  void* stack = ::mmap(nullptr, kStackSize, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (stack == MAP_FAILED) throw_errno("map the cgroup cleanup helper's stack");
  pid_t pid = ::clone(reap, static_cast<char*>(stack) + kStackSize, CLONE_VM | SIGCHLD, plan.get());
  if (pid < 0) {
    int err = errno;
    ::munmap(stack, kStackSize);
    throw_errno("start the cgroup cleanup helper", err);
  }
  pid_ = pid;
  stack_ = stack;
  plan_ = std::move(plan);
  done_ = std::move(pipe.write);
}

CgroupReaper::~CgroupReaper() {
  if (pid_ < 0) return;
  ssize_t ignored = ::write(done_.get(), "x", 1);
  (void)ignored;
  done_.reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
  // Only now: the helper ran on this stack and read the plan.
  ::munmap(stack_, kStackSize);
}

}  // namespace openshell::runtime
