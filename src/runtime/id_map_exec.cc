#include "runtime/id_map_exec.h"

#include <grp.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.h"
#include "base/unique_fd.h"
#include "namespaces/userns.h"

namespace openshell::runtime {

int run_with_caller_id_map(const std::vector<std::string>& argv, uint32_t uid, uint32_t gid,
                           int stdout_fd, std::string* error_text) {
  if (argv.empty()) throw Error("run_with_caller_id_map: no program");
  namespaces::IdMap map =
      namespaces::plan_id_map_for_host(namespaces::current_identity(), uid, gid);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  Pipe go = Pipe::create();
  Pipe errors = Pipe::create();
  clone_args clone{};
  clone.flags = CLONE_NEWUSER;
  clone.exit_signal = SIGCHLD;
  long pid = ::syscall(SYS_clone3, &clone, sizeof clone);
  if (pid < 0) throw_errno("start " + argv[0] + " in a user namespace");
  if (pid == 0) {
    // Until exec: system calls only.
    ::close(go.write.get());
    ::close(errors.read.get());
    char byte;
    if (::read(go.read.get(), &byte, 1) != 1) ::_exit(125);
    ::dup2(errors.write.get(), 2);
    ::dup2(stdout_fd, 1);
    // Root of the namespace where the map has a 0 (the creator holds every
    // capability in it until exec); where it has not, the caller's id there.
    ::setresgid(0, 0, 0);
    ::setresuid(0, 0, 0);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  go.read.reset();
  errors.write.reset();
  std::string failure;
  try {
    namespaces::apply_id_map(static_cast<pid_t>(pid), &map);
    if (::write(go.write.get(), "g", 1) != 1) failure = errno_message("start " + argv[0], errno);
  } catch (const Error& e) {
    failure = e.what();
  }
  go.write.reset();
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(errors.read.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < 4096) text.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
  }
  if (!failure.empty()) throw Error(failure);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (error_text) *error_text = text.substr(0, 4096);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace openshell::runtime
