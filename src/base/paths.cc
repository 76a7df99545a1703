#include "base/paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
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
  paths.run_dir = runtime.empty() ? "/tmp/openshell-" + std::to_string(::geteuid())
                                  : runtime + "/openshell";
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
  if (::stat(run_dir.c_str(), &st) != 0) throw_errno("stat " + run_dir);
  if (st.st_uid != ::geteuid()) throw Error(run_dir + ": belongs to another user");
  if (st.st_mode & 077) {
    if (::chmod(run_dir.c_str(), 0700) != 0) throw_errno("chmod " + run_dir);
  }
}

}  // namespace openshell
