// Child-side mount primitives: raw syscalls, no allocation (see mount_ops.h).
#include "namespaces/mount_ops.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "base/unique_fd.h"

namespace openshell::namespaces::mount_ops {

using child::fail;

int openat2_in_root(int root, const char* path, uint64_t flags) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, root, path, &how, sizeof how));
}

int open_in_root(int root, const char* path, Create create, ChildFailure* f, bool* created) {
  if (created) *created = false;
  if (path[0] == '\0') return openat2_in_root(root, ".", O_PATH | O_DIRECTORY);
  int fd = openat2_in_root(root, path, O_PATH);
  if (fd >= 0 || errno != ENOENT || create == Create::kNo) {
    if (fd < 0) fail(f, errno, "open mount point /", path);
    return fd;
  }
  // Walk the components, creating what is missing: each prefix is resolved
  // inside root, and each creation names one component below a resolved fd.
  char buf[4096];
  size_t len = 0;
  while (path[len]) {
    if (len + 1 >= sizeof buf) return fail(f, ENAMETOOLONG, "open mount point /", path), -1;
    buf[len] = path[len];
    ++len;
  }
  buf[len] = '\0';
  UniqueFd parent(openat2_in_root(root, ".", O_PATH | O_DIRECTORY));
  for (size_t start = 0; start < len;) {
    size_t end = start;
    while (end < len && buf[end] != '/') ++end;
    const bool last = end == len;
    buf[end] = '\0';
    const char* name = buf + start;
    if (name[0] != '\0') {
      int next = openat2_in_root(root, buf, O_PATH);
      if (next < 0 && errno == ENOENT) {
        int rc;
        if (last && create == Create::kFile) {
          rc = ::openat(parent.get(), name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC,
                        0644);
          if (rc >= 0) ::close(rc);
        } else {
          rc = ::mkdirat(parent.get(), name, 0755);
        }
        if (rc < 0 && errno != EEXIST) return fail(f, errno, "create mount point /", path), -1;
        if (last && created && rc >= 0) *created = true;
        next = openat2_in_root(root, buf, O_PATH);
      }
      if (next < 0) return fail(f, errno, "open mount point /", path), -1;
      parent.reset(next);
    }
    if (!last) buf[end] = '/';
    start = end + 1;
  }
  return parent.release();
}

void read_fs_log(int fsfd, ChildFailure* f) {
  char msg[256];
  for (int i = 0; i < 4; ++i) {
    ssize_t n = ::read(fsfd, msg, sizeof msg - 1);
    if (n <= 0) break;
    msg[n] = '\0';
    child::append(f->detail, sizeof f->detail, " (");
    child::append(f->detail, sizeof f->detail, msg + (n > 2 && msg[1] == ' ' ? 2 : 0));
    child::append(f->detail, sizeof f->detail, ")");
  }
}

int mount_fs(const char* type, const Option* options, int n_options, unsigned attrs, int target_fd,
             const char* where, ChildFailure* f) {
  UniqueFd fs(::fsopen(type, FSOPEN_CLOEXEC));
  if (fs.get() < 0) return fail(f, errno, "fsopen", type), -1;
  for (int i = 0; i < n_options; ++i) {
    const Option& o = options[i];
    int rc = o.value ? ::fsconfig(fs.get(), FSCONFIG_SET_STRING, o.key, o.value, 0)
                     : ::fsconfig(fs.get(), FSCONFIG_SET_FLAG, o.key, nullptr, 0);
    if (rc != 0) {
      int err = errno;
      fail(f, err, "mount option", o.key);
      child::append(f->detail, sizeof f->detail, " for ");
      child::append(f->detail, sizeof f->detail, type);
      read_fs_log(fs.get(), f);
      return -1;
    }
  }
  if (::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    int err = errno;
    fail(f, err, "mount", type);
    child::append(f->detail, sizeof f->detail, " on /");
    child::append(f->detail, sizeof f->detail, where);
    read_fs_log(fs.get(), f);
    return -1;
  }
  int mnt = ::fsmount(fs.get(), FSMOUNT_CLOEXEC, attrs);
  if (mnt < 0) return fail(f, errno, "fsmount", type), -1;
  if (::move_mount(mnt, "", target_fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) !=
      0) {
    int err = errno;
    ::close(mnt);
    fail(f, err, "mount", type);
    child::append(f->detail, sizeof f->detail, " on /");
    child::append(f->detail, sizeof f->detail, where);
    return -1;
  }
  return mnt;
}

bool set_attrs(int mount_fd, unsigned set, bool recursive, const char* what, ChildFailure* f) {
  mount_attr attr{};
  attr.attr_set = set;
  unsigned flags = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
  if (::mount_setattr(mount_fd, "", flags, &attr, sizeof attr) != 0)
    return fail(f, errno, "mount_setattr", what);
  return true;
}

bool bind(int source_dirfd, const char* source, int target_fd, bool recursive, unsigned attrs,
          const char* where, ChildFailure* f) {
  unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0);
  if (source[0] == '\0') flags |= AT_EMPTY_PATH;
  UniqueFd tree(::open_tree(source_dirfd, source, flags));
  if (tree.get() < 0) return fail(f, errno, "bind mount", source);
  if (attrs && !set_attrs(tree.get(), attrs, recursive, where, f)) return false;
  if (::move_mount(tree.get(), "", target_fd, "",
                   MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0) {
    fail(f, errno, "bind mount on /", where);
    return false;
  }
  return true;
}

}  // namespace openshell::namespaces::mount_ops
