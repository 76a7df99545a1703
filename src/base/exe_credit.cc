#include "base/exe_credit.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>

#include "base/directory.h"
#include "base/files.h"
#include "base/text.h"
#include "base/unique_fd.h"

namespace openshell::credit {

namespace {

std::string without_deleted(std::string path) {
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() &&
      path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
    path.resize(path.size() - deleted.size());
  return path;
}

// The process's real and effective uid, as /proc numbers them.
std::vector<uid_t> uids_of(pid_t pid) {
  auto status = files::try_read("/proc/" + std::to_string(pid) + "/status");
  std::vector<uid_t> out;
  if (!status) return out;
  for (const auto& line : text::split(*status, '\n')) {
    if (line.rfind("Uid:", 0) != 0) continue;
    for (const auto& word : text::split(line.substr(4), '\t'))
      if (auto uid = text::parse_uint(text::trim(word))) out.push_back(static_cast<uid_t>(*uid));
  }
  return out;
}

// Why the file at `path` in the process's root (or its directory) is one
// the process could have written; "" when it could not.
std::string writable_by(pid_t pid, const std::string& path, const std::vector<uid_t>& uids) {
  UniqueFd root(
      ::open(("/proc/" + std::to_string(pid) + "/root").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return "its root cannot be opened";
  for (std::string p = path; p.size() > 1; p = p.substr(0, std::max<size_t>(p.rfind('/'), 1))) {
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS;
    UniqueFd fd(
        static_cast<int>(::syscall(SYS_openat2, root.get(), p.c_str() + 1, &how, sizeof how)));
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) return p + " cannot be examined";
    if (st.st_mode & (S_IWGRP | S_IWOTH)) return p + " is group- or world-writable";
    if (std::find(uids.begin(), uids.end(), st.st_uid) != uids.end())
      return p + " belongs to the process's user";
    if (p == path && !S_ISREG(st.st_mode)) return p + " is not a regular file";
    if (p != path) break;  // the file and the directory holding it
  }
  return {};
}

}  // namespace

std::string environment_problem(std::string_view environ_bytes) {
  for (const auto& entry : text::split(environ_bytes, '\0')) {
    for (const char* name : {"LD_PRELOAD=", "LD_AUDIT="}) {
      const size_t n = std::strlen(name);
      if (entry.size() > n && entry.compare(0, n, name) == 0)
        return std::string(name, n - 1) + " in its environment";
    }
  }
  return {};
}

std::vector<std::string> executable_files(std::string_view maps) {
  std::vector<std::string> out;
  for (const auto& line : text::split(maps, '\n')) {
    // address perms offset dev inode pathname
    std::vector<std::string> fields;
    size_t at = 0;
    for (int i = 0; i < 5 && at < line.size(); ++i) {
      size_t start = line.find_first_not_of(' ', at);
      if (start == std::string::npos) break;
      size_t end = line.find(' ', start);
      fields.push_back(
          line.substr(start, end == std::string::npos ? std::string::npos : end - start));
      at = end == std::string::npos ? line.size() : end;
    }
    if (fields.size() < 5 || fields[1].size() < 3 || fields[1][2] != 'x' || fields[4] == "0")
      continue;
    size_t path = line.find_first_not_of(' ', at);
    out.push_back(path == std::string::npos ? std::string() : line.substr(path));
  }
  return out;
}

bool library_path_allowed(const std::string& path, const std::string& exe) {
  if (path.empty() || path[0] != '/' || path.find("/../") != std::string::npos ||
      path.find("/./") != std::string::npos)
    return false;
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() &&
      path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
    return false;
  std::vector<std::string> dirs = {"/lib/",       "/lib32/",     "/lib64/",        "/usr/lib/",
                                   "/usr/lib32/", "/usr/lib64/", "/usr/local/lib/"};
  // PREFIX/bin/NAME: PREFIX/lib and PREFIX/lib64 are its own.
  size_t name = exe.rfind('/');
  if (name != std::string::npos && name >= 4 && exe.compare(name - 4, 4, "/bin") == 0 && name > 4) {
    std::string prefix = exe.substr(0, name - 4);
    dirs.push_back(prefix + "/lib/");
    dirs.push_back(prefix + "/lib64/");
  }
  for (const auto& dir : dirs)
    if (path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0) return true;
  return false;
}

uint64_t loopback_socket_inode(std::string_view table, uint16_t client_port, uint16_t server_port) {
  char local[32], remote[32];
  std::snprintf(local, sizeof local, "0100007F:%04X", client_port);
  std::snprintf(remote, sizeof remote, "0100007F:%04X", server_port);
  for (const auto& line : text::split(table, '\n')) {
    // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid timeout inode
    std::vector<std::string> fields;
    for (const auto& f : text::split(text::trim(line), ' '))
      if (!f.empty()) fields.push_back(f);
    if (fields.size() < 10 || fields[1] != local || fields[2] != remote) continue;
    return text::parse_uint(fields[9]).value_or(0);
  }
  return 0;
}

// The links are read relative to the fd directory: a lookup of one name,
// not of a whole /proc path, for each.
bool holds_socket(pid_t pid, std::string_view wanted, size_t* budget) {
  UniqueFd dir(
      ::open(("/proc/" + std::to_string(pid) + "/fd").c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return false;
  bool found = false;
  files::for_each_entry(dir.get(), [&](const char* name, unsigned char) {
    if (*budget == 0) return false;
    --*budget;
    char link[64];
    ssize_t n = ::readlinkat(dir.get(), name, link, sizeof link);
    found = n == static_cast<ssize_t>(wanted.size()) &&
            std::memcmp(link, wanted.data(), wanted.size()) == 0;
    return !found;
  });
  return found;
}

Judgement judge(pid_t pid, bool examine) {
  Judgement caller;
  const std::string base = "/proc/" + std::to_string(pid);
  // A deleted or replaced binary reads "PATH (deleted)".
  caller.exe = without_deleted(files::read_link(base + "/exe"));
  if (caller.exe.empty()) return caller;
  if (!examine) {
    caller.untrusted = "it was not examined (no rule named binaries when it connected)";
    return caller;
  }
  auto environ = files::try_read(base + "/environ");
  if (!environ) {
    caller.untrusted = "its environment cannot be read";
    return caller;
  }
  caller.untrusted = environment_problem(*environ);
  if (!caller.untrusted.empty()) return caller;
  auto maps = files::try_read(base + "/maps");
  if (!maps) {
    caller.untrusted = "its memory map cannot be read";
    return caller;
  }
  std::optional<std::vector<uid_t>> uids;  // read when a library needs them
  std::vector<std::string> checked;
  for (const auto& path : executable_files(*maps)) {
    if (path == caller.exe || std::find(checked.begin(), checked.end(), path) != checked.end())
      continue;
    if (!library_path_allowed(path, caller.exe)) {
      caller.untrusted = "code mapped from " + path;
      return caller;
    }
    if (!uids) uids = uids_of(pid);
    if (auto why = writable_by(pid, path, *uids); !why.empty()) {
      caller.untrusted = "code mapped from " + path + ", and " + why;
      return caller;
    }
    checked.push_back(path);
  }
  return caller;
}

uint64_t start_time(pid_t pid) {
  auto stat = files::try_read("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return 0;
  size_t paren = stat->rfind(')');  // the name may hold spaces and parentheses
  if (paren == std::string::npos) return 0;
  auto fields = text::split(std::string_view(*stat).substr(paren + 2), ' ');
  return fields.size() > 19 ? text::parse_uint(fields[19]).value_or(0) : 0;
}

}  // namespace openshell::credit
