#include "gateway/host_paths.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "base/unique_fd.h"
#include "gateway/principal.h"

namespace openshell::gateway {

namespace {

struct Verdict {
  int index = -1;  // the path refused, or -1
  int err = 0;
};

}  // namespace

std::string host_path_problem(uid_t uid, gid_t gid, const std::vector<HostPath>& paths) {
  // A path whose components changed since it was made canonical (the CLI
  // resolves --bind sources) may now lead where the user could not go.
  for (const auto& p : paths) {
    std::unique_ptr<char, decltype(&std::free)> real(::realpath(p.path.c_str(), nullptr),
                                                     &std::free);
    if (real && p.path != real.get())
      return p.what + ": " + p.path + " is no longer where it leads (" + real.get() +
             "): give the path itself";
  }
  const std::vector<gid_t> groups = groups_of(uid, gid);
  std::vector<const char*> c_paths;
  std::vector<int> modes;
  for (const auto& p : paths) {
    c_paths.push_back(p.path.c_str());
    modes.push_back(R_OK | (p.write ? W_OK : 0));
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("check host paths: pipe");
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("check host paths: fork");
  if (pid == 0) {
    // Only system calls from here: the user's ids, then the checks.
    Verdict v;
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      v.err = errno;
    } else {
      for (size_t i = 0; i < c_paths.size(); ++i) {
        struct stat st;
        int mode = modes[i];
        if (::stat(c_paths[i], &st) == 0 && S_ISDIR(st.st_mode)) mode |= X_OK;
        if (::stat(c_paths[i], &st) != 0 || ::access(c_paths[i], mode) != 0) {
          v.index = static_cast<int>(i);
          v.err = errno;
          break;
        }
      }
    }
    ssize_t ignored = ::write(write_end.get(), &v, sizeof v);
    (void)ignored;
    ::_exit(0);
  }
  write_end.reset();
  Verdict v;
  ssize_t n;
  do n = ::read(read_end.get(), &v, sizeof v);
  while (n < 0 && errno == EINTR);
  int status;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof v))
    throw Error("check host paths: the checking process ended without an answer");
  if (v.index < 0 && v.err)
    throw Error(errno_message("check host paths as uid " + std::to_string(uid), v.err));
  if (v.index < 0) return "";
  const HostPath& p = paths[static_cast<size_t>(v.index)];
  return p.what + ": uid " + std::to_string(uid) + " may not " +
         (p.write ? "read and write " : "read ") + p.path + " (" + std::strerror(v.err) + ")";
}

}  // namespace openshell::gateway
