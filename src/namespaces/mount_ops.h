// Child-side mount primitives for MountPlan::apply and the overlay probe:
// raw syscalls only, no allocation, failures recorded in a ChildFailure.
// Private to src/namespaces.
#pragma once

#include <cstdint>
#include <string>

#include "base/child_failure.h"
#include "namespaces/mounts.h"

namespace openshell::namespaces::mount_ops {

enum class Create { kNo, kDirectory, kFile };

struct Option {
  const char* key;
  const char* value;  // nullptr: a flag
};

// openat2(2) of `path` below root, resolved as if root were "/", with no
// magic links; O_CLOEXEC is added.
int openat2_in_root(int root, const char* path, uint64_t flags);

// Opens `path` (relative to root, resolved as if root were "/") as O_PATH,
// creating missing directories, and the last component as `create` says.
// *created tells whether the last component was made here.
int open_in_root(int root, const char* path, Create create, ChildFailure* f,
                 bool* created = nullptr);

// Reads the file system context's messages ("e overlay: ...") into detail.
void read_fs_log(int fsfd, ChildFailure* f);

// Mounts a new file system of `type` on target_fd. Returns the mount's fd
// (for later mount_setattr) or -1.
int mount_fs(const char* type, const Option* options, int n_options, unsigned attrs, int target_fd,
             const char* where, ChildFailure* f);

bool set_attrs(int mount_fd, unsigned set, bool recursive, const char* what, ChildFailure* f);

// Bind-mounts source (an absolute path in the current root, or relative to
// source_dirfd) onto target_fd.
bool bind(int source_dirfd, const char* source, int target_fd, bool recursive, unsigned attrs,
          const char* where, ChildFailure* f);

// Hides `path` below root: a directory becomes an empty read-only tmpfs,
// anything else /dev/null. Missing paths are skipped. unreachable_ok: a path
// the child cannot reach (EACCES, ENOTDIR) is skipped, as the sandbox, with
// fewer rights than the child, cannot reach it either.
bool mask_path(int root, const char* path, ChildFailure* f, bool unreachable_ok = false);

// `path` below root, recursively read-only (and nosuid, nodev, noexec).
bool make_read_only(int root, const char* path, ChildFailure* f);

// A fresh /dev below root: a small tmpfs with the host's device nodes bound
// in (no mknod), devpts, /dev/shm and the usual links, the extra nodes
// (--gpu) and the directories given (mount points below /dev, relative to
// root: "dev/mqueue"), then frozen read-only.
bool build_dev(int root, bool tty_group, const char* shm_size, const char* shm_inodes,
               const DeviceMount* extra, size_t extra_count, const std::string* dirs,
               size_t dir_count, ChildFailure* f);

// Writes `value` to the kernel parameter at `path` below root
// ("proc/sys/net/ipv4/ip_forward"), following no symlink; a failure names
// the parameter as `key` gives it.
bool write_sysctl(int root, const char* path, const char* key, const std::string& value,
                  ChildFailure* f);

}  // namespace openshell::namespaces::mount_ops
