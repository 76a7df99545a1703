#include "base/root_files.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace openshell::files {

namespace {

// openat2 of path in root; EAGAIN (a rename raced the lookup) is tried again.
int open_in_root(int root, const std::string& path, uint64_t flags) {
  open_how how{};
  // openat2 takes with O_PATH no flags but O_DIRECTORY and O_NOFOLLOW.
  how.flags = flags | O_CLOEXEC | ((flags & O_PATH) ? 0 : O_NOCTTY);
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  const size_t start = path.find_first_not_of('/');
  const std::string relative = start == std::string::npos ? std::string(".") : path.substr(start);
  long fd = -1;
  for (int attempt = 0; attempt < 16; ++attempt) {
    fd = ::syscall(SYS_openat2, root, relative.c_str(), &how, sizeof how);
    if (fd >= 0 || errno != EAGAIN) break;
  }
  return static_cast<int>(fd);
}

UniqueFd open_root(const std::string& root, const std::string& shown) {
  UniqueFd dir(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!dir) {
    const int err = errno;
    throw_errno("open " + shown, err);
  }
  return dir;
}

std::string shown_path(const std::string& root, const std::string& path) {
  std::string out = root;
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  if (out == "/") out.clear();
  return out + (path.empty() || path.front() != '/' ? "/" : "") + path;
}

}  // namespace

std::optional<std::string> read_in_root(const std::string& root, const std::string& path,
                                        size_t max) {
  const std::string shown = shown_path(root, path);
  UniqueFd dir = open_root(root, root);
  // O_NONBLOCK: a FIFO does not block the open; and nothing is read before
  // it is known to be a regular file.
  UniqueFd file(open_in_root(dir.get(), path, O_RDONLY | O_NONBLOCK));
  if (!file) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return std::nullopt;
    if (err == ELOOP) throw Error(shown + ": too many levels of symbolic links");
    throw_errno("open " + shown, err);
  }
  struct stat st;
  if (::fstat(file.get(), &st) != 0) {
    const int err = errno;
    throw_errno("stat " + shown, err);
  }
  if (!S_ISREG(st.st_mode)) throw Error(shown + ": not a regular file");
  if (static_cast<uint64_t>(st.st_size) > max)
    throw Error(shown + ": larger than " + std::to_string(max >> 20) + " MiB");
  std::string out;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(file.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      throw_errno("read " + shown, err);
    }
    if (n == 0) break;
    // It may grow while it is read.
    if (out.size() + static_cast<size_t>(n) > max)
      throw Error(shown + ": larger than " + std::to_string(max >> 20) + " MiB");
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

LayerEntry layer_entry(const std::string& root, const std::string& path, std::string* link_target) {
  const std::string shown = shown_path(root, path);
  UniqueFd dir = open_root(root, root);
  UniqueFd found(open_in_root(dir.get(), path, O_PATH | O_NOFOLLOW));
  if (!found) {
    const int err = errno;
    if (err == ENOENT || err == ENOTDIR) return LayerEntry::kAbsent;
    if (err == ELOOP) return LayerEntry::kPresent;  // a loop of this layer's: read_in_root says so
    throw_errno("open " + shown, err);
  }
  struct stat st;
  if (::fstat(found.get(), &st) != 0) {
    const int err = errno;
    throw_errno("stat " + shown, err);
  }
  if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) return LayerEntry::kWhiteout;
  if (S_ISLNK(st.st_mode) && link_target) {
    char buf[4096];
    ssize_t n = ::readlinkat(found.get(), "", buf, sizeof buf);
    if (n < 0) {
      const int err = errno;
      throw_errno("read the link " + shown, err);
    }
    link_target->assign(buf, static_cast<size_t>(n));
    return LayerEntry::kSymlink;
  }
  return LayerEntry::kPresent;
}

std::string join_in_root(const std::string& dir, const std::string& target) {
  std::vector<std::string> parts;
  auto add = [&parts](const std::string& text) {
    for (size_t start = 0; start <= text.size();) {
      size_t end = std::min(text.find('/', start), text.size());
      const std::string part = text.substr(start, end - start);
      if (part == "..") {
        if (!parts.empty()) parts.pop_back();
      } else if (!part.empty() && part != ".") {
        parts.push_back(part);
      }
      start = end + 1;
    }
  };
  if (target.empty() || target.front() != '/') add(dir);
  add(target);
  std::string out;
  for (const auto& part : parts) out += (out.empty() ? "" : "/") + part;
  return out;
}

}  // namespace openshell::files
