#include "runtime/freeze.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

// "/x/y" of the freezer line of /proc/PID/cgroup ("6:freezer:/x/y").
std::optional<std::string> freezer_path(const std::string& pid) {
  auto text = files::try_read("/proc/" + pid + "/cgroup");
  if (!text) return std::nullopt;
  for (const auto& line : text::split(*text, '\n')) {
    const size_t first = line.find(':');
    const size_t second = first == std::string::npos ? first : line.find(':', first + 1);
    if (second == std::string::npos) continue;
    for (const auto& c : text::split(line.substr(first + 1, second - first - 1), ','))
      if (c == "freezer") return line.substr(second + 1);
  }
  return std::nullopt;
}

// This process's freezer cgroup directory, and the hierarchy's mount.
bool freezer_dirs(std::string* own, std::string* root) {
  CgroupLayout layout = CgroupLayout::discover();
  auto it = layout.controllers.find("freezer");
  auto path = freezer_path("self");
  if (it == layout.controllers.end() || !path) return false;
  *own = it->second.dir;
  *root = *path == "/" ? *own : own->substr(0, own->size() - path->size());
  return ::access(own->c_str(), W_OK) == 0;
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
  std::string own, root;
  return freezer_dirs(&own, &root);
}

SandboxFreeze::SandboxFreeze(pid_t init_pid, const std::string& name) {
  std::string own;
  if (!freezer_dirs(&own, &hierarchy_root_))
    throw Error("no freezer cgroup this gateway may use (a v1 freezer hierarchy, as root)");
  const std::string ns = pid_namespace(std::to_string(init_pid));
  if (ns.empty()) throw Error("the sandbox's init (pid " + std::to_string(init_pid) + ") is gone");
  dir_ = own + "/" + name;
  if (::mkdir(dir_.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + dir_);
  try {
    // Moved in, frozen, and looked at again: a process forked by one not
    // yet moved may have escaped the first round.
    for (int round = 0;; ++round) {
      bool moved = false;
      for (const auto& pid : processes_in(ns)) {
        const pid_t p = static_cast<pid_t>(std::stol(pid));
        if (origins_.count(p)) continue;
        auto from = freezer_path(pid);
        if (!from) continue;  // gone meanwhile
        if (!write_text(dir_ + "/cgroup.procs", pid)) {
          if (errno == ESRCH) continue;
          throw_errno("move process " + pid + " into " + dir_);
        }
        origins_[p] = *from;
        moved = true;
      }
      if (!write_text(dir_ + "/freezer.state", "FROZEN")) throw_errno("freeze " + dir_);
      int waited = 0;
      while (text::trim(files::try_read(dir_ + "/freezer.state").value_or("")) != "FROZEN") {
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
  write_text(dir_ + "/freezer.state", "THAWED");
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
