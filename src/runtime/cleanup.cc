#include "runtime/cleanup.h"

#include <linux/sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "namespaces/userns.h"
#include "runtime/cgroup.h"

namespace openshell::runtime {

namespace {

// As root of a user namespace that maps the caller's subordinate ids: files
// the sandbox made as other ids are ours there.
int remove_in_user_namespace(int parent, const char* name) {
  namespaces::Identity me = namespaces::current_identity();
  namespaces::IdMap map = namespaces::plan_id_map_for_host(me, 0, 0);
  if (map.is_single()) return EPERM;  // nothing more to gain
  Pipe go = Pipe::create();
  clone_args args{};
  args.flags = CLONE_NEWUSER;
  args.exit_signal = SIGCHLD;
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid < 0) return errno;
  if (pid == 0) {
    // Until _exit: system calls only (remove_tree_at allocates nothing).
    ::close(go.write.get());
    char byte;
    if (::read(go.read.get(), &byte, 1) != 1) ::_exit(EPERM);
    ::_exit(files::remove_tree_at(parent, name));
  }
  go.read.reset();
  int result = 0;
  try {
    namespaces::apply_id_map(static_cast<pid_t>(pid), &map);
    if (::write(go.write.get(), "g", 1) != 1) result = errno;
  } catch (const Error&) {
    result = EPERM;
  }
  go.write.reset();
  int status = 0;
  while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
  }
  if (result) return result;
  return WIFEXITED(status) ? WEXITSTATUS(status) : EACCES;  // its exit status is the errno
}

// Ends what is still in the cgroup dir (named name): at once with
// cgroup.kill where the hierarchy has it, else each process that
// cgroup.procs names, pinned by a pidfd and checked to be in the cgroup
// still (a pid read there may have ended and been reused since).
void kill_members(const std::string& dir, const std::string& name) {
  if (files::write_once(dir + "/cgroup.kill", "1") == 0) return;
  auto procs = files::try_read(dir + "/cgroup.procs");
  if (!procs) return;
  const std::string member = "/" + name + "\n";
  for (const std::string& line : text::split(*procs, '\n')) {
    auto pid = text::parse_uint(line, INT32_MAX);
    if (!pid) continue;
    UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, static_cast<pid_t>(*pid), 0)));
    if (!pidfd) continue;
    auto cgroups = files::try_read("/proc/" + line + "/cgroup");
    if (cgroups && cgroups->find(member) != std::string::npos)
      ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
  }
}

}  // namespace

void remove_cgroups(const std::string& name) noexcept {
  try {
    CgroupLayout layout = CgroupLayout::discover();
    std::vector<std::string> dirs;
    if (layout.unified) dirs.push_back(layout.unified->dir + "/" + name);
    for (const auto& [controller, hierarchy] : layout.controllers)
      dirs.push_back(hierarchy.dir + "/" + name);
    // Tasks that just died may still be leaving: retry a while. What still
    // runs there is ended: its sandbox's supervisor is gone, and a process
    // whose init had not yet told the gateway its pid (the supervisor was
    // killed first) is on its way out or would outlive its sandbox.
    for (const auto& dir : dirs)
      for (int attempt = 0; attempt < 1000; ++attempt) {
        if (::rmdir(dir.c_str()) == 0 || errno != EBUSY) break;
        if (attempt % 25 == 0) kill_members(dir, name);
        ::usleep(2000);
      }
  } catch (...) {
  }
}

void remove_tree(const std::string& path) {
  files::RemovalTarget target = files::RemovalTarget::open(path);
  if (!target.parent) return;  // its directory is gone, and so is it
  int err = files::remove_tree_at(target.parent.get(), target.name.c_str());
  if (err == EACCES || err == EPERM)
    err = remove_in_user_namespace(target.parent.get(), target.name.c_str());
  if (err) throw files::removal_error(path, err);
}

}  // namespace openshell::runtime
