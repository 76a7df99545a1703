#include "egress/identity.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "base/files.h"
#include "base/text.h"
#include "base/unique_fd.h"

namespace openshell::egress {

namespace {

std::string readlink_string(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

// The socket inode of 127.0.0.1:client -> 127.0.0.1:server in /proc/PID/net/tcp.
uint64_t socket_inode(pid_t pid, uint16_t client_port, uint16_t server_port) {
  auto table = files::try_read("/proc/" + std::to_string(pid) + "/net/tcp");
  if (!table) return 0;
  char local[32], remote[32];
  std::snprintf(local, sizeof local, "0100007F:%04X", client_port);
  std::snprintf(remote, sizeof remote, "0100007F:%04X", server_port);
  for (const auto& line : text::split(*table, '\n')) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    std::vector<std::string> fields;
    for (const auto& f : text::split(text::trim(line), ' '))
      if (!f.empty()) fields.push_back(f);
    if (fields.size() < 10 || fields[1] != local || fields[2] != remote) continue;
    return text::parse_uint(fields[9]).value_or(0);
  }
  return 0;
}

bool holds_socket(pid_t pid, const std::string& wanted) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = ::opendir(dir.c_str());
  if (!d) return false;
  bool found = false;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    if (readlink_string(dir + "/" + e->d_name) == wanted) {
      found = true;
      break;
    }
  }
  ::closedir(d);
  return found;
}

// init and its descendants, through /proc/PID/task/TID/children.
std::vector<pid_t> sandbox_processes(pid_t init_pid) {
  std::vector<pid_t> out = {init_pid};
  for (size_t i = 0; i < out.size() && out.size() < 65536; ++i) {
    std::string tasks = "/proc/" + std::to_string(out[i]) + "/task";
    DIR* d = ::opendir(tasks.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      if (e->d_name[0] == '.') continue;
      auto children = files::try_read(tasks + "/" + e->d_name + "/children");
      if (!children) continue;
      for (const auto& word : text::split(text::trim(*children), ' '))
        if (auto child = text::parse_uint(word)) out.push_back(static_cast<pid_t>(*child));
    }
    ::closedir(d);
  }
  return out;
}

}  // namespace

Caller identify_tcp_client(pid_t init_pid, uint16_t client_port, uint16_t server_port) {
  Caller caller;
  uint64_t inode = socket_inode(init_pid, client_port, server_port);
  if (!inode) return caller;
  const std::string wanted = "socket:[" + std::to_string(inode) + "]";
  // Newest first: the process that just connected is likely a recent one.
  std::vector<pid_t> pids = sandbox_processes(init_pid);
  for (auto it = pids.rbegin(); it != pids.rend(); ++it) {
    if (!holds_socket(*it, wanted)) continue;
    caller.pid = *it;
    caller.exe = readlink_string("/proc/" + std::to_string(*it) + "/exe");
    // A deleted or replaced binary reads "PATH (deleted)".
    const std::string deleted = " (deleted)";
    if (caller.exe.size() > deleted.size() &&
        caller.exe.compare(caller.exe.size() - deleted.size(), deleted.size(), deleted) == 0)
      caller.exe.resize(caller.exe.size() - deleted.size());
    break;
  }
  return caller;
}

std::string resolve_in_sandbox(pid_t init_pid, const std::string& path) {
  std::string root = "/proc/" + std::to_string(init_pid) + "/root";
  UniqueFd root_fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd) return path;
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  std::string relative = path.empty() || path[0] != '/' ? path : path.substr(1);
  UniqueFd fd(static_cast<int>(::syscall(SYS_openat2, root_fd.get(), relative.c_str(), &how, sizeof how)));
  if (!fd) return path;
  // The kernel names it as the sandbox sees it (its root is the mount's).
  std::string resolved = readlink_string("/proc/self/fd/" + std::to_string(fd.get()));
  return resolved.empty() ? path : resolved;
}

}  // namespace openshell::egress
