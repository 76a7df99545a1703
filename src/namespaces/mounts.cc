#include "namespaces/mounts.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>

#include "base/error.h"
#include "base/files.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "policy/policy.h"

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

namespace {

using child::fail;

// ---- child side: raw syscalls, no allocation --------------------------------

enum class Create { kNo, kDirectory, kFile };

// Closes an fd on scope exit (child side; close(2) is async-signal-safe).
struct ScopedFd {
  int fd = -1;
  ScopedFd() = default;
  explicit ScopedFd(int f) : fd(f) {}
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  ScopedFd& operator=(int f) {
    if (fd >= 0) ::close(fd);
    fd = f;
    return *this;
  }
  ~ScopedFd() {
    if (fd >= 0) ::close(fd);
  }
  int release() {
    int f = fd;
    fd = -1;
    return f;
  }
};

int openat2_in_root(int root, const char* path, uint64_t flags) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  return static_cast<int>(::syscall(SYS_openat2, root, path, &how, sizeof how));
}

// Opens `path` (relative to root, resolved as if root were "/") as O_PATH,
// creating missing directories, and the last component as `create` says.
// *created tells whether the last component was made here.
int open_in_root(int root, const char* path, Create create, ChildFailure* f,
                 bool* created = nullptr) {
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
  ScopedFd parent(openat2_in_root(root, ".", O_PATH | O_DIRECTORY));
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
          rc =
              ::openat(parent.fd, name, O_CREAT | O_EXCL | O_WRONLY | O_NOFOLLOW | O_CLOEXEC, 0644);
          if (rc >= 0) ::close(rc);
        } else {
          rc = ::mkdirat(parent.fd, name, 0755);
        }
        if (rc < 0 && errno != EEXIST) return fail(f, errno, "create mount point /", path), -1;
        if (last && created && rc >= 0) *created = true;
        next = openat2_in_root(root, buf, O_PATH);
      }
      if (next < 0) return fail(f, errno, "open mount point /", path), -1;
      parent = next;
    }
    if (!last) buf[end] = '/';
    start = end + 1;
  }
  return parent.release();
}

// Reads the file system context's messages ("e overlay: ...") into detail.
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

struct Option {
  const char* key;
  const char* value;  // nullptr: a flag
};

// Mounts a new file system of `type` on target_fd. Returns the mount's fd
// (for later mount_setattr) or -1.
int mount_fs(const char* type, const Option* options, int n_options, unsigned attrs, int target_fd,
             const char* where, ChildFailure* f) {
  ScopedFd fs(::fsopen(type, FSOPEN_CLOEXEC));
  if (fs.fd < 0) return fail(f, errno, "fsopen", type), -1;
  for (int i = 0; i < n_options; ++i) {
    const Option& o = options[i];
    int rc = o.value ? ::fsconfig(fs.fd, FSCONFIG_SET_STRING, o.key, o.value, 0)
                     : ::fsconfig(fs.fd, FSCONFIG_SET_FLAG, o.key, nullptr, 0);
    if (rc != 0) {
      int err = errno;
      fail(f, err, "mount option", o.key);
      child::append(f->detail, sizeof f->detail, " for ");
      child::append(f->detail, sizeof f->detail, type);
      read_fs_log(fs.fd, f);
      return -1;
    }
  }
  if (::fsconfig(fs.fd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
    int err = errno;
    fail(f, err, "mount", type);
    child::append(f->detail, sizeof f->detail, " on /");
    child::append(f->detail, sizeof f->detail, where);
    read_fs_log(fs.fd, f);
    return -1;
  }
  int mnt = ::fsmount(fs.fd, FSMOUNT_CLOEXEC, attrs);
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

// Bind-mounts source (an absolute path in the current root, or relative to
// source_dirfd) onto target_fd.
bool bind(int source_dirfd, const char* source, int target_fd, bool recursive, unsigned attrs,
          const char* where, ChildFailure* f) {
  unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0);
  if (source[0] == '\0') flags |= AT_EMPTY_PATH;
  ScopedFd tree(::open_tree(source_dirfd, source, flags));
  if (tree.fd < 0) return fail(f, errno, "bind mount", source);
  if (attrs && !set_attrs(tree.fd, attrs, recursive, where, f)) return false;
  if (::move_mount(tree.fd, "", target_fd, "", MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) !=
      0) {
    fail(f, errno, "bind mount on /", where);
    return false;
  }
  return true;
}

// unreachable_ok: a path the child cannot reach (EACCES, ENOTDIR) is
// skipped, as the sandbox, with fewer rights than the child, cannot reach it
// either.
bool mask_path(int root, const char* path, ChildFailure* f, bool unreachable_ok = false) {
  int fd = openat2_in_root(root, path, O_PATH | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT || errno == ELOOP) return true;
    if (unreachable_ok && (errno == EACCES || errno == ENOTDIR)) return true;
    return fail(f, errno, "mask", path);
  }
  ScopedFd target(fd);
  struct stat st;
  if (::fstat(target.fd, &st) != 0) return fail(f, errno, "mask", path);
  if (S_ISDIR(st.st_mode)) {
    Option opts[] = {{"size", "0"}, {"mode", "0555"}};
    int mnt = mount_fs("tmpfs", opts, 2,
                       MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                       target.fd, path, f);
    if (mnt < 0) return false;
    ::close(mnt);
    return true;
  }
  return bind(AT_FDCWD, "/oldroot/dev/null", target.fd, false,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, path, f);
}

bool make_read_only(int root, const char* path, ChildFailure* f) {
  int fd = openat2_in_root(root, path, O_PATH | O_NOFOLLOW);
  if (fd < 0) {
    if (errno == ENOENT) return true;
    return fail(f, errno, "read-only", path);
  }
  ScopedFd target(fd);
  return bind(target.fd, "", target.fd, true,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, path,
              f);
}

bool build_dev(int root, bool tty_group, const char* shm_size, const char* shm_inodes,
               ChildFailure* f) {
  ScopedFd target(open_in_root(root, "dev", Create::kDirectory, f));
  if (target.fd < 0) return false;
  Option opts[] = {{"mode", "0755"}, {"size", "65536"}};
  ScopedFd dev_mount(
      mount_fs("tmpfs", opts, 2, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, target.fd, "dev", f));
  if (dev_mount.fd < 0) return false;
  ScopedFd dev(openat2_in_root(root, "dev", O_PATH | O_DIRECTORY));
  if (dev.fd < 0) return fail(f, errno, "open", "/dev");

  // Device nodes are bind mounts of the host's: no mknod, which a user
  // namespace cannot do anyway.
  static const char* const kNodes[] = {"null", "zero", "full", "random", "urandom", "tty"};
  for (const char* node : kNodes) {
    char source[64] = "/oldroot/dev/";
    child::append(source, sizeof source, node);
    char where[32] = "dev/";
    child::append(where, sizeof where, node);
    ScopedFd node_target(open_in_root(root, where, Create::kFile, f));
    if (node_target.fd < 0) return false;
    if (!bind(AT_FDCWD, source, node_target.fd, false, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, where,
              f))
      return false;
  }

  ScopedFd pts(open_in_root(root, "dev/pts", Create::kDirectory, f));
  if (pts.fd < 0) return false;
  Option pts_opts[] = {
      {"newinstance", nullptr}, {"ptmxmode", "0666"}, {"mode", "0620"}, {"gid", "5"}};
  ScopedFd pts_mount(mount_fs("devpts", pts_opts, tty_group ? 4 : 3,
                              MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, pts.fd, "dev/pts", f));
  if (pts_mount.fd < 0) return false;

  ScopedFd shm(open_in_root(root, "dev/shm", Create::kDirectory, f));
  if (shm.fd < 0) return false;
  Option shm_opts[] = {{"mode", "1777"}, {"size", shm_size}, {"nr_inodes", shm_inodes}};
  ScopedFd shm_mount(mount_fs("tmpfs", shm_opts, shm_size[0] ? 3 : 1,
                              MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, shm.fd,
                              "dev/shm", f));
  if (shm_mount.fd < 0) return false;

  struct Link {
    const char* target;
    const char* name;
  };
  static const Link kLinks[] = {{"pts/ptmx", "ptmx"},
                                {"/proc/self/fd", "fd"},
                                {"/proc/self/fd/0", "stdin"},
                                {"/proc/self/fd/1", "stdout"},
                                {"/proc/self/fd/2", "stderr"}};
  ScopedFd dev_dir(openat2_in_root(root, "dev", O_DIRECTORY | O_RDONLY));
  if (dev_dir.fd < 0) return fail(f, errno, "open", "/dev");
  for (const Link& link : kLinks)
    if (::symlinkat(link.target, dev_dir.fd, link.name) != 0 && errno != EEXIST)
      return fail(f, errno, "symlink /dev/", link.name);

  // Nothing more is created in /dev: freeze it.
  return set_attrs(dev_mount.fd, MOUNT_ATTR_RDONLY, false, "/dev", f);
}

// The host's / seen through a tmpfs: every top-level entry read-only (a
// recursive bind, a symlink copied, a file bound), except the kernel's file
// systems and /tmp and /run, which the sandbox gets fresh. The tmpfs lets the
// sandbox have mount points the host lacks (/sandbox).
bool mirror_host_root(int root, ChildFailure* f) {
  ScopedFd old(::open("/oldroot", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (old.fd < 0) return fail(f, errno, "open", "/oldroot");
  struct Dirent64 {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
  };
  alignas(8) char buf[8192];
  for (;;) {
    long n = ::syscall(SYS_getdents64, old.fd, buf, sizeof buf);
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
        if (::fstatat(old.fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        type = S_ISDIR(st.st_mode)   ? DT_DIR
               : S_ISLNK(st.st_mode) ? DT_LNK
               : S_ISREG(st.st_mode) ? DT_REG
                                     : DT_UNKNOWN;
      }
      const unsigned ro = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
      if (type == DT_LNK) {
        char target[4096];
        ssize_t len = ::readlinkat(old.fd, name, target, sizeof target - 1);
        if (len < 0) continue;
        target[len] = '\0';
        if (::symlinkat(target, root, name) != 0) return fail(f, errno, "symlink /", name);
      } else if (type == DT_DIR || type == DT_REG) {
        if (type == DT_DIR ? ::mkdirat(root, name, 0755) != 0
                           : ::mknodat(root, name, S_IFREG | 0644, 0) != 0)
          return fail(f, errno, "create mount point /", name);
        ScopedFd target(::openat(root, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
        if (target.fd < 0) return fail(f, errno, "open mount point /", name);
        if (!bind(old.fd, name, target.fd, type == DT_DIR, ro, name, f)) return false;
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

MountPlan::MountPlan(const FilesystemSpec& spec) : spec_(spec) {
  // A memory file system's inodes cost kernel memory that its size does not
  // count: bounded with it.
  staging_options_ = "mode=0700";
  if (spec_.tmp_size) {
    tmp_size_ = std::to_string(spec_.tmp_size);
    tmp_inodes_ = std::to_string(limits::tmpfs_inodes(spec_.tmp_size));
    staging_options_ += ",size=" + tmp_size_ + ",nr_inodes=" + tmp_inodes_;
  }
  if (spec_.shm_size) {
    shm_size_ = std::to_string(spec_.shm_size);
    shm_inodes_ = std::to_string(limits::tmpfs_inodes(spec_.shm_size));
  }
  auto in_oldroot = [](const std::string& host_path) {
    return host_path == "/" ? std::string("/oldroot") : "/oldroot" + host_path;
  };
  auto relative = [](const std::string& path) {
    size_t i = 0;
    while (i < path.size() && path[i] == '/') ++i;
    return path.substr(i);
  };
  if (spec_.root == RootKind::kDirectory) {
    std::vector<std::string> hosts;
    if (spec_.layers.empty()) {
      if (spec_.rootfs.empty()) throw Error("--rootfs: no directory given");
      spec_.rootfs = files::canonical(spec_.rootfs, "--rootfs");
      if (!files::is_directory(spec_.rootfs))
        throw Error("--rootfs " + spec_.rootfs + ": not a directory");
      hosts.push_back(spec_.rootfs);
    } else {
      if (spec_.plain_root) throw Error("an image's layers cannot be a plain root");
      if (spec_.layers.size() > 128) throw Error("the image has more than 128 layers");
      for (auto& layer : spec_.layers) {
        layer = files::canonical(layer, "image layer");
        hosts.push_back(layer);
      }
    }
    std::vector<std::string> sources, attach_points;
    for (size_t i = 0; i < hosts.size(); ++i) {
      Lower lower{hosts[i], in_oldroot(hosts[i]), "/lower" + std::to_string(i)};
      sources.push_back(lower.source);
      attach_points.push_back(lower.attach);
      lowers_.push_back(std::move(lower));
    }
    lowers_escaped_ = overlay_lowerdir_list(sources);
    attached_escaped_ = overlay_lowerdir_list(attach_points);
    if (spec_.plain_root && !spec_.layer_dir.empty())
      throw Error("a plain root has no separate writable layer");
    if (!spec_.layer_dir.empty())
      layer_ = in_oldroot(files::canonical(spec_.layer_dir, "writable layer"));
  }
  for (const auto& b : spec_.binds) {
    if (auto why = policy::check_policy_path(b.target); !why.empty())
      throw Error("--bind " + b.source + ":" + b.target + ": destination " + why);
    if (text::normalize_path(b.target) == "/")
      throw Error("--bind " + b.source + ":" + b.target + ": cannot replace the root");
    std::string source = files::canonical(b.source, "--bind source");
    binds_.push_back({source, in_oldroot(source), relative(text::normalize_path(b.target)),
                      b.read_only, files::is_directory(source)});
  }
  if (auto why = policy::check_policy_path(spec_.workdir); !why.empty())
    throw Error("--workdir " + spec_.workdir + ": " + why);
  spec_.workdir = text::normalize_path(spec_.workdir);
  workdir_ = relative(spec_.workdir);
  if (!spec_.home.empty()) {
    if (auto why = policy::check_policy_path(spec_.home); !why.empty())
      throw Error("home directory " + spec_.home + ": " + why);
    spec_.home = text::normalize_path(spec_.home);
    // Also when it is the working directory: a workdir that exists is only
    // made the user's when it is the home.
    if (spec_.home != "/") home_ = relative(spec_.home);
  }
  exe_ = in_oldroot(spec_.exe_path);
  render_hidden();
}

// Where each hidden host path shows in the sandbox: below the host's root
// (or a directory root) and below each bind source that contains it.
void MountPlan::render_hidden() {
  auto strictly_under = [](const std::string& path, const std::string& dir) {
    if (dir == "/") return path.size() > 1 && path[0] == '/';
    return path.size() > dir.size() && path.compare(0, dir.size(), dir) == 0 &&
           path[dir.size()] == '/';
  };
  auto join = [](const std::string& dir, const std::string& rest) {
    std::string out = dir;
    while (!out.empty() && out.back() == '/') out.pop_back();
    out += rest;
    size_t i = 0;
    while (i < out.size() && out[i] == '/') ++i;
    return out.substr(i);
  };
  for (const auto& hidden : spec_.hidden) {
    if (hidden.empty() || hidden[0] != '/') throw Error("hidden path " + hidden + ": not absolute");
    std::string root_source = spec_.root == RootKind::kHost ? "/"
                              : spec_.layers.empty()        ? spec_.rootfs
                                                            : "";
    if (!root_source.empty() && strictly_under(hidden, root_source))
      hidden_in_root_.push_back(
          join("/", hidden.substr(root_source == "/" ? 0 : root_source.size())));
    for (const Bind& b : binds_)
      if (b.directory && strictly_under(hidden, b.host_source))
        hidden_in_binds_.push_back(join(b.target, hidden.substr(b.host_source.size())));
  }
}

std::vector<UniqueFd> MountPlan::idmapped_trees(int userns_fd, const IdMap& map, uint32_t uid,
                                                uint32_t gid) const {
  auto idmapped = [&userns_fd](const std::string& path, bool recursive, unsigned extra) {
    unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0);
    UniqueFd tree(::open_tree(AT_FDCWD, path.c_str(), flags));
    if (!tree) return UniqueFd();
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | extra;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
    unsigned at = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
    if (::mount_setattr(tree.get(), "", at, &attr, sizeof attr) != 0) return UniqueFd();
    return tree;
  };
  std::vector<UniqueFd> trees;
  for (const Lower& lower : lowers_) trees.push_back(idmapped(lower.host, false, 0));
  UniqueFd layer;
  if (!spec_.layer_dir.empty())
    layer.reset(
        ::open_tree(AT_FDCWD, spec_.layer_dir.c_str(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC));
  trees.push_back(std::move(layer));
  const auto sandbox_uid = map.host_uid(uid);
  const auto sandbox_gid = map.host_gid(gid);
  std::map<std::pair<uid_t, gid_t>, UniqueFd> owner_namespaces;
  for (const Bind& b : binds_) {
    struct stat st;
    if (!sandbox_uid || !sandbox_gid || ::stat(b.host_source.c_str(), &st) != 0 || st.st_uid == 0 ||
        st.st_gid == 0) {
      trees.emplace_back();
      continue;
    }
    // The owner's ids read as the sandbox user's kernel ids; nothing else maps.
    auto& owner_ns = owner_namespaces[{st.st_uid, st.st_gid}];
    if (!owner_ns)
      owner_ns =
          make_user_namespace({{st.st_uid, *sandbox_uid, 1}}, {{st.st_gid, *sandbox_gid, 1}});
    userns_fd = owner_ns.get();
    // Recursive where every submount allows it, else the top mount alone.
    UniqueFd tree = idmapped(b.host_source, true, b.read_only ? MOUNT_ATTR_RDONLY : 0);
    if (!tree) tree = idmapped(b.host_source, false, b.read_only ? MOUNT_ATTR_RDONLY : 0);
    trees.push_back(std::move(tree));
  }
  return trees;
}

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

  // 3. The root.
  ScopedFd host_root_mount;
  {
    ScopedFd newroot(::open("/newroot", O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (newroot.fd < 0) return fail(f, errno, "open", "/newroot");
    if (host_root) {
      Option opts[] = {{"mode", "0755"}};
      host_root_mount =
          mount_fs("tmpfs", opts, 1, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, newroot.fd, "", f);
      if (host_root_mount.fd < 0) return false;
    } else if (spec_.plain_root) {
      // The sandbox's own copy, written through.
      const unsigned attrs =
          MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (spec_.read_only ? MOUNT_ATTR_RDONLY : 0);
      if (!bind(AT_FDCWD, lower_path(0), newroot.fd, true, attrs, "", f)) return false;
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
      ScopedFd mnt(mount_fs("overlay", opts, static_cast<int>(n), attrs, newroot.fd, "", f));
      bool mounted = mnt.fd >= 0;
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
        if (!bind(AT_FDCWD, lower_path(0), newroot.fd, true,
                  MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, "", f))
          return false;
      }
    }
  }
  ScopedFd root(::open("/newroot", O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (root.fd < 0) return fail(f, errno, "open", "/newroot");
  if (host_root && !mirror_host_root(root.fd, f)) return false;

  // 4. A fresh /proc, mounted while the host's is still visible (the kernel
  //    allows a new proc only where a full one is already in view).
  {
    ScopedFd target(open_in_root(root.fd, "proc", Create::kDirectory, f));
    if (target.fd < 0) return false;
    ScopedFd mnt(mount_fs("proc", nullptr, 0,
                          MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC |
                              (spec_.proc_read_only ? MOUNT_ATTR_RDONLY : 0),
                          target.fd, "proc", f));
    if (mnt.fd < 0) return false;
  }

  // 5. /dev without mknod.
  if (!build_dev(root.fd, tty_group, shm_size_.c_str(), shm_inodes_.c_str(), f)) return false;

  // 6. /sys read-only: a fresh sysfs shows only this network namespace.
  {
    ScopedFd target(open_in_root(root.fd, "sys", Create::kDirectory, f));
    if (target.fd < 0) return false;
    ChildFailure ignored;
    ScopedFd mnt(
        mount_fs("sysfs", nullptr, 0,
                 MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                 target.fd, "sys", &ignored));
    if (mnt.fd < 0 &&
        !bind(AT_FDCWD, "/oldroot/sys", target.fd, true,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, "sys",
              f))
      return false;
  }

  // 7. A private /tmp in memory: writable whatever the image's owners are
  //    (a user namespace cannot copy up a directory owned by an id it does
  //    not map); and on the host's root, an empty /run, so that the host's
  //    service sockets stay out of sight.
  {
    const char* dirs[] = {"tmp", host_root ? "run" : nullptr};
    for (const char* dir : dirs) {
      if (!dir) continue;
      ScopedFd target(open_in_root(root.fd, dir, Create::kDirectory, f));
      if (target.fd < 0) return false;
      Option opts[] = {{"mode", dir[0] == 't' ? "1777" : "0755"},
                       {"size", tmp_size_.c_str()},
                       {"nr_inodes", tmp_inodes_.c_str()}};
      ScopedFd mnt(mount_fs("tmpfs", opts, tmp_size_.empty() ? 1 : 3,
                            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, target.fd, dir, f));
      if (mnt.fd < 0) return false;
    }
  }

  // 8. Masked and read-only kernel paths.
  for (const char* const* p = kMaskedPaths; *p; ++p)
    if (!mask_path(root.fd, *p, f)) return false;
  for (const char* const* p = kReadOnlyPaths; *p; ++p)
    if (!make_read_only(root.fd, *p, f)) return false;
  // openshell's own state and sockets, before the binds: a bind of one of
  // them is the caller's explicit choice.
  for (const auto& path : hidden_in_root_)
    if (!mask_path(root.fd, path.c_str(), f, true)) return false;

  // 9. The caller's bind mounts.
  for (size_t i = 0; i < binds_.size(); ++i) {
    const Bind& b = binds_[i];
    ScopedFd target(open_in_root(root.fd, b.target.c_str(),
                                 b.directory ? Create::kDirectory : Create::kFile, f));
    if (target.fd < 0) return false;
    const int tree = bind_trees[i];
    if (tree >= 0) {
      // Prepared by the parent, attributes and all.
      if (::move_mount(tree, "", target.fd, "",
                       MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH) != 0)
        return fail(f, errno, "bind mount on /", b.target.c_str());
      continue;
    }
    unsigned attrs = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | (b.read_only ? MOUNT_ATTR_RDONLY : 0);
    if (!bind(AT_FDCWD, b.source.c_str(), target.fd, true, attrs, b.target.c_str(), f))
      return false;
  }
  // What of openshell's a bind of a parent directory brought back.
  for (const auto& path : hidden_in_binds_)
    if (!mask_path(root.fd, path.c_str(), f, true)) return false;

  // 9b. Names resolve through the sandbox's own DNS stub: a read-only
  //     /etc/resolv.conf of ours over the image's.
  if (spec_.dns_stub) {
    static const char kResolvConf[] = "nameserver 127.0.0.1\noptions ndots:1\n";
    int fd = ::open("/resolv.conf", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return fail(f, errno, "create", "/resolv.conf");
    ssize_t n = ::write(fd, kResolvConf, sizeof kResolvConf - 1);
    ::close(fd);
    if (n != sizeof kResolvConf - 1) return fail(f, errno, "write", "/resolv.conf");
    ScopedFd target(open_in_root(root.fd, "etc/resolv.conf", Create::kFile, f));
    if (target.fd < 0) return false;
    if (!bind(AT_FDCWD, "/resolv.conf", target.fd, false,
              MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
              "etc/resolv.conf", f))
      return false;
  }

  // 10. The working directory (and the home directory) exist before the
  //     root may turn read-only.
  for (int which = 0; which < 2; ++which) {
    const char* path = which == 0 ? workdir_.c_str() : home_.c_str();
    const char* shown = which == 0 ? spec_.workdir.c_str() : spec_.home.c_str();
    if (which == 1 && home_.empty()) break;
    bool created = false;
    ScopedFd wd(open_in_root(root.fd, path, Create::kDirectory, f, &created));
    if (wd.fd < 0) {
      child::copy(f->what, sizeof f->what, which == 0 ? "--workdir" : "home directory");
      child::copy(f->detail, sizeof f->detail, shown);
      return false;
    }
    // A directory made for the sandbox user belongs to that user.
    if (created && ::fchownat(wd.fd, "", spec_.workdir_uid, spec_.workdir_gid, AT_EMPTY_PATH) != 0)
      return fail(f, errno, which == 0 ? "chown --workdir" : "chown the home directory", shown);
    // So does the home directory that the root already has (an image's
    // /sandbox made for another user): on overlayfs the change is the
    // sandbox's own (copied up). Best effort: an owner the sandbox cannot
    // map stays.
    // Only a directory of that name, not what a symlink there leads to.
    struct stat st;
    if (which == 1 && !created && ::fstatat(root.fd, path, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
        S_ISDIR(st.st_mode) && (st.st_uid != spec_.workdir_uid || st.st_gid != spec_.workdir_gid))
      (void)::fchownat(wd.fd, "", spec_.workdir_uid, spec_.workdir_gid, AT_EMPTY_PATH);
  }

  // 11. The init's image, taken while the host's tree is still reachable.
  *init_exe_fd = seal_self(exe_.c_str(), self_exe_fd, f);
  if (*init_exe_fd < 0) return false;

  // 12. A read-only root.
  if (host_root) {
    if (!set_attrs(host_root_mount.fd, MOUNT_ATTR_RDONLY, false, "/", f)) return false;
  } else if (spec_.read_only) {
    ScopedFd mnt(::open_tree(root.fd, "", AT_EMPTY_PATH | OPEN_TREE_CLOEXEC));
    if (mnt.fd < 0 || !set_attrs(mnt.fd, MOUNT_ATTR_RDONLY, false, "/", f)) {
      if (mnt.fd < 0) fail(f, errno, "open_tree", "/");
      return false;
    }
  }

  // 13. Into the new root; the staging root and the host's tree are detached
  //     in one step.
  if (::fchdir(root.fd) != 0) return fail(f, errno, "chdir", "/newroot");
  if (::syscall(SYS_pivot_root, ".", ".") != 0) return fail(f, errno, "pivot_root");
  if (::umount2(".", MNT_DETACH) != 0) return fail(f, errno, "detach the host's root");
  if (::chdir("/") != 0) return fail(f, errno, "chdir", "/");
  if (workdir_[0] != '\0' && ::chdir(spec_.workdir.c_str()) != 0)
    return fail(f, errno, "--workdir", spec_.workdir.c_str());
  return true;
}

std::string overlay_problem(const std::vector<std::string>& lowers, const std::string& scratch_dir,
                            bool list_form_only) {
  const std::string upper = scratch_dir + "/upper", work = scratch_dir + "/work",
                    merged = scratch_dir + "/merged";
  for (const auto& d : {upper, work, merged})
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
      return errno_message("create " + d, errno);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return errno_message("pipe", errno);
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  char list_options[4096];
  const bool list_fits =
      overlay_list_options(list_options, sizeof list_options, overlay_lowerdir_list(lowers).c_str(),
                           upper.c_str(), work.c_str());
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(report[0]);
    ::close(report[1]);
    return errno_message("fork", err);
  }
  if (pid == 0) {
    ::close(report[0]);
    ChildFailure failure;
    auto done = [&](bool ok) {
      if (!ok) (void)!::write(report[1], &failure, sizeof failure);
      ::_exit(ok ? 0 : 1);
    };
    int flags = CLONE_NEWNS | (uid != 0 ? CLONE_NEWUSER : 0);
    if (::unshare(flags) != 0) done(fail(&failure, errno, "unshare"));
    auto write_file = [](const char* path, const char* text) {
      int fd = ::open(path, O_WRONLY | O_CLOEXEC);
      if (fd < 0) return false;
      bool ok = ::write(fd, text, std::strlen(text)) == static_cast<ssize_t>(std::strlen(text));
      ::close(fd);
      return ok;
    };
    if (uid != 0) {
      char map[64];
      std::snprintf(map, sizeof map, "0 %u 1", static_cast<unsigned>(uid));
      if (!write_file("/proc/self/uid_map", map) || !write_file("/proc/self/setgroups", "deny"))
        done(fail(&failure, errno, "write", "uid_map"));
      std::snprintf(map, sizeof map, "0 %u 1", static_cast<unsigned>(gid));
      if (!write_file("/proc/self/gid_map", map)) done(fail(&failure, errno, "write", "gid_map"));
    }
    // "lowerdir+" per layer (6.8 on), else the list form through mount(2),
    // as the sandbox's own mount falls back. A kernel without "lowerdir+"
    // refuses it when it is set (6.5 to 6.7) or at the creation (before).
    auto try_lowerdir_plus = [&]() {
      ScopedFd fs(::fsopen("overlay", FSOPEN_CLOEXEC));
      if (fs.fd < 0) return fail(&failure, errno, "fsopen", "overlay");
      bool ok = true;
      for (const auto& lower : lowers)
        if (ok) ok = ::fsconfig(fs.fd, FSCONFIG_SET_STRING, "lowerdir+", lower.c_str(), 0) == 0;
      if (!ok || ::fsconfig(fs.fd, FSCONFIG_SET_STRING, "upperdir", upper.c_str(), 0) != 0 ||
          ::fsconfig(fs.fd, FSCONFIG_SET_STRING, "workdir", work.c_str(), 0) != 0 ||
          ::fsconfig(fs.fd, FSCONFIG_SET_FLAG, "userxattr", nullptr, 0) != 0 ||
          ::fsconfig(fs.fd, FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
        fail(&failure, errno, "mount", "overlay");
        read_fs_log(fs.fd, &failure);
        return false;
      }
      return true;
    };
    auto try_list_form = [&]() {
      if (!list_fits)
        return fail(&failure, E2BIG, "overlay options (list form) for", merged.c_str());
      if (::mount("overlay", merged.c_str(), "overlay", MS_NOSUID | MS_NODEV, list_options) != 0)
        return fail(&failure, errno, "mount overlay (list form) at", merged.c_str());
      return true;
    };
    bool mounted = false;
    if (!list_form_only) mounted = try_lowerdir_plus();
    if (list_form_only || (!mounted && failure.err == EINVAL)) mounted = try_list_form();
    done(mounted);
  }
  ::close(report[1]);
  ChildFailure failure;
  ssize_t n = ::read(report[0], &failure, sizeof failure);
  ::close(report[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // The kernel's work/work directory (mode 000) goes with the rest.
  for (const auto& d : {work + "/work", work + "/index", upper, work, merged}) ::rmdir(d.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (n == static_cast<ssize_t>(sizeof failure)) return failure.message();
  return "the overlay probe failed";
}

std::string overlay_lowerdir_list(const std::vector<std::string>& lowers) {
  std::string list;
  for (size_t i = 0; i < lowers.size(); ++i) {
    if (i) list += ':';
    for (char c : lowers[i]) {
      if (c == ':' || c == '\\' || c == ',') list += '\\';
      list += c;
    }
  }
  return list;
}

namespace {

// Appends `src` with ':', ',' and '\' escaped; false when it does not fit.
bool append_escaped(char* out, size_t size, size_t* len, const char* src) {
  for (; *src; ++src) {
    const bool escape = *src == ':' || *src == ',' || *src == '\\';
    if (*len + (escape ? 2 : 1) >= size) return false;
    if (escape) out[(*len)++] = '\\';
    out[(*len)++] = *src;
  }
  out[*len] = '\0';
  return true;
}

bool append_plain(char* out, size_t size, size_t* len, const char* src) {
  for (; *src; ++src) {
    if (*len + 1 >= size) return false;
    out[(*len)++] = *src;
  }
  out[*len] = '\0';
  return true;
}

}  // namespace

bool overlay_list_options(char* out, size_t size, const char* lowers, const char* upper,
                          const char* work) {
  if (size == 0) return false;
  size_t len = 0;
  out[0] = '\0';
  return append_plain(out, size, &len, "lowerdir=") && append_plain(out, size, &len, lowers) &&
         append_plain(out, size, &len, ",upperdir=") && append_escaped(out, size, &len, upper) &&
         append_plain(out, size, &len, ",workdir=") && append_escaped(out, size, &len, work) &&
         append_plain(out, size, &len, ",userxattr");
}

}  // namespace openshell::namespaces
