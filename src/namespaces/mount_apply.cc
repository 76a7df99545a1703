// The mount plan, child side: the ordered steps that build the sandbox's root
// and pivot into it, between clone and exec (raw syscalls, no allocation).
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/unique_fd.h"
#include "namespaces/mount_ops.h"
#include "namespaces/mounts.h"
#include "namespaces/overlay.h"

namespace openshell::namespaces {

using child::fail;
using namespace mount_ops;

namespace {

// The host's / seen through a tmpfs: every top-level entry read-only (a
// recursive bind, a symlink copied, a file bound), except the kernel's file
// systems and /tmp and /run, which the sandbox gets fresh. The tmpfs lets the
// sandbox have mount points the host lacks (/sandbox).
bool mirror_host_root(int root, ChildFailure* f) {
  UniqueFd old(::open("/oldroot", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (old.get() < 0) return fail(f, errno, "open", "/oldroot");
  struct Dirent64 {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
  };
  alignas(8) char buf[8192];
  for (;;) {
    long n = ::syscall(SYS_getdents64, old.get(), buf, sizeof buf);
    if (n < 0) return fail(f, errno, "read the host's /");
    if (n == 0) return true;
    for (long pos = 0; pos < n;) {
      auto* e = reinterpret_cast<Dirent64*>(buf + pos);
      pos += e->reclen;
      const char* name = e->name;
      static const char* const kFresh[] = {".", "..", "proc", "dev", "sys", "tmp", "run"};
      bool skip = false;
      for (const char* fresh : kFresh) skip = skip || std::strcmp(name, fresh) == 0;
      if (skip) continue;
      unsigned char type = e->type;
      if (type == DT_UNKNOWN) {
        struct stat st;
        if (::fstatat(old.get(), name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        type = S_ISDIR(st.st_mode)   ? DT_DIR
               : S_ISLNK(st.st_mode) ? DT_LNK
               : S_ISREG(st.st_mode) ? DT_REG
                                     : DT_UNKNOWN;
      }
      const unsigned ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
      if (type == DT_LNK) {
        char target[4096];
        ssize_t len = ::readlinkat(old.get(), name, target, sizeof target - 1);
        if (len < 0) continue;
        target[len] = '\0';
        if (::symlinkat(target, root, name) != 0) return fail(f, errno, "symlink /", name);
      } else if (type == DT_DIR || type == DT_REG) {
        if (type == DT_DIR ? ::mkdirat(root, name, 0755) != 0
                           : ::mknodat(root, name, S_IFREG | 0644, 0) != 0)
          return fail(f, errno, "create mount point /", name);
        UniqueFd target(::openat(root, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
        if (target.get() < 0) return fail(f, errno, "open mount point /", name);
        if (!bind(old.get(), name, target.get(), type == DT_DIR, ro, name, f)) return false;
      }
    }
  }
}

// A copy of this binary that nothing can write: a detached read-only mount of
// the file (cheap: shares the page cache), else a sealed memfd.
int seal_self(const char* exe_path, int self_exe_fd, ChildFailure* f) {
  struct stat want, got;
  if (::fstat(self_exe_fd, &want) != 0) return fail(f, errno, "stat", "/proc/self/exe"), -1;
  int tree = ::open_tree(AT_FDCWD, exe_path, OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
  if (tree >= 0) {
    if (::fstat(tree, &got) == 0 && got.st_dev == want.st_dev && got.st_ino == want.st_ino) {
      mount_attr attr{};
      attr.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
      if (::mount_setattr(tree, "", AT_EMPTY_PATH, &attr, sizeof attr) == 0) return tree;
    }
    ::close(tree);
  }
  // The binary was replaced on disk, or detached mounts are unavailable.
  int memfd = static_cast<int>(
      ::syscall(SYS_memfd_create, "openshell-init", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (memfd < 0) return fail(f, errno, "memfd_create", "openshell-init"), -1;
  off_t offset = 0;
  while (offset < want.st_size) {
    ssize_t n = ::sendfile(memfd, self_exe_fd, &offset, static_cast<size_t>(want.st_size - offset));
    if (n <= 0) {
      int err = n < 0 ? errno : EIO;
      ::close(memfd);
      return fail(f, err, "copy", "/proc/self/exe"), -1;
    }
  }
  if (::fcntl(memfd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) != 0) {
    int err = errno;
    ::close(memfd);
    return fail(f, err, "seal", "openshell-init"), -1;
  }
  return memfd;
}

}  // namespace

bool MountPlan::apply(const int* tree_fds, bool tty_group, int self_exe_fd, int* init_exe_fd,
                      ChildFailure* f) const noexcept {
  const bool host_root = spec_.root == RootKind::kHost;
  const size_t n_lowers = lowers_.size();
  const int* layer_tree = tree_fds + n_lowers;
  const int* bind_trees = tree_fds + n_lowers + 1;

  // 1. Nothing we mount propagates to the host, and nothing of the host's
  //    later mounts reaches us.
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    return fail(f, errno, "make / private");

  // 2. A tmpfs becomes a staging root with the host's tree below it at
  //    /oldroot; every source is then "/oldroot/...", even one under /tmp.
  if (::mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, staging_options_.c_str()) != 0)
    return fail(f, errno, "mount staging tmpfs on", "/tmp");
  if (::chdir("/tmp") != 0) return fail(f, errno, "chdir", "/tmp");
  for (const char* dir : {"newroot", "oldroot", "upper", "work"})
    if (::mkdir(dir, 0755) != 0) return fail(f, errno, "mkdir", dir);
  for (const Lower& lower : lowers_)
    if (::mkdir(lower.attach.c_str() + 1, 0755) != 0)
      return fail(f, errno, "mkdir", lower.attach.c_str());
  if (::syscall(SYS_pivot_root, ".", "oldroot") != 0)
    return fail(f, errno, "pivot_root to the staging root");
  if (::chdir("/") != 0) return fail(f, errno, "chdir", "/");
  // Each lower directory: its idmapped tree when the parent made one, else
  // the host's path.
  bool any_idmapped = false, all_idmapped = n_lowers > 0;
  for (size_t i = 0; i < n_lowers; ++i) {
    if (tree_fds[i] < 0) {
      all_idmapped = false;
      continue;
    }
    if (::move_mount(tree_fds[i], "", AT_FDCWD, lowers_[i].attach.c_str(),
                     MOVE_MOUNT_F_EMPTY_PATH) != 0)
      return fail(f, errno, "attach the idmapped root at", lowers_[i].attach.c_str());
    any_idmapped = true;
  }
  auto lower_path = [&](size_t i) {
    return tree_fds[i] >= 0 ? lowers_[i].attach.c_str() : lowers_[i].source.c_str();
  };
  // The writable layer: in memory, or the sandbox's own (handed over as a
  // mount, or reached through the host's tree).
  char upper[4200] = "/upper", work[4200] = "/work";
  if (!layer_.empty()) {
    const char* layer = layer_.c_str();
    if (layer_tree[0] >= 0) {
      if (::mkdir("/layer", 0755) != 0 ||
          ::move_mount(layer_tree[0], "", AT_FDCWD, "/layer", MOVE_MOUNT_F_EMPTY_PATH) != 0)
        return fail(f, errno, "attach the writable layer at", "/layer");
      layer = "/layer";
    }
    child::copy(upper, sizeof upper, layer);
    child::append(upper, sizeof upper, "/upper");
    child::copy(work, sizeof work, layer);
    child::append(work, sizeof work, "/work");
  }

  // 3. The root. An overlay's missing mount points are made in its
  //    writable layer first (mount_points.cc).
  bool hosts_made = false;
  if (!host_root && !spec_.plain_root && !make_mount_points(upper, tree_fds, &hosts_made, f))
    return false;
  UniqueFd host_root_mount;
  {
    UniqueFd newroot(::open("/newroot", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (newroot.get() < 0) return fail(f, errno, "open", "/newroot");
    if (host_root) {
      Option opts[] = {{"mode", "0755"}};
      host_root_mount.reset(
          mount_fs("tmpfs", opts, 1, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, newroot.get(), "", f));
      if (host_root_mount.get() < 0) return false;
    } else if (spec_.plain_root) {
      // The sandbox's own copy, written through.
      const unsigned attrs =
          MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (spec_.read_only ? MOUNT_ATTR_RDONLY : 0);
      if (!bind(AT_FDCWD, lower_path(0), newroot.get(), true, attrs, "", f)) return false;
    } else {
      // lowerdir+ once per layer, top first; then the writable layer.
      constexpr size_t kMaxOptions = 128 + 3;
      Option opts[kMaxOptions];
      size_t n = 0;
      for (size_t i = 0; i < n_lowers && n < 128; ++i) opts[n++] = {"lowerdir+", lower_path(i)};
      opts[n++] = {"upperdir", upper};
      opts[n++] = {"workdir", work};
      opts[n++] = {"userxattr", nullptr};
      const unsigned attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
      UniqueFd mnt(mount_fs("overlay", opts, static_cast<int>(n), attrs, newroot.get(), "", f));
      bool mounted = mnt.get() >= 0;
      if (!mounted && f->err == EINVAL && (!any_idmapped || all_idmapped)) {
        // Before 6.8 overlayfs has no "lowerdir+", and fsconfig() takes no
        // string over 256 bytes: mount(2) with one page of options, the
        // lower directories as a list (the idmapped trees' attach points
        // when there are some).
        char data[4096];
        const char* list = all_idmapped ? attached_escaped_.c_str() : lowers_escaped_.c_str();
        if (!overlay_list_options(data, sizeof data, list, upper, work))
          return fail(f, E2BIG, "overlay options (list form) for", "/");
        if (::mount("overlay", "/newroot", "overlay", MS_NOSUID | MS_NODEV, data) == 0)
          mounted = true;
        else
          fail(f, errno, "mount overlay (list form) at", "/");
      }
      if (!mounted) {
        // A read-only root of one directory needs no writable layer: a plain
        // bind serves.
        if (!spec_.read_only || !layer_.empty() || n_lowers != 1) return false;
        if (!bind(AT_FDCWD, lower_path(0), newroot.get(), true,
                  MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, "", f))
          return false;
      }
    }
  }
  UniqueFd root(::open("/newroot", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root.get() < 0) return fail(f, errno, "open", "/newroot");
  if (host_root && !mirror_host_root(root.get(), f)) return false;

  // 4. A fresh /proc, mounted while the host's is still visible (the kernel
  //    allows a new proc only where a full one is already in view). The
  //    caller's kernel parameters are written through it (it shows this
  //    process's network and IPC namespaces), before it may turn read-only.
  {
    UniqueFd target(open_in_root(root.get(), "proc", Create::kDirectory, f));
    if (target.get() < 0) return false;
    const bool read_only_later = spec_.proc_read_only && !sysctls_.empty();
    UniqueFd mnt(mount_fs("proc", nullptr, 0,
                          MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC |
                              (spec_.proc_read_only && !read_only_later ? MOUNT_ATTR_RDONLY : 0),
                          target.get(), "proc", f));
    if (mnt.get() < 0) return false;
    for (const Sysctl& s : sysctls_)
      if (!write_sysctl(root.get(), s.path.c_str(), s.key.c_str(), s.value, f)) return false;
    if (read_only_later && !set_attrs(mnt.get(), MOUNT_ATTR_RDONLY, false, "proc", f)) return false;
  }

  // 5. /dev without mknod.
  if (!build_dev(root.get(), tty_group, shm_size_.c_str(), shm_inodes_.c_str(), devices_.data(),
                 devices_.size(), dev_dirs_.data(), dev_dirs_.size(), f))
    return false;

  // 6. /sys read-only: a fresh sysfs shows only this network namespace.
  {
    UniqueFd target(open_in_root(root.get(), "sys", Create::kDirectory, f));
    if (target.get() < 0) return false;
    ChildFailure ignored;
    UniqueFd mnt(
        mount_fs("sysfs", nullptr, 0,
                 MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                 target.get(), "sys", &ignored));
    if (mnt.get() < 0 &&
        !bind(AT_FDCWD, "/oldroot/sys", target.get(), true,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, "sys",
              f))
      return false;
  }

  // 7. A private /tmp in memory: writable whatever the image's owners are
  //    (a user namespace cannot copy up a directory owned by an id it does
  //    not map), unless the caller keeps the root's own; and on the host's
  //    root, an empty /run, so that the host's service sockets stay out of
  //    sight.
  {
    const char* dirs[] = {spec_.private_tmp ? "tmp" : nullptr, host_root ? "run" : nullptr};
    for (const char* dir : dirs) {
      if (!dir) continue;
      UniqueFd target(open_in_root(root.get(), dir, Create::kDirectory, f));
      if (target.get() < 0) return false;
      Option opts[] = {{"mode", dir[0] == 't' ? "1777" : "0755"},
                       {"size", tmp_size_.c_str()},
                       {"nr_inodes", tmp_inodes_.c_str()}};
      UniqueFd mnt(mount_fs("tmpfs", opts, tmp_size_.empty() ? 1 : 3,
                            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, target.get(), dir, f));
      if (mnt.get() < 0) return false;
    }
  }

  // 8. Masked and read-only kernel paths.
  for (const char* const* p = kMaskedPaths; *p; ++p)
    if (!mask_path(root.get(), *p, f)) return false;
  for (const char* const* p = kReadOnlyPaths; *p; ++p)
    if (!make_read_only(root.get(), *p, f)) return false;
  // openshell's own state and sockets, before the binds: a bind of one of
  // them is the caller's explicit choice.
  for (const auto& path : hidden_in_root_)
    if (!mask_path(root.get(), path.c_str(), f, true)) return false;

  // 8b. The caller's own file systems (tmpfs, mqueue), in order. One to be
  //     read-only turns so after the binds, which may land inside it.
  UniqueFd fs_trees[kMaxFsMounts];
  for (size_t i = 0; i < fs_mounts_.size() && i < kMaxFsMounts; ++i) {
    const Fs& m = fs_mounts_[i];
    UniqueFd target(open_in_root(root.get(), m.target.c_str(), Create::kDirectory, f));
    if (target.get() < 0) return false;
    Option opts[kMaxFsOptions];
    size_t n = 0;
    for (; n < m.options.size() && n < kMaxFsOptions; ++n)
      opts[n] = {m.options[n].key.c_str(),
                 m.options[n].flag ? nullptr : m.options[n].value.c_str()};
    fs_trees[i].reset(mount_fs(m.type.c_str(), opts, static_cast<int>(n), m.attrs, target.get(),
                               m.target.c_str(), f));
    if (fs_trees[i].get() < 0) return false;
  }

  // 9. The caller's bind mounts.
  for (size_t i = 0; i < binds_.size(); ++i) {
    const Bind& b = binds_[i];
    UniqueFd target(open_in_root(root.get(), b.target.c_str(),
                                 b.directory ? Create::kDirectory : Create::kFile, f));
    if (target.get() < 0) return false;
    const int tree = bind_trees[i];
    if (tree >= 0) {
      // Prepared by the parent, attributes and all.
      if (::move_mount(tree, "", target.get(), "",
                       MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0)
        return fail(f, errno, "bind mount on /", b.target.c_str());
      continue;
    }
    unsigned attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (b.read_only ? MOUNT_ATTR_RDONLY : 0) |
                     (b.no_exec ? MOUNT_ATTR_NOEXEC : 0);
    if (!bind(AT_FDCWD, b.source.c_str(), target.get(), true, attrs, b.target.c_str(), f))
      return false;
  }
  // What of openshell's a bind of a parent directory brought back.
  for (const auto& path : hidden_in_binds_)
    if (!mask_path(root.get(), path.c_str(), f, true)) return false;
  for (size_t i = 0; i < fs_mounts_.size() && i < kMaxFsMounts; ++i)
    if (fs_mounts_[i].read_only &&
        !set_attrs(fs_trees[i].get(), MOUNT_ATTR_RDONLY, false, fs_mounts_[i].target.c_str(), f))
      return false;
  // The caller's masked and read-only paths, once every mount is in place
  // (as an OCI runtime applies them), through the primitives of step 8.
  for (const auto& path : masked_)
    if (!mask_path(root.get(), path.c_str(), f)) return false;
  for (const auto& path : read_only_)
    if (!make_read_only(root.get(), path.c_str(), f)) return false;

  // 9b. Names resolve through the sandbox's own DNS stub: a read-only
  //     /etc/resolv.conf of ours over the image's.
  if (spec_.dns_stub) {
    static const char kResolvConf[] = "nameserver 127.0.0.1\noptions ndots:1\n";
    int fd = ::open("/resolv.conf", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return fail(f, errno, "create", "/resolv.conf");
    ssize_t n = ::write(fd, kResolvConf, sizeof kResolvConf - 1);
    ::close(fd);
    if (n != sizeof kResolvConf - 1) return fail(f, errno, "write", "/resolv.conf");
    UniqueFd target(open_in_root(root.get(), "etc/resolv.conf", Create::kFile, f));
    if (target.get() < 0) return false;
    if (!bind(AT_FDCWD, "/resolv.conf", target.get(), false,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
              "etc/resolv.conf", f))
      return false;
  }

  // 9c. Names of its own: localhost and the host name, where the root
  //     brings no /etc/hosts.
  if (!hosts_.empty()) {
    bool ours = hosts_made;
    if (!ours) {
      UniqueFd existing(openat2_in_root(root.get(), "etc/hosts", O_PATH));
      ours = existing.get() < 0 && errno == ENOENT;
    }
    // A convenience, not a confinement: a root where the point cannot be
    // made (read-only, with no overlay) goes without; the DNS stub still
    // answers localhost.
    ChildFailure unmade;
    UniqueFd target(ours ? open_in_root(root.get(), "etc/hosts", Create::kFile, &unmade) : -1);
    if (target.get() >= 0) {
      int fd = ::open("/hosts", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd < 0) return fail(f, errno, "create", "/hosts");
      const ssize_t want = static_cast<ssize_t>(hosts_.size());
      ssize_t n = ::write(fd, hosts_.data(), hosts_.size());
      ::close(fd);
      if (n != want) return fail(f, errno, "write", "/hosts");
      if (!bind(AT_FDCWD, "/hosts", target.get(), false,
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                "etc/hosts", f))
        return false;
    }
  }

  // 10. The working directory (and the home directory) exist before the
  //     root may turn read-only.
  for (int which = 0; which < 2; ++which) {
    const char* path = which == 0 ? workdir_.c_str() : home_.c_str();
    const char* shown = which == 0 ? spec_.workdir.c_str() : spec_.home.c_str();
    if (which == 1 && home_.empty()) break;
    bool created = false;
    UniqueFd wd(open_in_root(root.get(), path, Create::kDirectory, f, &created));
    if (wd.get() < 0) {
      child::copy(f->what, sizeof f->what, which == 0 ? "--workdir" : "home directory");
      child::copy(f->detail, sizeof f->detail, shown);
      return false;
    }
    // A directory made for the sandbox user belongs to that user.
    if (created &&
        ::fchownat(wd.get(), "", spec_.workdir_uid, spec_.workdir_gid, AT_EMPTY_PATH) != 0)
      return fail(f, errno, which == 0 ? "chown --workdir" : "chown the home directory", shown);
    // So does the home directory that the root already has (an image's
    // /sandbox made for another user): on overlayfs the change is the
    // sandbox's own (copied up). Best effort: an owner the sandbox cannot
    // map stays.
    // Only a directory of that name, not what a symlink there leads to.
    struct stat st;
    if (which == 1 && !created && ::fstatat(root.get(), path, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode) && (st.st_uid != spec_.workdir_uid || st.st_gid != spec_.workdir_gid))
      (void)::fchownat(wd.get(), "", spec_.workdir_uid, spec_.workdir_gid, AT_EMPTY_PATH);
  }

  // 11. The init's image, taken while the host's tree is still reachable.
  if (spec_.exe_sealed) {
    *init_exe_fd = ::fcntl(self_exe_fd, F_DUPFD_CLOEXEC, 3);
    if (*init_exe_fd < 0) return fail(f, errno, "keep the init's program");
  } else {
    *init_exe_fd = seal_self(exe_.c_str(), self_exe_fd, f);
    if (*init_exe_fd < 0) return false;
  }

  // 12. A read-only root.
  if (host_root) {
    if (!set_attrs(host_root_mount.get(), MOUNT_ATTR_RDONLY, false, "/", f)) return false;
  } else if (spec_.read_only) {
    UniqueFd mnt(::open_tree(root.get(), "", AT_EMPTY_PATH | OPEN_TREE_CLOEXEC));
    if (mnt.get() < 0 || !set_attrs(mnt.get(), MOUNT_ATTR_RDONLY, false, "/", f)) {
      if (mnt.get() < 0) fail(f, errno, "open_tree", "/");
      return false;
    }
  }

  // 13. Into the new root; the staging root and the host's tree are detached
  //     in one step.
  if (::fchdir(root.get()) != 0) return fail(f, errno, "chdir", "/newroot");
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return fail(f, errno, "pivot_root");
  if (::umount2(".", MNT_DETACH) != 0) return fail(f, errno, "detach the host's root");
  if (::chdir("/") != 0) return fail(f, errno, "chdir", "/");
  if (workdir_[0] != '\0' && ::chdir(spec_.workdir.c_str()) != 0)
    return fail(f, errno, "--workdir", spec_.workdir.c_str());
  return true;
}

}  // namespace openshell::namespaces
