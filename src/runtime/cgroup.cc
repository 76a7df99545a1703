#include "runtime/cgroup.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <set>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"

namespace openshell::runtime {

namespace {

constexpr uint64_t kCpuPeriodUs = 100000;

// mountinfo escapes space, tab, newline and backslash as \ooo.
std::string unescape_mountinfo(std::string_view field) {
  std::string out;
  for (size_t i = 0; i < field.size(); ++i) {
    if (field[i] == '\\' && i + 3 < field.size()) {
      int value = 0;
      bool ok = true;
      for (size_t k = 1; k <= 3; ++k) {
        char c = field[i + k];
        if (c < '0' || c > '7') ok = false;
        value = value * 8 + (c - '0');
      }
      if (ok) {
        out += static_cast<char>(value);
        i += 3;
        continue;
      }
    }
    out += field[i];
  }
  return out;
}

// Our path relative to a mount that shows the hierarchy from `root`.
std::string below_root(const std::string& path, const std::string& root) {
  if (root == "/" || root.empty()) return path;
  if (path == root) return "/";
  if (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
      path[root.size()] == '/')
    return path.substr(root.size());
  return path;
}

std::string join_path(const std::string& mount, const std::string& path) {
  if (path == "/" || path.empty()) return mount;
  return mount + path;
}

bool permission_error(int err) { return err == EACCES || err == EPERM || err == EROFS; }

std::string knob_value(const std::string& path) {
  auto text = files::try_read(path);
  return text ? std::string(text::trim(*text)) : std::string();
}

}  // namespace

std::string DeviceRule::text() const {
  return std::string(1, type) + " " + std::to_string(major) + ":" +
         (minor ? std::to_string(*minor) : std::string("*")) + " " + access;
}

std::vector<DeviceRule> default_device_rules() {
  std::vector<DeviceRule> rules;
  for (uint32_t minor : {3u, 5u, 7u, 8u, 9u}) rules.push_back({'c', 1, minor, "rwm"});
  rules.push_back({'c', 5, 0, "rwm"});               // /dev/tty
  rules.push_back({'c', 5, 2, "rwm"});               // /dev/ptmx
  rules.push_back({'c', 136, std::nullopt, "rwm"});  // /dev/pts/*
  return rules;
}

CgroupLayout CgroupLayout::parse(std::string_view proc_self_cgroup, std::string_view mountinfo) {
  // Our path in each hierarchy, keyed by its controller list ("" for v2).
  std::map<std::string, std::string> paths;
  for (const auto& raw : text::split(proc_self_cgroup, '\n')) {
    auto line = text::trim(raw);
    if (line.empty()) continue;
    size_t first = line.find(':');
    size_t second = line.find(':', first + 1);
    if (first == std::string_view::npos || second == std::string_view::npos) continue;
    paths[std::string(line.substr(first + 1, second - first - 1))] =
        std::string(line.substr(second + 1));
  }
  CgroupLayout layout;
  for (const auto& raw : text::split(mountinfo, '\n')) {
    // id parent major:minor root mountpoint options [optional...] - fstype source superoptions
    auto fields = text::split(text::trim(raw), ' ');
    size_t dash = 0;
    while (dash < fields.size() && fields[dash] != "-") ++dash;
    if (dash < 5 || dash + 3 > fields.size()) continue;
    const std::string& fstype = fields[dash + 1];
    std::string root = unescape_mountinfo(fields[3]);
    std::string mountpoint = unescape_mountinfo(fields[4]);
    if (fstype == "cgroup2") {
      auto it = paths.find("");
      if (it == paths.end() || layout.unified) continue;
      // The mount shows the hierarchy from `root`; our path is relative to the top.
      layout.unified =
          Hierarchy{join_path(mountpoint, below_root(it->second, root)), mountpoint, root};
    } else if (fstype == "cgroup") {
      for (const auto& option : text::split(fields[dash + 3], ',')) {
        if (option == "rw" || option == "ro" || option.find('=') != std::string::npos) continue;
        // Find our line for the hierarchy holding this controller.
        for (const auto& [controllers, path] : paths) {
          for (const auto& c : text::split(controllers, ','))
            if (c == option && !layout.controllers.count(option)) {
              layout.controllers[option] =
                  Hierarchy{join_path(mountpoint, below_root(path, root)), mountpoint, root};
            }
        }
      }
    }
  }
  return layout;
}

std::string CgroupLayout::Hierarchy::at(const std::string& cgroup_path) const {
  return join_path(mountpoint, below_root(cgroup_path, root));
}

CgroupLayout CgroupLayout::discover() {
  return parse(files::try_read("/proc/self/cgroup").value_or(""),
               files::try_read("/proc/self/mountinfo").value_or(""));
}

CgroupSet& CgroupSet::operator=(CgroupSet&& other) noexcept {
  if (this != &other) {
    remove();
    dirs_ = std::move(other.dirs_);
    v1_dirs_ = std::move(other.v1_dirs_);
    memory_dir_ = std::move(other.memory_dir_);
    memory_v2_ = other.memory_v2_;
    keep_ = other.keep_;
    unified_fd_ = std::move(other.unified_fd_);
  }
  return *this;
}

CgroupSet::~CgroupSet() { remove(); }

CgroupSet CgroupSet::create(const CgroupLayout& layout, const std::string& name,
                            const Limits& limits, std::vector<std::string>* not_enforced) {
  CgroupSet set;
  const bool own_path = !name.empty() && name[0] == '/';
  if (!limits.any() && !own_path) return set;
  if (own_path &&
      (name.find("/../") != std::string::npos || name.find("/./") != std::string::npos ||
       name.size() < 2 || name.substr(name.size() - 3) == "/.."))
    throw Error("cgroup path " + name + ": no \".\" or \"..\" components");

  struct Want {
    std::string controller;
    std::string flag;
  };
  std::vector<Want> wants;
  if (limits.memory_bytes) wants.push_back({"memory", "--memory"});
  if (limits.pids) wants.push_back({"pids", "--pids"});
  if (limits.cpus) wants.push_back({"cpu", "--cpus"});
  if (limits.devices) wants.push_back({"devices", "--gpu"});
  // An own path is made for the engine's statistics and freezing too; a
  // controller missing here is no limit lost (flag "").
  if (own_path)
    for (const char* c : {"memory", "pids", "cpu", "cpuacct", "freezer", "blkio"})
      if (std::none_of(wants.begin(), wants.end(),
                       [&](const Want& w) { return w.controller == c; }))
        wants.push_back({c, ""});

  // Decide the hierarchy of each controller.
  std::vector<Want> on_v2;
  std::map<std::string, Want> on_v1;
  for (const auto& want : wants) {
    bool v2 = false;
    if (layout.unified && !(own_path && want.flag.empty())) {
      std::string parent =
          own_path ? layout.unified->at(name.substr(0, name.rfind('/'))) : layout.unified->dir;
      auto enabled = text::split(knob_value(parent + "/cgroup.subtree_control"), ' ');
      v2 = std::find(enabled.begin(), enabled.end(), want.controller) != enabled.end();
      if (!v2) {
        auto available = text::split(knob_value(parent + "/cgroup.controllers"), ' ');
        if (std::find(available.begin(), available.end(), want.controller) != available.end())
          v2 = files::write_once(parent + "/cgroup.subtree_control", "+" + want.controller) == 0;
      }
    }
    if (v2) {
      on_v2.push_back(want);
    } else if (layout.controllers.count(want.controller)) {
      on_v1[want.controller] = want;
    } else if (!want.flag.empty()) {
      // cgroup v2 filters devices with a BPF program, which openshell does
      // not load: there, only the nodes bound into /dev bound what opens.
      not_enforced->push_back(want.flag + ": no cgroup hierarchy has the " + want.controller +
                              " controller" +
                              (want.controller == "devices"
                                   ? " (cgroup v2's device filter is a BPF program, not loaded)"
                                   : ""));
    }
  }

  auto make_dir = [&](const CgroupLayout::Hierarchy& hierarchy,
                      const std::vector<Want>& for_wants) -> std::string {
    std::string dir = own_path ? hierarchy.at(name) : hierarchy.dir + "/" + name;
    if (own_path) {
      // Its parents stay, as other containers' may share them.
      for (size_t slash = dir.find('/', hierarchy.mountpoint.size() + 1);
           slash != std::string::npos; slash = dir.find('/', slash + 1))
        if (::mkdir(dir.substr(0, slash).c_str(), 0755) != 0 && errno != EEXIST) break;
    }
    if (::mkdir(dir.c_str(), 0755) != 0) {
      int err = errno;
      if (permission_error(err)) {
        for (const auto& w : for_wants)
          if (!w.flag.empty())
            not_enforced->push_back(w.flag + ": " +
                                    errno_message("cannot create cgroup " + dir, err));
        return {};
      }
      throw_errno("create cgroup " + dir, err);
    }
    set.dirs_.push_back(dir);
    return dir;
  };

  auto write_limits = [&](const std::string& dir, const std::string& controller, bool v2) {
    if (controller == "memory" && !limits.memory_bytes) {
      set.memory_dir_ = dir;  // for oom_kills()
      set.memory_v2_ = v2;
    } else if (controller == "memory") {
      set.memory_dir_ = dir;
      set.memory_v2_ = v2;
      std::string bytes = std::to_string(*limits.memory_bytes);
      files::write(dir + (v2 ? "/memory.max" : "/memory.limit_in_bytes"), bytes);
      // Swap must not let the sandbox step around the limit; these knobs are
      // absent where swap accounting is off.
      if (v2)
        files::write_once(dir + "/memory.swap.max", "0");
      else if (files::exists(dir + "/memory.memsw.limit_in_bytes"))
        files::write_once(dir + "/memory.memsw.limit_in_bytes", bytes);
    } else if (controller == "devices" && limits.devices) {
      files::write(dir + "/devices.deny", "a");
      for (const auto& rule : *limits.devices) files::write(dir + "/devices.allow", rule.text());
    } else if (controller == "pids" && limits.pids) {
      files::write(dir + "/pids.max", std::to_string(*limits.pids));
    } else if (controller == "cpu" && limits.cpus) {
      auto quota = static_cast<uint64_t>(std::llround(*limits.cpus * kCpuPeriodUs));
      if (quota < 1000) quota = 1000;  // the kernel's minimum quota is 1 ms
      if (v2) {
        files::write(dir + "/cpu.max", std::to_string(quota) + " " + std::to_string(kCpuPeriodUs));
      } else {
        files::write(dir + "/cpu.cfs_period_us", std::to_string(kCpuPeriodUs));
        files::write(dir + "/cpu.cfs_quota_us", std::to_string(quota));
      }
    }
  };

  if (!on_v2.empty()) {
    std::string dir = make_dir(*layout.unified, on_v2);
    if (!dir.empty()) {
      for (const auto& w : on_v2) write_limits(dir, w.controller, true);
      set.unified_fd_.reset(::open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
      if (!set.unified_fd_) throw_errno("open cgroup " + dir);
    }
  }
  // v1 hierarchies may hold several controllers (cpu,cpuacct): one dir each.
  std::map<std::string, std::string> made;
  for (const auto& [controller, want] : on_v1) {
    const CgroupLayout::Hierarchy& hierarchy = layout.controllers.at(controller);
    const std::string& parent = hierarchy.dir;  // one per hierarchy (cpu,cpuacct share it)
    std::string dir;
    if (auto it = made.find(parent); it != made.end()) {
      dir = it->second;
    } else {
      dir = make_dir(hierarchy, {want});
      if (dir.empty()) continue;
      made[parent] = dir;
      set.v1_dirs_.push_back(dir);
    }
    write_limits(dir, controller, false);
  }
  return set;
}

std::vector<UniqueFd> CgroupSet::open_for_self_join() {
  std::vector<UniqueFd> fds;
  std::vector<std::string> rest;
  for (const auto& dir : v1_dirs_) {
    UniqueFd fd(::open((dir + "/tasks").c_str(), O_WRONLY | O_CLOEXEC));
    if (fd)
      fds.push_back(std::move(fd));
    else
      rest.push_back(dir);
  }
  v1_dirs_ = std::move(rest);
  return fds;
}

void CgroupSet::attach(pid_t pid) const {
  for (const auto& dir : v1_dirs_) files::write(dir + "/cgroup.procs", std::to_string(pid));
}

int CgroupSet::oom_kills() const {
  if (memory_dir_.empty()) return 0;
  // v2: memory.events; v1: memory.oom_control. Both hold "oom_kill N".
  auto text =
      files::try_read(memory_dir_ + (memory_v2_ ? "/memory.events" : "/memory.oom_control"));
  if (!text) return 0;
  for (const auto& line : text::split(*text, '\n')) {
    auto fields = text::split(text::trim(line), ' ');
    if (fields.size() == 2 && fields[0] == "oom_kill")
      return static_cast<int>(text::parse_uint(fields[1], INT32_MAX).value_or(0));
  }
  return 0;
}

void CgroupSet::remove() noexcept {
  if (keep_) return;
  // Tasks of a sandbox that just ended may still be leaving the cgroup: on
  // a loaded machine that has taken more than a second. Wait up to 10 s
  // (as the reaper does for an owner that died), then say what is left.
  for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
    for (int attempt = 0;; ++attempt) {
      if (::rmdir(it->c_str()) == 0 || errno == ENOENT) break;
      if (errno != EBUSY || attempt == 2000) {
        log::warn(errno_message("remove cgroup " + *it, errno));
        break;
      }
      timespec pause{0, attempt < 20 ? 100000L : 5000000L};
      ::nanosleep(&pause, nullptr);
    }
  }
  dirs_.clear();
  v1_dirs_.clear();
  memory_dir_.clear();
  unified_fd_.reset();
}

}  // namespace openshell::runtime
