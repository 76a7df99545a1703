#include "base/directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace openshell::files {

namespace {

bool is_dot_or_dotdot(const char* name) {
  return name[0] == '.' && (name[1] == '\0' || (name[1] == '.' && name[2] == '\0'));
}

// ---- removal ---------------------------------------------------------------
// Everything below runs in children between clone and exec too: raw system
// calls and the stack only.

// Levels of directories held open below the tree's top: deeper trees are
// climbed again from the top (see empty_tree).
constexpr int kWindow = 16;
// Passes over directories that removed nothing, in a row: a directory that
// stays "not empty" yet lists nothing would otherwise be entered for ever.
constexpr long kMaxIdlePasses = 1L << 20;

struct Mount {
  uint32_t dev_major = 0, dev_minor = 0;
  bool has_id = false;  // the kernel says which mount (Linux 5.8 on)
  uint64_t id = 0;
};

int mount_of(int fd, Mount* mount) {
  struct statx sx;
  if (::statx(fd, "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_MNT_ID, &sx) != 0) return errno;
  mount->dev_major = sx.stx_dev_major;
  mount->dev_minor = sx.stx_dev_minor;
  mount->has_id = (sx.stx_mask & STATX_MNT_ID) != 0;
  mount->id = sx.stx_mnt_id;
  return 0;
}

bool same_mount(const Mount& a, const Mount& b) {
  return a.dev_major == b.dev_major && a.dev_minor == b.dev_minor &&
         (!a.has_id || !b.has_id || a.id == b.id);
}

// "/proc/self/fd/N" into buf (32 bytes), without snprintf.
void proc_fd_path(int fd, char* buf) {
  static const char prefix[] = "/proc/self/fd/";
  std::memcpy(buf, prefix, sizeof prefix - 1);
  char digits[16];
  int count = 0;
  unsigned value = static_cast<unsigned>(fd);
  do {
    digits[count++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value && count < 15);
  char* out = buf + sizeof prefix - 1;
  while (count) *out++ = digits[--count];
  *out = '\0';
}

// Opens directory `name` of `dir` to empty it: never through a symbolic
// link, never on another mount than `mount`, and with owner rwx so that its
// entries can go. Sets *out, returns 0 or an errno.
int open_for_removal(int dir, const char* name, const Mount& mount, int* out) {
  int found = ::openat(dir, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (found < 0) return errno;
  Mount here;
  int err = mount_of(found, &here);
  if (!err && !same_mount(here, mount)) err = EXDEV;
  int fd = -1;
  if (!err) {
    fd = ::openat(found, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0 && errno == EACCES) {
      // Unreadable (mode 000): chmod it through the fd's /proc link, which
      // names this very directory, not whatever its name points to now.
      char proc[32];
      proc_fd_path(found, proc);
      if (::chmod(proc, 0700) == 0) fd = ::openat(found, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    }
    if (fd < 0) err = errno;
  }
  ::close(found);
  if (err) return err;
  struct stat st;
  if (::fstat(fd, &st) == 0 && (st.st_mode & 0700) != 0700)
    ::fchmod(fd, (st.st_mode & 07777) | 0700);  // not ours to change: unlinks will say
  *out = fd;
  return 0;
}

// One pass over dir from its start: unlinks what is not a directory and
// removes the directories that are empty, until one is not (*found, its
// name in sub). *removed counts what went. Returns 0 or an errno.
int clear_level(int dir, char* sub, bool* found, long* removed) {
  *found = false;
  EntryReader reader(dir);
  while (const dirent64* entry = reader.next()) {
    const char* name = entry->d_name;
    bool is_dir = entry->d_type == DT_DIR;
    if (entry->d_type == DT_UNKNOWN) {
      struct stat st;
      if (::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        if (errno == ENOENT) continue;
        return errno;
      }
      is_dir = S_ISDIR(st.st_mode);
    }
    if (!is_dir) {
      if (::unlinkat(dir, name, 0) == 0) {
        ++*removed;
        continue;
      }
      if (errno == ENOENT) continue;
      if (errno != EISDIR) return errno;  // it became a directory meanwhile
    }
    if (::unlinkat(dir, name, AT_REMOVEDIR) == 0) {
      ++*removed;
      continue;
    }
    if (errno == ENOENT) continue;
    if (errno == ENOTDIR) {  // it became something else meanwhile
      if (::unlinkat(dir, name, 0) == 0 || errno == ENOENT) continue;
      return errno;
    }
    if (errno != ENOTEMPTY && errno != EEXIST) return errno;
    const size_t length = std::strlen(name);
    if (length > NAME_MAX) return ENAMETOOLONG;
    std::memcpy(sub, name, length + 1);
    *found = true;
    return 0;
  }
  return reader.error();
}

// Empties the directory open as top. Goes down to the first directory that
// is not empty, empties it, and reads its parent again (where it is now
// removed as empty). Never climbs with "..": what it holds it reached from
// top, through no link. Below kWindow levels it lets go of the highest and,
// when back there, reads top again from its start.
int empty_tree(int top, const Mount& mount) {
  int held[kWindow];
  int depth = 0;
  char sub[NAME_MAX + 1];
  long idle = 0;
  int err = 0;
  for (;;) {
    const int current = depth ? held[depth - 1] : top;
    bool found = false;
    long removed = 0;
    err = clear_level(current, sub, &found, &removed);
    if (err) break;
    idle = removed ? 0 : idle + 1;
    if (idle > kMaxIdlePasses) {
      err = ENOTEMPTY;
      break;
    }
    if (found) {
      int fd = -1;
      err = open_for_removal(current, sub, mount, &fd);
      if (err == ENOENT) continue;
      if (err) break;
      if (depth == kWindow) {
        ::close(held[0]);
        std::memmove(held, held + 1, sizeof(int) * (kWindow - 1));
        --depth;
      }
      held[depth++] = fd;
      continue;
    }
    if (depth == 0) break;  // top is empty
    ::close(held[--depth]);
  }
  while (depth) ::close(held[--depth]);
  return err;
}

}  // namespace

EntryReader::EntryReader(int dir_fd) : fd_(dir_fd) {
  if (::lseek(fd_, 0, SEEK_SET) < 0) error_ = errno;
}

const dirent64* EntryReader::next() {
  for (;;) {
    if (pos_ >= size_) {
      if (error_ || size_ < 0) return nullptr;
      const ssize_t n = ::getdents64(fd_, buf_, sizeof buf_);
      if (n <= 0) {
        if (n < 0) error_ = errno;
        size_ = -1;  // the end
        return nullptr;
      }
      size_ = n;
      pos_ = 0;
    }
    const auto* entry = reinterpret_cast<const dirent64*>(buf_ + pos_);
    pos_ += entry->d_reclen;
    if (!is_dot_or_dotdot(entry->d_name)) return entry;
  }
}

int for_each_entry(int dir_fd, const EntryVisitor& visit) {
  EntryReader reader(dir_fd);
  while (const dirent64* entry = reader.next())
    if (!visit(entry->d_name, entry->d_type)) return 0;
  return reader.error();
}

int for_each_entry(const std::string& path, const EntryVisitor& visit) {
  UniqueFd dir(::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) return errno;
  return for_each_entry(dir.get(), visit);
}

std::vector<std::string> list_directory(const std::string& path) {
  std::vector<std::string> names;
  const int err = for_each_entry(path, [&names](const char* name, unsigned char) {
    names.emplace_back(name);
    return true;
  });
  if (err == ENOENT) return {};
  if (err) throw_errno("read " + path, err);
  std::sort(names.begin(), names.end());
  return names;
}

int remove_tree_at(int parent_fd, const char* name) noexcept {
  struct stat st;
  if (::fstatat(parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno == ENOENT ? 0 : errno;
  if (!S_ISDIR(st.st_mode))
    return ::unlinkat(parent_fd, name, 0) == 0 || errno == ENOENT ? 0 : errno;
  Mount mount;
  if (int err = mount_of(parent_fd, &mount)) return err;
  int top = -1;
  if (int err = open_for_removal(parent_fd, name, mount, &top)) return err == ENOENT ? 0 : err;
  const int err = empty_tree(top, mount);
  ::close(top);
  if (err) return err;
  if (::unlinkat(parent_fd, name, AT_REMOVEDIR) != 0 && errno != ENOENT) return errno;
  return 0;
}

RemovalTarget RemovalTarget::open(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.rfind('/');
  RemovalTarget target;
  target.name = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  if (target.name.empty() || is_dot_or_dotdot(target.name.c_str()))
    throw Error("remove " + path + ": not a removable path");
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : trimmed.substr(0, slash);
  target.parent.reset(::open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!target.parent && errno != ENOENT && errno != ENOTDIR) throw removal_error(path, errno);
  return target;
}

Error removal_error(const std::string& path, int err) {
  // EBUSY: what rmdir and unlink say of a mount point.
  if (err == EXDEV || err == EBUSY)
    return Error("remove " + path + ": is or holds a mount point; unmount it first");
  return Error(errno_message("remove " + path, err));
}

void remove_tree(const std::string& path) {
  RemovalTarget target = RemovalTarget::open(path);
  if (!target.parent) return;
  if (int err = remove_tree_at(target.parent.get(), target.name.c_str()))
    throw removal_error(path, err);
}

}  // namespace openshell::files
