#include "image/resolve.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <string_view>

#include "base/unique_fd.h"

namespace openshell::image {

namespace {

// As the kernel bounds a path's links (MAXSYMLINKS).
constexpr int kMaxLinks = 40;

std::deque<std::string> components(std::string_view text) {
  std::deque<std::string> parts;
  for (size_t start = 0; start <= text.size();) {
    const size_t end = std::min(text.find('/', start), text.size());
    parts.emplace_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

bool is_whiteout(const struct stat& st) {
  return S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0);
}

// O_PATH descriptors take no fgetxattr; their /proc/self/fd link does.
bool is_opaque(int dir_fd) {
  char value[2] = {0, 0};
  const std::string link = "/proc/self/fd/" + std::to_string(dir_fd);
  return ::getxattr(link.c_str(), "user.overlay.opaque", value, 1) == 1 && value[0] == 'y';
}

UniqueFd open_dir(int parent, const char* name) {
  return UniqueFd(::openat(parent, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
}

// The layers' directories that make the merged directory `name` of the
// directory `layers` make (top first), given that the first of them with
// the name, `top`, has a directory there: it, and those below it that have
// one too, down to the first opaque one or the first with anything else
// there (which hides the rest, as overlayfs stacks them).
std::vector<UniqueFd> merged_dir(const std::vector<UniqueFd>& layers, size_t top,
                                 const std::string& name) {
  std::vector<UniqueFd> dirs;
  for (size_t i = top; i < layers.size(); ++i) {
    struct stat st;
    if (::fstatat(layers[i].get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) continue;
      break;
    }
    if (!S_ISDIR(st.st_mode)) break;
    UniqueFd dir = open_dir(layers[i].get(), name.c_str());
    if (!dir) break;
    const bool opaque = is_opaque(dir.get());
    dirs.push_back(std::move(dir));
    if (opaque) break;
  }
  return dirs;
}

}  // namespace

std::string resolve_in_layers(const std::vector<std::string>& layer_roots_top_first,
                              const std::string& path) {
  // dirs[k]: the layers' directories that merge into the directory that
  // resolved[0..k) names; none of those names is a link, so the result
  // is the file's own name.
  std::vector<std::vector<UniqueFd>> dirs(1);
  for (const auto& root : layer_roots_top_first) {
    UniqueFd fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (fd) dirs[0].push_back(std::move(fd));
  }
  std::vector<std::string> resolved;
  std::deque<std::string> pending = components(path);
  int links = 0;
  while (!pending.empty()) {
    const std::string name = std::move(pending.front());
    pending.pop_front();
    if (name.empty() || name == ".") continue;
    if (name == "..") {  // the directory's parent; at the top, the top
      if (!resolved.empty()) {
        resolved.pop_back();
        dirs.pop_back();
      }
      continue;
    }
    const std::vector<UniqueFd>& here = dirs.back();
    size_t top = 0;
    struct stat st {};
    for (; top < here.size(); ++top) {
      if (::fstatat(here[top].get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) break;
      if (errno != ENOENT) return path;  // not searchable: not something we may say
    }
    if (top == here.size() || is_whiteout(st)) return path;
    if (S_ISLNK(st.st_mode)) {
      if (++links > kMaxLinks) return path;
      char target[4096];
      const ssize_t n = ::readlinkat(here[top].get(), name.c_str(), target, sizeof target);
      if (n <= 0 || static_cast<size_t>(n) == sizeof target) return path;
      const std::string_view text(target, static_cast<size_t>(n));
      std::deque<std::string> parts = components(text);
      pending.insert(pending.begin(), parts.begin(), parts.end());
      if (text.front() == '/') {  // from the root of the sandbox, not the host's
        resolved.clear();
        dirs.resize(1);
      }
      continue;
    }
    if (S_ISDIR(st.st_mode)) {
      std::vector<UniqueFd> below = merged_dir(here, top, name);
      if (below.empty()) return path;
      resolved.push_back(name);
      dirs.push_back(std::move(below));
      continue;
    }
    // A file: it must be the last component ("file/" is not a directory).
    if (!pending.empty()) return path;
    resolved.push_back(name);
  }
  std::string out;
  for (const auto& part : resolved) out += "/" + part;
  return out.empty() ? "/" : out;
}

}  // namespace openshell::image
