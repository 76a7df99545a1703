// Writing a layer's entries below dest, directories finished last.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/directory.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "image/unpack_internal.h"

namespace openshell::image::unpack_detail {

void Extractor::refuse(const std::string& reason) const {
  throw Error(what_ + ": entry " + quoted(raw_name_) + ": " + reason);
}

void Extractor::fail_errno(const char* action) const {
  const int err = errno;
  fail_errno(std::string(action), err);
}

void Extractor::fail_errno(const std::string& action, int err) const {
  refuse(errno_message(action, err));
}

void Extractor::extract(archive_entry* entry) {
  ++result_.entries;
  const char* raw = archive_entry_pathname(entry);
  raw_name_ = raw ? raw : "";
  if (const char* why = normalize(raw_name_, &path_)) refuse(why);
  size_t slash = path_.rfind('/');
  leaf_at_ = slash == std::string::npos ? 0 : slash + 1;

  if (options_.account) {
    const bool data = archive_entry_filetype(entry) == AE_IFREG && !archive_entry_hardlink(entry);
    const int64_t size = data ? archive_entry_size(entry) : 0;
    options_.account(kEntryCost + (size > 0 ? static_cast<uint64_t>(size) : 0));
  }
  if (options_.whiteouts && !options_.from_sandbox) {
    if (const size_t at = whiteout_above(); at != std::string::npos) {
      if (path_.compare(at, 8, ".wh..wh.") == 0) return;  // inside aufs's own (".wh..wh.plnk/")
      refuse("goes through the whiteout name " + quoted(path_.substr(0, path_.find('/', at))));
    }
    if (std::strncmp(leaf(), ".wh.", 4) == 0) return make_whiteout();
  }
  if (const char* target = archive_entry_hardlink(entry)) return make_hard_link(target);
  const mode_t type = archive_entry_filetype(entry);
  if (type == AE_IFDIR) return make_directory(entry);
  if (path_.empty()) refuse("names the layer's root but is not a directory");
  const char* in = options_.from_sandbox ? "in files from a sandbox" : "in a layer";
  switch (type) {
    case AE_IFREG:
      return make_file(entry);
    case AE_IFLNK:
      return make_symlink(entry);
    case AE_IFIFO:
      if (options_.from_sandbox) refuse(std::string("FIFO (not allowed ") + in + ")");
      return make_fifo(entry);
    case AE_IFCHR:
      refuse(std::string("character device (device nodes are not allowed ") + in + ")");
    case AE_IFBLK:
      refuse(std::string("block device (device nodes are not allowed ") + in + ")");
    case AE_IFSOCK:
      refuse(std::string("socket (not allowed ") + in + ")");
    default:
      refuse("unknown entry type");
  }
}

// The current entry's parent directory, created as needed (0700 until
// finish_directories). Cached: the fd stays valid until the next call.
int Extractor::parent_fd() {
  std::string_view parent = parent_path();
  if (parent.empty()) return dest_.get();
  if (cached_fd_ && parent == cached_parent_) return cached_fd_.get();
  cached_fd_.reset();
  cached_parent_.assign(parent);
  int fd = open_beneath(dest_.get(), cached_parent_.c_str(), O_PATH | O_DIRECTORY);
  cached_fd_ = fd >= 0 ? UniqueFd(fd) : walk(cached_parent_, true, "");
  return cached_fd_.get();
}

// Opens dir one component at a time, creating missing ones when `create`
// says so, and says which component stands in the way. `role` starts the
// reason ("" for the entry itself, "hard link target 'x' ").
UniqueFd Extractor::walk(const std::string& dir, bool create, const std::string& role) {
  UniqueFd current;
  int at = dest_.get();
  for (size_t start = 0; start < dir.size();) {
    size_t end = std::min(dir.find('/', start), dir.size());
    component_.assign(dir, start, end - start);
    const std::string_view prefix(dir.data(), end);
    int fd = open_beneath(at, component_.c_str(), O_PATH | O_DIRECTORY);
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(at, component_.c_str(), 0700) != 0 && errno != EEXIST) {
        const int err = errno;
        fail_errno("create directory " + quoted(prefix), err);
      }
      directories_.try_emplace(std::string(prefix));
      fd = open_beneath(at, component_.c_str(), O_PATH | O_DIRECTORY);
    }
    if (fd < 0) {
      const int err = errno;
      const std::string name = quoted(prefix);
      switch (err) {
        case ELOOP:
          refuse(role + "goes through the symlink " + name);
        case EXDEV:
          refuse(role + "leaves the layer at " + name);
        case ENOTDIR:
          refuse(role + "goes through " + name + ", which is not a directory");
        case ENOENT:
          refuse(role + "goes through " + name + ", which does not exist");
        default:
          fail_errno("open directory " + name, err);
      }
    }
    current.reset(fd);
    at = fd;
    start = end + 1;
  }
  return current;
}

// make(), and when the name is taken, make() again in its place.
template <typename Make>
int Extractor::create_replacing(int parent, Make make) {
  int rc = make();
  if (rc < 0 && errno == EEXIST) {
    make_room(parent);
    rc = make();
  }
  return rc;
}

// Removes what the current entry replaces: a non-directory, or a directory
// with its contents.
void Extractor::make_room(int parent) {
  struct stat st;
  if (::fstatat(parent, leaf(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    fail_errno("stat what it replaces");
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent, leaf(), 0) != 0 && errno != ENOENT)
      fail_errno("remove what it replaces");
    return;
  }
  // The cached parent is this entry's own parent, so it survives unless it
  // lies below the directory removed.
  if (cached_parent_.size() > path_.size() && cached_parent_.compare(0, path_.size(), path_) == 0 &&
      cached_parent_[path_.size()] == '/')
    cached_fd_.reset();
  forget_directories(path_);
  if (int err = files::remove_tree_at(parent, leaf()))
    fail_errno("remove the directory it replaces", err);
}

void Extractor::forget_directories(const std::string& path) {
  directories_.erase(path);
  const std::string below = path + "/";
  auto it = directories_.lower_bound(below);
  while (it != directories_.end() && it->first.compare(0, below.size(), below) == 0)
    it = directories_.erase(it);
}

void Extractor::make_directory(archive_entry* entry) {
  DirectoryMetadata metadata;
  metadata.mode = mode_of(entry);
  metadata.mtime = mtime_of(entry);
  metadata.from_entry = true;
  if (keeps_owners()) owner_of(entry, &metadata.uid, &metadata.gid);
  if (!path_.empty()) {
    int parent = parent_fd();
    if (::mkdirat(parent, leaf(), 0700) != 0) {
      if (errno != EEXIST) fail_errno("create");
      struct stat st;
      if (::fstatat(parent, leaf(), &st, AT_SYMLINK_NOFOLLOW) != 0) fail_errno("stat");
      if (!S_ISDIR(st.st_mode)) {
        make_room(parent);
        if (::mkdirat(parent, leaf(), 0700) != 0) fail_errno("create");
      }
    }
  }
  directories_.insert_or_assign(path_, metadata);
}

void Extractor::make_file(archive_entry* entry) {
  int parent = parent_fd();
  UniqueFd file(create_replacing(parent, [&] {
    return ::openat(parent, leaf(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  }));
  if (!file) fail_errno("create");
  copy_data(file.get(), entry);
  set_metadata(file.get(), entry, true);
  const int64_t size = archive_entry_size(entry);
  if (size > 0) result_.content_bytes += static_cast<uint64_t>(size);
}

// Writes the entry's data; holes of a sparse entry stay holes.
void Extractor::copy_data(int fd, archive_entry* entry) {
  const void* block;
  size_t size;
  int64_t offset;
  int64_t end = 0;
  while (reader_.data(&block, &size, &offset)) {
    const char* data = static_cast<const char*>(block);
    for (size_t done = 0; done < size;) {
      ssize_t n = ::pwrite(fd, data + done, size - done, offset + static_cast<int64_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        fail_errno("write", err);
      }
      done += static_cast<size_t>(n);
    }
    end = std::max(end, offset + static_cast<int64_t>(size));
  }
  const int64_t size_wanted = archive_entry_size(entry);
  if (end < size_wanted && ::ftruncate(fd, size_wanted) != 0) fail_errno("write");
}

void Extractor::make_symlink(archive_entry* entry) {
  const char* target = archive_entry_symlink(entry);
  if (!target || !*target) refuse("symbolic link without a target");
  if (options_.from_sandbox) check_symlink_target(target);
  int parent = parent_fd();
  if (create_replacing(parent, [&] { return ::symlinkat(target, parent, leaf()); }) != 0)
    fail_errno("create");
  set_link_metadata(parent, entry);
}

void Extractor::make_fifo(archive_entry* entry) {
  int parent = parent_fd();
  if (create_replacing(parent, [&] { return ::mknodat(parent, leaf(), S_IFIFO | 0600, 0); }) != 0)
    fail_errno("create");
  // Opened (without blocking) to set its metadata through the fd: no name
  // lookup that could follow anything.
  UniqueFd fifo(::openat(parent, leaf(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  if (!fifo) fail_errno("open");
  set_metadata(fifo.get(), entry, false);
}

void Extractor::make_hard_link(const char* raw_target) {
  const std::string role = "hard link target " + quoted(raw_target) + " ";
  if (const char* why = normalize(raw_target, &target_))
    refuse(role.substr(0, role.size() - 1) + ": " + why);
  if (target_.empty() || path_.empty()) refuse("hard link to or from the layer's root");
  int parent = parent_fd();

  // The target's directory, resolved as strictly, but never created.
  size_t slash = target_.rfind('/');
  const char* target_leaf = target_.c_str() + (slash == std::string::npos ? 0 : slash + 1);
  int target_dir = dest_.get();
  UniqueFd opened;
  if (slash != std::string::npos) {
    std::string dir = target_.substr(0, slash);
    if (cached_fd_ && dir == cached_parent_) {
      target_dir = cached_fd_.get();
    } else {
      opened.reset(open_beneath(dest_.get(), dir.c_str(), O_PATH | O_DIRECTORY));
      if (!opened) opened = walk(dir, false, role);
      target_dir = opened.get();
    }
  }
  struct stat target_st;
  if (::fstatat(target_dir, target_leaf, &target_st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) refuse(role + "does not exist in this layer");
    fail_errno("stat the hard link target");
  }
  if (S_ISDIR(target_st.st_mode)) refuse(role + "is a directory");
  // linkat without AT_SYMLINK_FOLLOW: a symlink target is linked itself.
  if (::linkat(target_dir, target_leaf, parent, leaf(), 0) == 0) return;
  if (errno != EEXIST) fail_errno("link");
  struct stat existing;
  if (::fstatat(parent, leaf(), &existing, AT_SYMLINK_NOFOLLOW) == 0 &&
      existing.st_dev == target_st.st_dev && existing.st_ino == target_st.st_ino)
    return;  // already that file
  make_room(parent);
  if (::linkat(target_dir, target_leaf, parent, leaf(), 0) != 0) fail_errno("link");
}

void Extractor::finish_directories() {
  std::vector<std::pair<size_t, const std::pair<const std::string, DirectoryMetadata>*>> order;
  order.reserve(directories_.size());
  for (const auto& item : directories_) {
    const std::string& path = item.first;
    size_t depth = path.empty() ? 0 : 1 + std::count(path.begin(), path.end(), '/');
    order.emplace_back(depth, &item);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [depth, item] : order) apply_directory(item->first, item->second);
}

void Extractor::apply_directory(const std::string& path, const DirectoryMetadata& metadata) {
  raw_name_ = path;  // for messages
  int fd = dest_.get();
  UniqueFd opened;
  if (!path.empty()) {
    opened.reset(open_beneath(dest_.get(), path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
    if (!opened) {
      if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return;  // replaced since
      fail_errno("open");
    }
    fd = opened.get();
  }
  if (metadata.from_entry && keeps_owners() && ::fchown(fd, metadata.uid, metadata.gid) != 0)
    fail_errno("chown");
  // A parent the archive does not list gets 0755, less the caller's umask
  // for files out of a sandbox.
  const mode_t mode = !metadata.from_entry && options_.from_sandbox
                          ? metadata.mode & ~options_.umask
                          : metadata.mode;
  if (::fchmod(fd, mode) != 0) fail_errno("chmod");
  if (metadata.from_entry) {
    const timespec times[2] = {metadata.mtime, metadata.mtime};
    if (::futimens(fd, times) != 0) fail_errno("set times");
  }
}

}  // namespace openshell::image::unpack_detail
