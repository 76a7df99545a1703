// The sandbox's file system view: a root (overlay of a directory, or the
// host's / read-only), fresh /proc, a minimal /dev made without mknod, /sys
// read-only, masked kernel paths, the caller's own file systems (tmpfs,
// mqueue) and bind mounts, then pivot_root into it with the host's tree
// detached.
//
// The plan is rendered in the parent (all strings, no decisions left) and
// applied in the child between clone and exec with raw syscalls only. Mount
// targets are resolved inside the new root (openat2 RESOLVE_IN_ROOT), so a
// symlink in an image cannot point a mount at the host.
//
// mounts.cc renders the plan, mount_apply.cc applies it, kernel_paths.cc
// builds /dev and masks the kernel's paths, with mount_ops.h's primitives;
// overlay.h probes overlayfs.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "base/child_failure.h"
#include "base/unique_fd.h"
#include "namespaces/overlay.h"
#include "namespaces/userns.h"

namespace openshell::namespaces {

// A device node for the child to bind into /dev: "/oldroot/<host path>"
// onto "dev/<name>".
struct DeviceMount {
  std::string source;
  std::string target;
};

struct BindSpec {
  std::string source;  // host path; canonicalised when the plan is made
  std::string target;  // absolute path inside the sandbox
  bool read_only = false;
  bool no_exec = false;  // MOUNT_ATTR_NOEXEC on the bind
};

// A file system of its own at a path in the sandbox (an OCI config's tmpfs or mqueue mount).
struct FsMount {
  std::string type;    // "tmpfs" or "mqueue"; anything else is refused by MountPlan
  std::string target;  // absolute path inside the sandbox, no ".."
  // Mount options for the file system, e.g. "size=65536k,mode=755" (tmpfs only; "" none): split
  // on commas into key[=value] options.
  std::string data;
  bool read_only = false;
  bool no_exec = false;
  bool no_suid = true;
  bool no_dev = true;
};

enum class RootKind {
  kHost,       // the host's / read-only, private /tmp and /run
  kDirectory,  // an overlay: the directory (or an image's layers) below, a writable layer above
};

struct FilesystemSpec {
  RootKind root = RootKind::kHost;
  std::string rootfs;  // host directory for kDirectory
  // kDirectory from an image: its unpacked layers, top first (rootfs unused).
  std::vector<std::string> layers;
  // kDirectory without overlayfs: rootfs is the sandbox's own copy, mounted
  // writable as it is (no layer_dir).
  bool plain_root = false;
  bool read_only = false;  // kDirectory: the root itself read-only (private /tmp)
  // A persistent writable layer: a directory holding upper/ and work/ (one
  // file system, as overlayfs wants); empty: a throw-away layer in memory.
  std::string layer_dir;
  std::vector<BindSpec> binds;
  // Host device nodes bound into the sandbox's /dev (--gpu): each source a
  // character or block device, each target below /dev. Unlike binds, they
  // keep device access (no nodev); the cgroup's device rules and the
  // Landlock rules say what may be opened.
  std::vector<BindSpec> devices;
  std::string workdir = "/";  // created when missing and the root is writable
  uint32_t workdir_uid = 0;   // owner (inside ids) of a workdir or home created here
  uint32_t workdir_gid = 0;
  std::string home;         // another directory made like the workdir ("" none): the user's HOME
  std::string exe_path;     // host path of this binary, for the sealed init image
  bool exe_sealed = false;  // the exe fd given to apply() is a sealed image already
  bool dns_stub = false;    // /etc/resolv.conf names 127.0.0.1 (the sandbox's DNS stub)
  // Non-empty: a root without /etc/hosts gets a read-only one naming
  // localhost (127.0.0.1, ::1) and this host name (127.0.0.1). A root that
  // has one keeps its own.
  std::string hosts_name;
  // Host paths the sandbox never sees, wherever its root or a bind mount
  // would show them (canonical; see runtime/private_paths.h): each directory
  // becomes an empty read-only tmpfs, anything else /dev/null. A bind whose
  // source is such a path itself (or lies inside one) is the caller's
  // explicit choice and shows it. Paths missing in the sandbox are skipped.
  std::vector<std::string> hidden;
  // Sizes of the sandbox's memory file systems, in bytes (0: the kernel's
  // default, half the RAM each): /tmp, which also bounds a throw-away
  // writable layer, and /dev/shm. Their inodes are bounded with them.
  uint64_t tmp_size = 0;
  uint64_t shm_size = 0;
  // /proc mounted read-only, so that no process opens another's
  // /proc/PID/mem for writing (where no Landlock policy covers /proc).
  bool proc_read_only = false;
  // Mounted after the masked/read-only kernel paths (step 8) and before the binds (step 9), in
  // order, so that a bind may land inside one. The target is made (a directory) when missing.
  std::vector<FsMount> fs_mounts;
  // Beyond kMaskedPaths / kReadOnlyPaths: absolute paths inside the sandbox (missing ones skipped,
  // like ours). Applied once every mount and bind is in place, as an OCI runtime applies them, so
  // that they also cover what those show.
  std::vector<std::string> masked_paths;
  std::vector<std::string> read_only_paths;
  // Kernel parameters written through the sandbox's own /proc/sys right after /proc is mounted
  // (step 4), before /proc/sys becomes read-only: "net.ipv4.ip_forward" -> "1" (dots become
  // slashes; a key may also use slashes). A failure stops the start with a line naming the key.
  std::vector<std::pair<std::string, std::string>> sysctls;
  // false: no tmpfs of ours on /tmp (an OCI container keeps its image's /tmp). The host's root
  // always has its own.
  bool private_tmp = true;
};

// Paths the sandbox never sees: files become /dev/null, directories an empty
// read-only tmpfs. Missing ones are skipped.
extern const char* const kMaskedPaths[];
// Kernel interfaces the sandbox may read but never write.
extern const char* const kReadOnlyPaths[];

class MountPlan {
 public:
  // Validates and renders; throws Error naming the faulty part.
  explicit MountPlan(const FilesystemSpec& spec);

  // How many detached trees the parent may hand over: one per lower
  // directory (the root directory, or each image layer), the persistent
  // layer, then one per bind mount.
  size_t tree_count() const { return lowers_.size() + 1 + binds_.size(); }

  // Parent side, as root: detached idmapped mounts for the child to attach.
  //  - The root directory (or each image layer), shifted into the sandbox's
  //    user namespace: the image's files keep their owners inside (root's
  //    belong to root inside). Writes go to the overlay's upper layer,
  //    never to the directory (a plain root is written through the mount).
  //  - The persistent layer directory as it is (the sandbox's ids own it,
  //    but they may not walk the host's path to it).
  //  - Each bind source not owned by root: its owner becomes the sandbox
  //    user (uid/gid inside) and no other id is mapped, so what the sandbox
  //    writes there belongs to that owner on the host, and never to root.
  // An entry is invalid where the file system cannot do it (or the source
  // belongs to root); the child then mounts it plainly and its owners show
  // as nobody inside.
  // shift false (an engine gave the id map, and the files are in its
  // ids already): every tree as it is, none id-mapped.
  std::vector<UniqueFd> idmapped_trees(int userns_fd, const IdMap& map, uint32_t uid, uint32_t gid,
                                       bool shift = true) const;

  // Child side. Builds the root and pivots into it; afterwards the process's
  // root and cwd are the sandbox's "/" and the host's tree is gone.
  // tree_fds: tree_count() entries from idmapped_trees() (or -1 each).
  // tty_group: gid 5 exists inside (pty slaves go to it). self_exe_fd: an
  // open fd of this binary; *init_exe_fd receives a copy of it that nothing
  // in the sandbox can write (a detached read-only mount, or a sealed memfd).
  bool apply(const int* tree_fds, bool tty_group, int self_exe_fd, int* init_exe_fd,
             ChildFailure* failure) const noexcept;

  const FilesystemSpec& spec() const { return spec_; }

 private:
  struct Bind {
    std::string host_source;  // canonical host path
    std::string source;       // "/oldroot/..." as seen from the staging root
    std::string target;       // relative to the new root: "data/x"
    bool read_only;
    bool no_exec;
    bool directory;
  };

  // An FsMount rendered: its options split, its target relative to the new root.
  struct FsOption {
    std::string key;
    std::string value;
    bool flag;  // "key" alone (FSCONFIG_SET_FLAG)
  };
  struct Fs {
    std::string type;
    std::string target;  // relative to the new root: "run"
    std::vector<FsOption> options;
    unsigned attrs;  // MOUNT_ATTR_NOSUID/NODEV/NOEXEC at the mount
    bool read_only;  // set after the binds, so that a bind may land inside it
  };
  static constexpr size_t kMaxFsMounts = 64;
  static constexpr size_t kMaxFsOptions = 32;

  struct Sysctl {
    std::string key;   // as given, for messages
    std::string path;  // "proc/sys/net/ipv4/ip_forward", relative to the new root
    std::string value;
  };

  struct Lower {
    std::string host;    // host path
    std::string source;  // "/oldroot/<host path>"
    std::string attach;  // "/lower<i>": where its idmapped tree goes in the staging root
  };

  void render_hidden();
  void render_fs_mounts();
  void render_kernel_settings();

  FilesystemSpec spec_;
  std::vector<Lower> lowers_;  // kDirectory: top first
  // The "lowerdir" option for kernels before 6.8 (no "lowerdir+"): every
  // source, or every attach point when the lowers are idmapped trees.
  std::string lowers_escaped_;
  std::string attached_escaped_;
  std::string layer_;    // "/oldroot/<layer_dir>" or "" (throw-away)
  std::string exe_;      // "/oldroot/<exe>"
  std::string workdir_;  // relative to the new root
  std::string home_;     // relative to the new root; "" none
  std::vector<Bind> binds_;
  std::vector<DeviceMount> devices_;
  // fs.hidden as the sandbox sees them, relative to the new root: those the
  // root shows (masked before the binds), those the binds show (after).
  std::vector<std::string> hidden_in_root_;
  std::vector<std::string> hidden_in_binds_;
  std::vector<Fs> fs_mounts_;
  // The fs_mounts' targets below /dev, made before /dev is frozen.
  std::vector<std::string> dev_dirs_;
  // fs.masked_paths and fs.read_only_paths, relative to the new root.
  std::vector<std::string> masked_;
  std::vector<std::string> read_only_;
  std::vector<Sysctl> sysctls_;
  // Rendered tmpfs options ("" where the kernel's default applies).
  std::string tmp_size_, tmp_inodes_, shm_size_, shm_inodes_;
  std::string staging_options_;  // mount(2) data of the staging tmpfs
  std::string hosts_;            // the /etc/hosts of ours ("" none)
  // The mount points an overlay root must have, relative to it: those no
  // layer has are made in the writable layer before the overlay is mounted
  // (mount_points.cc), so that none needs write access to the image or
  // directory below.
  struct MountPoint {
    std::string path;
    bool directory;
    bool user_owned;  // the workdir or home: made for workdir_uid/gid
  };
  std::vector<MountPoint> mount_points_;
  // Child side, before the overlay is mounted: makes them in `upper`, with
  // the lowers as apply() reaches them (tree_fds). *hosts_made: etc/hosts
  // was among those no layer had.
  bool make_mount_points(const char* upper, const int* tree_fds, bool* hosts_made,
                         ChildFailure* f) const noexcept;
};

}  // namespace openshell::namespaces
