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

int run_in_caller_id_map(uint32_t uid, uint32_t gid, const std::string& what,
                         const std::function<int(int out_fd)>& child, std::string* output,
                         size_t max_output) {
  namespaces::IdMap map =
      namespaces::plan_id_map_for_host(namespaces::current_identity(), uid, gid);
  Pipe go = Pipe::create();
  Pipe out = Pipe::create();
  clone_args clone{};
  clone.flags = CLONE_NEWUSER;
  clone.exit_signal = SIGCHLD;
  long pid = ::syscall(SYS_clone3, &clone, sizeof clone);
  if (pid < 0) throw_errno("start " + what + " in a user namespace");
  if (pid == 0) {
    ::close(go.write.get());
    ::close(out.read.get());
    char byte;
    if (::read(go.read.get(), &byte, 1) != 1) ::_exit(125);
    ::_exit(child(out.write.get()));
  }
  go.read.reset();
  out.write.reset();
  std::string failure;
  try {
    namespaces::apply_id_map(static_cast<pid_t>(pid), &map);
    if (::write(go.write.get(), "g", 1) != 1) failure = errno_message("start " + what, errno);
  } catch (const Error& e) {
    failure = e.what();
  }
  go.write.reset();
  std::string text;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(out.read.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (text.size() < max_output) text.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
  }
  if (!failure.empty()) throw Error(failure);
  if (output) *output = text.substr(0, max_output);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

int run_with_caller_id_map(const std::vector<std::string>& argv, uint32_t uid, uint32_t gid,
                           int stdout_fd, std::string* error_text) {
  if (argv.empty()) throw Error("run_with_caller_id_map: no program");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::string text;
  int status = run_in_caller_id_map(
      uid, gid, argv[0],
      [&](int errors) {
        // Until exec: system calls only.
        ::dup2(errors, 2);
        ::dup2(stdout_fd, 1);
        // Root of the namespace where the map has a 0 (the creator holds
        // every capability in it until exec); where it has not, the
        // caller's id there.
        ::setresgid(0, 0, 0);
        ::setresuid(0, 0, 0);
        ::execv(args[0], args.data());
        return 127;
      },
      &text, 4096);
  while (!text.empty() && text.back() == '\n') text.pop_back();
  if (error_text) *error_text = text;
  return status;
}

}  // namespace openshell::runtime
