#include "runtime/freeze.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <optional>
#include <vector>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "runtime/cgroup.h"

namespace openshell::runtime {

namespace {

constexpr int kFreezeWaitMs = 10000;

// "/x/y" of the hierarchy's line of /proc/PID/cgroup: v1 "6:freezer:/x/y",
// v2 "0::/x/y".
std::optional<std::string> cgroup_path(const std::string& pid, bool v2) {
  auto text = files::try_read("/proc/" + pid + "/cgroup");
  if (!text) return std::nullopt;
  for (const auto& line : text::split(*text, '\n')) {
    if (v2) {
      if (line.compare(0, 3, "0::") == 0) return line.substr(3);
      continue;
    }
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    for (const auto& c : text::split(line.substr(first + 1, second - first - 1), ','))
      if (c == "freezer") return line.substr(second + 1);
  }
  return std::nullopt;
}

// This process's cgroup directory in the v1 freezer hierarchy (v2: the
// unified one), and the hierarchy's mount; false when there is none this
// process may write.
bool freezer_dirs(bool v2, std::string* own, std::string* root) {
  CgroupLayout layout = CgroupLayout::discover();
  auto path = cgroup_path("self", v2);
  if (v2) {
    if (!layout.unified || !path) return false;
    *own = layout.unified->dir;
  } else {
    auto it = layout.controllers.find("freezer");
    if (it == layout.controllers.end() || !path) return false;
    *own = it->second.dir;
  }
  *root = *path == "/" ? *own : own->substr(0, own->size() - path->size());
  return ::access(own->c_str(), W_OK) == 0 && ::access((*own + "/cgroup.procs").c_str(), W_OK) == 0;
}

// Which hierarchy to use: v1's freezer where there is one, else v2's
// cgroup.freeze. false when neither may be written.
bool choose(Freezer want, bool* v2, std::string* own, std::string* root) {
  if (want != Freezer::kV2 && freezer_dirs(false, own, root)) return *v2 = false, true;
  if (want != Freezer::kV1 && freezer_dirs(true, own, root)) return *v2 = true, true;
  return false;
}

std::string pid_namespace(const std::string& pid) {
  char buf[64];
  ssize_t n = ::readlink(("/proc/" + pid + "/ns/pid").c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

// The processes in the PID namespace ns.
std::vector<std::string> processes_in(const std::string& ns) {
  std::vector<std::string> out;
  for (const auto& name : files::list_directory("/proc")) {
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    if (pid_namespace(name) == ns) out.push_back(name);
  }
  return out;
}

bool write_text(const std::string& path, const std::string& text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  return fd && ::write(fd.get(), text.data(), text.size()) == static_cast<ssize_t>(text.size());
}

}  // namespace

bool can_freeze() {
  bool v2;
  std::string own, root;
  return choose(Freezer::kAny, &v2, &own, &root);
}

SandboxFreeze::SandboxFreeze(pid_t init_pid, const std::string& name, Freezer which,
                             const std::string& sandbox_cgroup) {
  std::string own;
  if (!choose(which, &v2_, &own, &hierarchy_root_))
    throw Error(
        "no freezer cgroup this gateway may use (a v1 freezer or a cgroup v2 hierarchy, "
        "as root)");
  const std::string ns = pid_namespace(std::to_string(init_pid));
  if (ns.empty()) throw Error("the sandbox's init (pid " + std::to_string(init_pid) + ") is gone");
  // cgroup v2, where the sandbox's processes are all in its own cgroup and
  // nothing else is: that cgroup is frozen where it is, its limits kept.
  std::vector<std::string> pids = processes_in(ns);
  if (v2_ && !sandbox_cgroup.empty() && !pids.empty()) {
    auto path = cgroup_path(pids[0], true);
    const std::string suffix = "/" + sandbox_cgroup;
    bool alone = path && path->size() >= suffix.size() &&
                 path->compare(path->size() - suffix.size(), suffix.size(), suffix) == 0;
    for (const auto& pid : pids) alone = alone && cgroup_path(pid, true) == path;
    const std::string dir = alone ? hierarchy_root_ + *path : "";
    if (alone) {
      const auto members = text::split(
          std::string(text::trim(files::try_read(dir + "/cgroup.procs").value_or(""))), '\n');
      for (const auto& member : members)
        alone = alone && std::find(pids.begin(), pids.end(), member) != pids.end();
    }
    if (alone) {
      in_place_ = true;
      dir_ = dir;
    }
  }
  if (!in_place_) {
    dir_ = own + "/" + name;
    if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + dir_);
  }
  const std::string control = dir_ + (v2_ ? "/cgroup.freeze" : "/freezer.state");
  auto frozen = [&] {
    if (!v2_) return text::trim(files::try_read(control).value_or("")) == "FROZEN";
    const std::string events = files::try_read(dir_ + "/cgroup.events").value_or("");
    return events.find("frozen 1") != std::string::npos;
  };
  try {
    // Moved in, frozen, and looked at again: a process forked by one not
    // yet moved may have escaped the first round.
    for (int round = 0;; ++round) {
      bool moved = false;
      for (const auto& pid : in_place_ ? std::vector<std::string>{} : processes_in(ns)) {
        const pid_t p = static_cast<pid_t>(std::stol(pid));
        if (origins_.count(p)) continue;
        auto from = cgroup_path(pid, v2_);
        if (!from) continue;  // gone meanwhile
        if (!write_text(dir_ + "/cgroup.procs", pid)) {
          if (errno == ESRCH) continue;
          throw_errno("move process " + pid + " into " + dir_);
        }
        origins_[p] = *from;
        moved = true;
      }
      if (!write_text(control, v2_ ? "1" : "FROZEN")) throw_errno("freeze " + dir_);
      int waited = 0;
      while (!frozen()) {
        if (waited >= kFreezeWaitMs)
          throw Error("the sandbox's processes did not freeze within " +
                      std::to_string(kFreezeWaitMs / 1000) + " s");
        ::usleep(10000);
        waited += 10;
      }
      if (!moved || round >= 20) break;
    }
  } catch (...) {
    thaw();
    throw;
  }
}

SandboxFreeze::~SandboxFreeze() { thaw(); }

void SandboxFreeze::thaw() noexcept {
  if (dir_.empty()) return;
  write_text(dir_ + (v2_ ? "/cgroup.freeze" : "/freezer.state"), v2_ ? "0" : "THAWED");
  if (in_place_) {  // the sandbox's own cgroup: not ours to remove
    dir_.clear();
    return;
  }
  for (const auto& [pid, path] : origins_) {
    const std::string target = path == "/" ? hierarchy_root_ : hierarchy_root_ + path;
    write_text(target + "/cgroup.procs", std::to_string(pid));
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (::rmdir(dir_.c_str()) == 0 || errno == ENOENT) break;
    ::usleep(10000);
  }
  dir_.clear();
  origins_.clear();
}

}  // namespace openshell::runtime
