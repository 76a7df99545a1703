// The kernel's interfaces in the sandbox: a /dev made without mknod, the
// /proc and /sys paths it may not see (masked) or may only read, and the
// kernel parameters written through its /proc/sys.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "base/unique_fd.h"
#include "namespaces/mount_ops.h"
#include "namespaces/mounts.h"

namespace openshell::namespaces {

const char* const kMaskedPaths[] = {
    "proc/acpi",
    "proc/asound",
    "proc/interrupts",
    "proc/kcore",
    "proc/keys",
    "proc/latency_stats",
    "proc/timer_list",
    "proc/timer_stats",
    "proc/sched_debug",
    "proc/scsi",
    "proc/sysrq-trigger",
    "sys/firmware",
    "sys/devices/virtual/powercap",
    "sys/kernel/debug",
    "sys/kernel/security",
    nullptr,
};

const char* const kReadOnlyPaths[] = {
    "proc/bus", "proc/fs", "proc/irq", "proc/sys", nullptr,
};

namespace mount_ops {

using child::fail;

bool mask_path(int root, const char* path, ChildFailure* f, bool unreachable_ok) {
  int fd = openat2_in_root(root, path, O_PATH | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT || errno == ELOOP) return true;
    if (unreachable_ok && (errno == EACCES || errno == ENOTDIR)) return true;
    return fail(f, errno, "mask", path);
  }
  UniqueFd target(fd);
  struct stat st;
  if (::fstat(target.get(), &st) != 0) return fail(f, errno, "mask", path);
  if (S_ISDIR(st.st_mode)) {
    Option opts[] = {{"size", "0"}, {"mode", "0555"}};
    int mnt = mount_fs("tmpfs", opts, 2,
                       MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                       target.get(), path, f);
    if (mnt < 0) return false;
    ::close(mnt);
    return true;
  }
  return bind(AT_FDCWD, "/oldroot/dev/null", target.get(), false,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, path, f);
}

bool make_read_only(int root, const char* path, ChildFailure* f) {
  int fd = openat2_in_root(root, path, O_PATH | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return true;
    return fail(f, errno, "read-only", path);
  }
  UniqueFd target(fd);
  return bind(target.get(), "", target.get(), true,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, path,
              f);
}

bool write_sysctl(int root, const char* path, const char* key, const std::string& value,
                  ChildFailure* f) {
  open_how how{};
  how.flags = O_WRONLY | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  UniqueFd fd(static_cast<int>(::syscall(SYS_openat2, root, path, &how, sizeof how)));
  if (fd.get() < 0) return fail(f, errno, "sysctl", key);
  // One write: the kernel parses a parameter from the start of each.
  const ssize_t n = ::write(fd.get(), value.data(), value.size());
  if (n < 0) return fail(f, errno, "sysctl", key);
  if (static_cast<size_t>(n) != value.size()) return fail(f, EIO, "sysctl", key);
  return true;
}

bool build_dev(int root, bool tty_group, const char* shm_size, const char* shm_inodes,
               const DeviceMount* extra, size_t extra_count, const std::string* dirs,
               size_t dir_count, ChildFailure* f) {
  UniqueFd target(open_in_root(root, "dev", Create::kDirectory, f));
  if (target.get() < 0) return false;
  Option opts[] = {{"mode", "0755"}, {"size", "65536"}};
  UniqueFd dev_mount(
      mount_fs("tmpfs", opts, 2, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, target.get(), "dev", f));
  if (dev_mount.get() < 0) return false;
  UniqueFd dev(openat2_in_root(root, "dev", O_PATH | O_DIRECTORY));
  if (dev.get() < 0) return fail(f, errno, "open", "/dev");

  // Device nodes are bind mounts of the host's: no mknod, which a user
  // namespace cannot do anyway.
  static const char* const kNodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
  for (const char* node : kNodes) {
    char source[64] = "/oldroot/dev/";
    child::append(source, sizeof source, node);
    char where[32] = "dev/";
    child::append(where, sizeof where, node);
    UniqueFd node_target(open_in_root(root, where, Create::kFile, f));
    if (node_target.get() < 0) return false;
    if (!bind(AT_FDCWD, source, node_target.get(), false, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC,
              where, f))
      return false;
  }

  UniqueFd pts(open_in_root(root, "dev/pts", Create::kDirectory, f));
  if (pts.get() < 0) return false;
  Option pts_opts[] = {
      {"newinstance", nullptr}, {"ptmxmode", "0666"}, {"mode", "0620"}, {"gid", "5"}};
  UniqueFd pts_mount(mount_fs("devpts", pts_opts, tty_group ? 4 : 3,
                              MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, pts.get(), "dev/pts", f));
  if (pts_mount.get() < 0) return false;

  UniqueFd shm(open_in_root(root, "dev/shm", Create::kDirectory, f));
  if (shm.get() < 0) return false;
  Option shm_opts[] = {{"mode", "1777"}, {"size", shm_size}, {"nr_inodes", shm_inodes}};
  UniqueFd shm_mount(mount_fs("tmpfs", shm_opts, shm_size[0] ? 3 : 1,
                              MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, shm.get(),
                              "dev/shm", f));
  if (shm_mount.get() < 0) return false;

  struct Link {
    const char* target;
    const char* name;
  };
  static const Link kLinks[] = {{"pts/ptmx", "ptmx"},
                                {"/proc/self/fd", "fd"},
                                {"/proc/self/fd/0", "stdin"},
                                {"/proc/self/fd/1", "stdout"},
                                {"/proc/self/fd/2", "stderr"}};
  UniqueFd dev_dir(openat2_in_root(root, "dev", O_DIRECTORY | O_RDONLY));
  if (dev_dir.get() < 0) return fail(f, errno, "open", "/dev");
  for (const Link& link : kLinks)
    if (::symlinkat(link.target, dev_dir.get(), link.name) != 0 && errno != EEXIST)
      return fail(f, errno, "symlink /dev/", link.name);

  // The nodes given (--gpu), below their own directories where they have
  // them (nvidia-caps/); device access stays, as for the nodes above.
  for (size_t i = 0; i < extra_count; ++i) {
    const char* where = extra[i].target.c_str();
    UniqueFd node_target(open_in_root(root, where, Create::kFile, f));
    if (node_target.get() < 0) return false;
    if (!bind(AT_FDCWD, extra[i].source.c_str(), node_target.get(), false,
              MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, where, f))
      return false;
  }

  // Mount points of the caller's own file systems (/dev/mqueue).
  for (size_t i = 0; i < dir_count; ++i) {
    UniqueFd dir(open_in_root(root, dirs[i].c_str(), Create::kDirectory, f));
    if (dir.get() < 0) return false;
  }

  // Nothing more is created in /dev: freeze it.
  return set_attrs(dev_mount.get(), MOUNT_ATTR_RDONLY, false, "/dev", f);
}

}  // namespace mount_ops
}  // namespace openshell::namespaces
