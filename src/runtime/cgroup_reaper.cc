#include "runtime/cgroup_reaper.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.h"
#include "runtime/cgroup.h"

namespace openshell::runtime {

namespace {

// The helper, between fork and _exit.
[[noreturn]] void reap(int done_fd, const char* const* dirs, size_t count,
                       const std::function<void()>& after_death) {
  // Out of the terminal's process group (a ^C is the owner's to forward),
  // deaf to signals, holding nothing of the owner's but its pipe.
  ::setpgid(0, 0);
  for (int sig = 1; sig < NSIG; ++sig) ::signal(sig, SIG_IGN);
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
    for (size_t i = count; i-- > 0;)
      if (::rmdir(dirs[i]) != 0 && errno != ENOENT) left = true;
    if (!left) break;
    ::nanosleep(&pause, nullptr);
  }
  if (after_death) {
    try {
      after_death();
    } catch (...) {
    }
  }
  ::_exit(0);
}

}  // namespace

CgroupReaper::CgroupReaper(const std::string& name, std::function<void()> after_death) {
  CgroupLayout layout = CgroupLayout::discover();
  std::vector<std::string> dirs;
  if (layout.unified) dirs.push_back(layout.unified->dir + "/" + name);
  for (const auto& [controller, hierarchy] : layout.controllers)
    dirs.push_back(hierarchy.dir + "/" + name);
  if (dirs.empty()) return;
  std::vector<const char*> paths;
  for (const auto& d : dirs) paths.push_back(d.c_str());
  Pipe pipe = Pipe::create();
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork the cgroup cleanup helper");
  if (pid == 0) reap(pipe.read.get(), paths.data(), paths.size(), after_death);
  pid_ = pid;
  done_ = std::move(pipe.write);
}

CgroupReaper::~CgroupReaper() {
  if (pid_ < 0) return;
  ssize_t ignored = ::write(done_.get(), "x", 1);
  (void)ignored;
  done_.reset();
  while (::waitpid(pid_, nullptr, 0) < 0 && errno == EINTR) {
  }
}

}  // namespace openshell::runtime
