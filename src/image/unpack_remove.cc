// Removing a tree that unpack_layer made, never following a symlink.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "base/error.h"
#include "base/unique_fd.h"
#include "image/unpack_internal.h"

namespace openshell::image {

using namespace unpack_detail;

namespace {

// Opens directory `name` below `parent` to empty it, giving its owner rwx
// where the mode stands in the way. -1 with errno on failure.
int open_for_removal(int parent, const char* name) {
  int fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0 && errno == EACCES) {
    // A directory (O_NOFOLLOW fails otherwise) its owner cannot read.
    if (::fchmodat(parent, name, 0700, 0) != 0) return -1;
    fd = ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  }
  if (fd < 0) return -1;
  struct stat st;
  if (::fstat(fd, &st) == 0 && (st.st_mode & 0700) != 0700)
    ::fchmod(fd, (st.st_mode & 07777) | 0700);
  return fd;
}

// Unlinks the non-directories of dir, read from its start, until a directory
// turns up (*subdir; empty when none is left). Returns 0 or an errno.
int remove_files_until_directory(int dir, std::string* subdir) {
  subdir->clear();
  alignas(8) char buf[16384];
  for (;;) {
    ssize_t n = ::getdents64(dir, buf, sizeof buf);
    if (n < 0) return errno;
    if (n == 0) return 0;
    for (ssize_t pos = 0; pos < n;) {
      auto* entry = reinterpret_cast<dirent64*>(buf + pos);
      pos += entry->d_reclen;
      if (is_dot_or_dotdot(entry->d_name)) continue;
      bool is_dir = entry->d_type == DT_DIR;
      if (entry->d_type == DT_UNKNOWN) {
        struct stat st;
        if (::fstatat(dir, entry->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) {
          if (errno == ENOENT) continue;
          return errno;
        }
        is_dir = S_ISDIR(st.st_mode);
      }
      if (is_dir) {
        *subdir = entry->d_name;
        return 0;
      }
      if (::unlinkat(dir, entry->d_name, 0) != 0 && errno != ENOENT) return errno;
    }
  }
}

}  // namespace

// rm -rf of directory `name` below `parent`, never following a symlink.
// Holds two fds at a time whatever the depth: it climbs back with "..",
// checking that it lands where it came from. Returns 0 or an errno.
int unpack_detail::remove_directory_at(int parent, const char* name) {
  struct Entered {
    std::string name;  // of the directory entered
    dev_t parent_dev;  // and the identity of the one it was entered from
    ino_t parent_ino;
  };
  std::vector<Entered> entered;
  UniqueFd dir(open_for_removal(parent, name));
  if (!dir) return errno == ENOENT ? 0 : errno;
  std::string subdir;
  for (;;) {
    if (int err = remove_files_until_directory(dir.get(), &subdir)) return err;
    if (!subdir.empty()) {
      struct stat here;
      if (::fstat(dir.get(), &here) != 0) return errno;
      UniqueFd child(open_for_removal(dir.get(), subdir.c_str()));
      if (!child && errno != ENOENT) return errno;
      if (!child) {
        // Gone meanwhile: list this directory again from its start.
        child.reset(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!child) return errno;
      } else {
        entered.push_back({subdir, here.st_dev, here.st_ino});
      }
      dir = std::move(child);
      continue;
    }
    if (entered.empty()) break;
    UniqueFd up(::openat(dir.get(), "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!up) return errno;
    struct stat st;
    if (::fstat(up.get(), &st) != 0) return errno;
    if (st.st_dev != entered.back().parent_dev || st.st_ino != entered.back().parent_ino)
      return EXDEV;  // moved while it was being removed
    if (::unlinkat(up.get(), entered.back().name.c_str(), AT_REMOVEDIR) != 0 && errno != ENOENT)
      return errno;
    entered.pop_back();
    dir = std::move(up);  // read again from its start
  }
  dir.reset();
  if (::unlinkat(parent, name, AT_REMOVEDIR) != 0 && errno != ENOENT) return errno;
  return 0;
}

void remove_layer_tree(const std::string& path) {
  std::string trimmed = path;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  const size_t slash = trimmed.rfind('/');
  const std::string name = slash == std::string::npos ? trimmed : trimmed.substr(slash + 1);
  if (name.empty() || is_dot_or_dotdot(name.c_str()))
    throw Error("remove " + path + ": not a removable path");
  const std::string parent = slash == std::string::npos ? "."
                             : slash == 0               ? "/"
                                                        : trimmed.substr(0, slash);
  UniqueFd dir(::open(parent.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  struct stat st;
  if (!dir || ::fstatat(dir.get(), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    const int err = errno;
    if (err == ENOENT) return;
    throw_errno("remove " + path, err);
  }
  int err = 0;
  if (S_ISDIR(st.st_mode))
    err = remove_directory_at(dir.get(), name.c_str());
  else if (::unlinkat(dir.get(), name.c_str(), 0) != 0 && errno != ENOENT)
    err = errno;
  if (err) throw_errno("remove " + path, err);
}

}  // namespace openshell::image
