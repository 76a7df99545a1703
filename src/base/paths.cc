#include "base/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "base/error.h"

namespace openshell {

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value ? value : "";
}

// mkdir -p with the given mode for what it creates.
void make_dirs(const std::string& path, mode_t mode) {
  for (size_t pos = 1; pos <= path.size(); ++pos) {
    if (pos != path.size() && path[pos] != '/') continue;
    std::string prefix = path.substr(0, pos);
    if (::mkdir(prefix.c_str(), mode) != 0 && errno != EEXIST) throw_errno("create " + prefix);
  }
}

}  // namespace

Paths Paths::resolve() {
  Paths paths;
  if (std::string home = env("OPENSHELL_HOME"); !home.empty()) {
    if (home[0] != '/') throw Error("OPENSHELL_HOME " + home + ": must be an absolute path");
    while (home.size() > 1 && home.back() == '/') home.pop_back();
    paths.state_dir = home;
    paths.run_dir = home + "/run";
    return paths;
  }
  if (::geteuid() == 0) {
    paths.state_dir = "/var/lib/openshell";
    paths.run_dir = "/run/openshell";
    return paths;
  }
  std::string state = env("XDG_STATE_HOME");
  if (state.empty()) {
    std::string home = env("HOME");
    if (home.empty()) throw Error("neither OPENSHELL_HOME, XDG_STATE_HOME nor HOME is set");
    state = home + "/.local/state";
  }
  paths.state_dir = state + "/openshell";
  std::string runtime = env("XDG_RUNTIME_DIR");
  if (!runtime.empty())
    paths.run_dir = runtime + "/openshell";
  else if (paths.state_dir.size() + 4 <= kMaxRunDirLength)
    paths.run_dir = paths.state_dir + "/run";
  else
    // Another user could make this one first: check_private() tells.
    paths.run_dir = "/tmp/openshell-" + std::to_string(::geteuid());
  return paths;
}

void Paths::ensure() const {
  make_dirs(state_dir, 0700);
  make_dirs(run_dir, 0700);
  make_dirs(state_dir + "/keys", 0700);
  make_dirs(sandboxes(), 0700);
  make_dirs(run_dir + "/s", 0700);
  // A runtime directory under /tmp could have been made by someone else.
  struct stat st;
  if (::lstat(run_dir.c_str(), &st) != 0) throw_errno("stat " + run_dir);
  if (S_ISDIR(st.st_mode) && st.st_uid == ::geteuid() && (st.st_mode & 027)) {
    if (::chmod(run_dir.c_str(), 0700) != 0) throw_errno("chmod " + run_dir);
  }
  if (std::string problem = private_dir_problem(run_dir); !problem.empty()) throw Error(problem);
}

void Paths::check_private() const {
  if (std::string problem = private_dir_problem(run_dir); !problem.empty()) throw Error(problem);
  if (std::string problem = private_socket_problem(socket()); !problem.empty())
    throw Error(problem);
}

namespace {

std::string octal(mode_t mode) {
  char buf[8];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

std::string not_yours(const std::string& path, const struct stat& st, const char* remove) {
  std::string out = path + " belongs to uid " + std::to_string(st.st_uid) + ", not you (uid " +
                    std::to_string(::geteuid()) + "); remove it (as root: " + remove + " " + path +
                    ")";
  // The fallback run directory (see resolve()).
  if (path.rfind("/tmp/openshell-" + std::to_string(::geteuid()), 0) == 0)
    out += " or set XDG_RUNTIME_DIR";
  return out;
}

}  // namespace

std::string private_dir_problem(const std::string& dir) {
  struct stat st;
  if (::lstat(dir.c_str(), &st) != 0)
    return errno == ENOENT ? "" : errno_message("stat " + dir, errno);
  if (!S_ISDIR(st.st_mode))
    return dir + " is not a directory (" + (S_ISLNK(st.st_mode) ? "a symbolic link" : "a file") +
           "); remove it (rm " + dir + ")";
  if (st.st_uid != ::geteuid()) return not_yours(dir, st, "rm -rf");
  if (st.st_mode & 027)
    return dir + " has mode " + octal(st.st_mode) + ", not 0700; make it private (chmod 700 " +
           dir + ")";
  return "";
}

std::string private_socket_problem(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0)
    return errno == ENOENT ? "" : errno_message("stat " + path, errno);
  if (!S_ISSOCK(st.st_mode))
    return path + " is not a socket (" + (S_ISLNK(st.st_mode) ? "a symbolic link" : "a file") +
           "); remove it (rm " + path + ")";
  if (st.st_uid != ::geteuid()) return not_yours(path, st, "rm -f");
  if (st.st_mode & 007)
    return path + " has mode " + octal(st.st_mode) +
           ", not 0600; whatever listens there is not your gateway: stop it and remove the "
           "socket (rm " +
           path + ")";
  return "";
}

}  // namespace openshell
