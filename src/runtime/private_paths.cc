#include "runtime/private_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "base/directory.h"
#include "base/error.h"
#include "runtime/users.h"

namespace openshell::runtime {

namespace {

std::string env(const char* name) {
  const char* value = std::getenv(name);
  return value && *value == '/' ? value : "";
}

// The home directories of the real and effective users, from the password
// database (HOME may have been changed).
std::vector<std::string> home_directories() {
  std::vector<std::string> homes;
  // The host's /etc/passwd read as a file: NSS (getpwuid) would load the
  // host's shared libraries into this static binary.
  for (uid_t uid : {::getuid(), ::geteuid()}) {
    try {
      ResolvedUser user = resolve_user_in_root(std::to_string(uid), "/");
      if (user.home.size() > 1 && user.home[0] == '/') homes.push_back(user.home);
    } catch (const Error&) {
      // No readable passwd: $HOME and $XDG_STATE_HOME still count.
    }
  }
  return homes;
}

}  // namespace

std::vector<std::string> openshell_private_paths(const std::vector<Paths>& known) {
  std::vector<std::string> candidates;
  auto add_paths = [&](const Paths& p) {
    candidates.push_back(p.state_dir);
    candidates.push_back(p.run_dir);
  };
  for (const auto& p : known) add_paths(p);
  try {
    add_paths(Paths::resolve());
  } catch (const Error&) {
    // No layout resolves here (no HOME, say): the defaults below still count.
  }
  if (std::string home = env("OPENSHELL_HOME"); !home.empty()) {
    candidates.push_back(home);
    candidates.push_back(home + "/run");
  }
  candidates.push_back("/var/lib/openshell");
  candidates.push_back("/run/openshell");
  if (std::string state = env("XDG_STATE_HOME"); !state.empty())
    candidates.push_back(state + "/openshell");
  if (std::string home = env("HOME"); !home.empty())
    candidates.push_back(home + "/.local/state/openshell");
  for (const auto& home : home_directories())
    candidates.push_back(home + "/.local/state/openshell");
  if (std::string runtime = env("XDG_RUNTIME_DIR"); !runtime.empty()) candidates.push_back(runtime);
  for (uid_t uid : {::getuid(), ::geteuid()})
    candidates.push_back("/run/user/" + std::to_string(uid));
  files::for_each_entry("/tmp", [&candidates](const char* name, unsigned char) {
    if (std::strncmp(name, "openshell-", 10) == 0)
      candidates.push_back(std::string("/tmp/") + name);
    return true;
  });

  std::vector<std::string> paths;
  for (const auto& candidate : candidates) {
    char resolved[PATH_MAX];
    if (candidate.empty() || !::realpath(candidate.c_str(), resolved)) continue;
    struct stat st;
    if (::stat(resolved, &st) != 0 || !(S_ISDIR(st.st_mode) || S_ISSOCK(st.st_mode))) continue;
    if (std::strcmp(resolved, "/") == 0) continue;
    paths.emplace_back(resolved);
  }
  std::sort(paths.begin(), paths.end());
  paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
  return paths;
}

}  // namespace openshell::runtime
