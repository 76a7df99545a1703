// The mount points of an overlay root that no layer has, made in the
// writable layer before the overlay is mounted (child side: raw syscalls, no
// allocation).
//
// Made through the overlay instead, a point needs write access to its parent
// as the image or directory below has it: a rootless sandbox's directory
// root owned by another user shows that user as nobody, and even the
// sandbox's root may not create /etc/resolv.conf there. bubblewrap avoids
// this by building its root on a tmpfs, crun by creating points in a root
// the caller owns; here the writable layer is the caller's, and a directory
// made in it merges with the one below as a copy-up would have made it (the
// lower's mode and, where the sandbox maps it, its owner). A point below
// anything but a directory (an image's /etc -> usr/etc) is left to the
// overlay: shadowing a link with a directory would change the image.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "base/unique_fd.h"
#include "namespaces/mounts.h"

namespace openshell::namespaces {

using child::fail;

namespace {

constexpr size_t kMaxLowers = 128;

// The topmost of the layers (upper first, unless it is -1) that has `path`, stat'ed without
// following its last component; false: none has it.
bool find_in_layers(int upper, const int* lowers, size_t n, const char* path, struct stat* st) {
  if (upper >= 0 && ::fstatat(upper, path, st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  for (size_t i = 0; i < n; ++i)
    if (lowers[i] >= 0 && ::fstatat(lowers[i], path, st, AT_SYMLINK_NOFOLLOW) == 0) return true;
  return false;
}

}  // namespace

bool MountPlan::make_mount_points(const char* upper_path, const int* tree_fds, bool* hosts_made,
                                  ChildFailure* f) const noexcept {
  *hosts_made = false;
  if (mount_points_.empty()) return true;
  UniqueFd upper(::open(upper_path, O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (upper.get() < 0) return fail(f, errno, "open the writable layer", upper_path);
  const size_t n = lowers_.size() < kMaxLowers ? lowers_.size() : kMaxLowers;
  UniqueFd lower_fds[kMaxLowers];
  int lowers[kMaxLowers];
  for (size_t i = 0; i < n; ++i) {
    const char* path = tree_fds[i] >= 0 ? lowers_[i].attach.c_str() : lowers_[i].source.c_str();
    lower_fds[i].reset(::open(path, O_PATH | O_DIRECTORY | O_CLOEXEC));
    lowers[i] = lower_fds[i].get();
  }
  for (const MountPoint& point : mount_points_) {
    char buf[4096];
    size_t len = 0;
    for (const char* p = point.path.c_str(); *p; ++p) {
      if (len + 1 >= sizeof buf) return fail(f, ENAMETOOLONG, "mount point /", point.path.c_str());
      buf[len++] = *p;
    }
    buf[len] = '\0';
    struct stat st;
    if (len == 0) continue;
    // The /etc/hosts of ours is bound over an empty file of the upper layer
    // alone, made here at an earlier launch; the image's own is kept.
    const bool is_hosts = !point.directory && point.path == "etc/hosts";
    if (is_hosts && ::fstatat(upper.get(), buf, &st, AT_SYMLINK_NOFOLLOW) == 0) {
      if (S_ISREG(st.st_mode) && st.st_size == 0 && !find_in_layers(-1, lowers, n, buf, &st))
        *hosts_made = true;
      continue;
    }
    if (find_in_layers(upper.get(), lowers, n, buf, &st)) continue;
    // Each parent: a directory in the topmost layer that has it (else the
    // point is left to the overlay), made in the upper layer where missing.
    bool ok = true;
    for (size_t end = 0; ok && end < len; ++end) {
      if (buf[end] != '/') continue;
      buf[end] = '\0';
      if (!find_in_layers(upper.get(), lowers, n, buf, &st)) {
        st.st_mode = S_IFDIR | 0755;
        st.st_uid = st.st_gid = static_cast<unsigned>(-1);
      }
      if (!S_ISDIR(st.st_mode)) {
        ok = false;
      } else if (::fstatat(upper.get(), buf, &st, AT_SYMLINK_NOFOLLOW) != 0) {
        struct stat below = st;
        if (::mkdirat(upper.get(), buf, below.st_mode & 07777) != 0 && errno != EEXIST)
          return fail(f, errno, "create mount point /", point.path.c_str());
        // Best effort: an owner the sandbox does not map stays the creator.
        if (below.st_uid != static_cast<unsigned>(-1))
          (void)::fchownat(upper.get(), buf, below.st_uid, below.st_gid, AT_SYMLINK_NOFOLLOW);
      }
      buf[end] = '/';
    }
    if (!ok) continue;
    int rc;
    if (point.directory) {
      rc = ::mkdirat(upper.get(), buf, 0755);
    } else {
      rc = ::openat(upper.get(), buf, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
      if (rc >= 0) ::close(rc);
    }
    if (rc < 0) return fail(f, errno, "create mount point /", point.path.c_str());
    if (point.user_owned && ::fchownat(upper.get(), buf, spec_.workdir_uid, spec_.workdir_gid,
                                       AT_SYMLINK_NOFOLLOW) != 0)
      return fail(f, errno, "chown", point.path.c_str());
    if (is_hosts) *hosts_made = true;
  }
  return true;
}

}  // namespace openshell::namespaces
