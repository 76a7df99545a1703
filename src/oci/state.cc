#include "oci/state.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "namespaces/userns.h"

namespace openshell::oci {

using nlohmann::json;

std::string default_state_root() {
  // Root of a nested user namespace (rootless Podman's) cannot write the
  // host's /run: it takes the invoking user's runtime directory, as runc.
  if (namespaces::is_host_root()) return "/run/openshell-runc";
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg && xdg[0] == '/') return std::string(xdg) + "/openshell-runc";
  return "/tmp/openshell-runc-" + std::to_string(::geteuid());
}

void check_id(const std::string& id) {
  bool ok = !id.empty() && id.size() <= 1024 && id != "." && id != "..";
  for (char c : id)
    ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                c == '_' || c == '+' || c == '-' || c == '.');
  if (!ok)
    throw Error("invalid container id \"" + id +
                "\": letters, digits and _+-. only, at most 1024 of them");
}

State read_state(const std::string& root, const std::string& id) {
  check_id(id);
  auto text = files::try_read(root + "/" + id + "/state.json");
  if (!text) throw Error("container " + id + " does not exist");
  json j = json::parse(*text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw Error("container " + id + ": its state file is damaged (" + root + "/" + id + ")");
  State s;
  s.id = id;
  s.bundle = j.value("bundle", "");
  s.oci_version = j.value("ociVersion", "");
  s.created = j.value("created", "");
  s.pid = j.value("pid", 0);
  s.pid_start = j.value("pidStart", uint64_t{0});
  s.monitor_pid = j.value("monitorPid", 0);
  s.started = j.value("started", false);
  s.owner = j.value("owner", 0u);
  s.rootfs = j.value("rootfs", "");
  if (j.contains("annotations") && j["annotations"].is_object())
    for (const auto& [k, v] : j["annotations"].items())
      if (v.is_string()) s.annotations[k] = v.get<std::string>();
  if (j.contains("cgroupDirs") && j["cgroupDirs"].is_array())
    for (const auto& d : j["cgroupDirs"])
      if (d.is_string()) s.cgroup_dirs.push_back(d.get<std::string>());
  return s;
}

void write_state(const std::string& root, const State& s) {
  json j = {{"ociVersion", s.oci_version},
            {"id", s.id},
            {"bundle", s.bundle},
            {"created", s.created},
            {"pid", s.pid},
            {"pidStart", s.pid_start},
            {"monitorPid", s.monitor_pid},
            {"started", s.started},
            {"owner", s.owner},
            {"rootfs", s.rootfs},
            {"annotations", s.annotations},
            {"cgroupDirs", s.cgroup_dirs}};
  files::write_atomically(root + "/" + s.id + "/state.json", j.dump() + "\n", 0600);
}

std::vector<std::string> list_ids(const std::string& root) {
  std::vector<std::string> ids;
  DIR* dir = ::opendir(root.c_str());
  if (!dir) return ids;
  while (dirent* e = ::readdir(dir)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    if (files::exists(root + "/" + name + "/state.json")) ids.push_back(name);
  }
  ::closedir(dir);
  std::sort(ids.begin(), ids.end());
  return ids;
}

uint64_t process_start(pid_t pid) {
  if (pid <= 0) return 0;
  auto stat = files::try_read("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return 0;
  // The command may hold spaces and parentheses: fields follow the last ')'.
  size_t close = stat->rfind(')');
  if (close == std::string::npos) return 0;
  auto fields = text::split(stat->substr(close + 2), ' ');
  // fields[0] is field 3 (state); start time is field 22.
  if (fields.size() < 20 || fields[0] == "Z" || fields[0] == "X") return 0;
  return text::parse_uint(fields[19]).value_or(0);
}

std::string live_status(const State& s) {
  if (s.pid <= 0 || process_start(s.pid) != s.pid_start) return "stopped";
  // A frozen cgroup (oci pause): paused.
  for (const auto& dir : s.cgroup_dirs) {
    if (auto v1 = files::try_read(dir + "/freezer.state"))
      if (text::trim(*v1) == "FROZEN") return "paused";
    if (auto v2 = files::try_read(dir + "/cgroup.freeze"))
      if (text::trim(*v2) == "1") return "paused";
  }
  return s.started ? "running" : "created";
}

json spec_state(const State& s, const std::string& status) {
  json j = {{"ociVersion", s.oci_version.empty() ? "1.0.2" : s.oci_version},
            {"id", s.id},
            {"status", status},
            {"bundle", s.bundle},
            {"rootfs", s.rootfs},
            {"created", s.created},
            {"owner", ""},
            {"annotations", s.annotations}};
  j["pid"] = status == "stopped" ? 0 : s.pid;
  return j;
}

std::vector<pid_t> container_pids(const State& s) {
  std::vector<pid_t> pids;
  if (live_status(s) == "stopped") return pids;
  struct stat init_ns {};
  if (::stat(("/proc/" + std::to_string(s.pid) + "/ns/pid").c_str(), &init_ns) != 0) return pids;
  DIR* dir = ::opendir("/proc");
  if (!dir) return pids;
  while (dirent* e = ::readdir(dir)) {
    auto pid = text::parse_uint(e->d_name, 1u << 22);
    if (!pid) continue;
    struct stat ns {};
    if (::stat(("/proc/" + std::string(e->d_name) + "/ns/pid").c_str(), &ns) == 0 &&
        ns.st_ino == init_ns.st_ino && ns.st_dev == init_ns.st_dev)
      pids.push_back(static_cast<pid_t>(*pid));
  }
  ::closedir(dir);
  std::sort(pids.begin(), pids.end());
  return pids;
}

}  // namespace openshell::oci
