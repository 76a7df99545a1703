// The mount plan, parent side: a FilesystemSpec validated and rendered into
// strings (no decisions left for the child), and the idmapped trees the
// child attaches.
#include "namespaces/mounts.h"

#include <sys/mount.h>
#include <sys/stat.h>

#include <map>
#include <string_view>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "namespaces/overlay.h"

namespace openshell::namespaces {

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
    if (auto why = text::check_absolute_path(b.target); !why.empty())
      throw Error("--bind " + b.source + ":" + b.target + ": destination " + why);
    if (text::normalize_path(b.target) == "/")
      throw Error("--bind " + b.source + ":" + b.target + ": cannot replace the root");
    std::string source = files::canonical(b.source, "--bind source");
    binds_.push_back({source, in_oldroot(source), relative(text::normalize_path(b.target)),
                      b.read_only, b.no_exec, files::is_directory(source)});
  }
  render_fs_mounts();
  render_kernel_settings();
  for (const auto& d : spec_.devices) {
    const std::string target = text::normalize_path(d.target);
    if (auto why = text::check_absolute_path(d.target); !why.empty())
      throw Error("device " + d.source + ": destination " + d.target + ": " + why);
    if (target.rfind("/dev/", 0) != 0 || target.find("/..") != std::string::npos)
      throw Error("device " + d.source + ": destination " + d.target + ": not below /dev");
    std::string source = files::canonical(d.source, "device");
    struct stat st;
    if (::stat(source.c_str(), &st) != 0) throw_errno("stat the device " + source);
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode))
      throw Error("device " + source + ": not a device node");
    devices_.push_back({in_oldroot(source), relative(target)});
  }
  if (auto why = text::check_absolute_path(spec_.workdir); !why.empty())
    throw Error("--workdir " + spec_.workdir + ": " + why);
  spec_.workdir = text::normalize_path(spec_.workdir);
  workdir_ = relative(spec_.workdir);
  if (!spec_.home.empty()) {
    if (auto why = text::check_absolute_path(spec_.home); !why.empty())
      throw Error("home directory " + spec_.home + ": " + why);
    spec_.home = text::normalize_path(spec_.home);
    // Also when it is the working directory: a workdir that exists is only
    // made the user's when it is the home.
    if (spec_.home != "/") home_ = relative(spec_.home);
  }
  exe_ = in_oldroot(spec_.exe_path);
  render_hidden();
  if (!spec_.hosts_name.empty()) {
    // A name that is no DNS label is not a host name: localhost alone.
    const std::string own = text::is_dns_label(spec_.hosts_name) ? " " + spec_.hosts_name : "";
    hosts_ = "127.0.0.1\tlocalhost" + own + "\n::1\tlocalhost ip6-localhost ip6-loopback\n";
  }
  if (spec_.root == RootKind::kHost && !spec_.private_tmp)
    throw Error(
        "the host's root always has a private /tmp (private_tmp = false is for a root "
        "directory or an image)");
  if (spec_.root == RootKind::kDirectory && !spec_.plain_root) {
    for (const char* dir : {"proc", "dev", "sys", "tmp"})
      if (spec_.private_tmp || std::string_view(dir) != "tmp")
        mount_points_.push_back({dir, true, false});
    for (const Fs& m : fs_mounts_)
      if (m.target.rfind("dev/", 0) != 0) mount_points_.push_back({m.target, true, false});
    for (const Bind& b : binds_) mount_points_.push_back({b.target, b.directory, false});
    if (spec_.dns_stub) mount_points_.push_back({"etc/resolv.conf", false, false});
    if (!hosts_.empty()) mount_points_.push_back({"etc/hosts", false, false});
    if (!workdir_.empty()) mount_points_.push_back({workdir_, true, true});
    if (!home_.empty()) mount_points_.push_back({home_, true, true});
  }
}

namespace {

// An absolute path inside the sandbox, relative to the new root; throws
// naming `what` (and refusing the root itself).
std::string sandbox_relative(const std::string& path, const std::string& what) {
  if (auto why = text::check_absolute_path(path); !why.empty())
    throw Error(what + " " + path + ": " + why);
  const std::string normal = text::normalize_path(path);
  if (normal == "/") throw Error(what + " " + path + ": cannot be the root");
  return normal.substr(1);
}

}  // namespace

// The caller's file systems: each option of `data` a key[=value] for
// fsconfig(), each target relative to the new root.
void MountPlan::render_fs_mounts() {
  if (spec_.fs_mounts.size() > kMaxFsMounts)
    throw Error("more than " + std::to_string(kMaxFsMounts) + " file system mounts");
  for (const FsMount& m : spec_.fs_mounts) {
    const std::string named = "mount " + m.target;
    if (m.type != "tmpfs" && m.type != "mqueue")
      throw Error(named + ": type \"" + m.type + "\" is not supported (tmpfs, mqueue)");
    if (auto why = text::check_absolute_path(m.target); !why.empty())
      throw Error(named + ": destination " + why);
    const std::string target = text::normalize_path(m.target);
    if (target == "/") throw Error(named + ": cannot replace the root");
    // Its nodes are bound from the host's (no mknod): a tmpfs over it would
    // leave the sandbox without /dev/null.
    if (target == "/dev") throw Error(named + ": the sandbox's /dev is its own");
    Fs fs{m.type, target.substr(1), {}, 0, m.read_only};
    if (!m.data.empty()) {
      if (m.type != "tmpfs")
        throw Error(named + ": " + m.type + " takes no options (\"" + m.data + "\")");
      for (const auto& item : text::split(m.data, ',')) {
        if (item.empty()) throw Error(named + ": an empty option in \"" + m.data + "\"");
        const size_t eq = item.find('=');
        if (eq == 0) throw Error(named + ": option \"" + item + "\" has no name");
        // fsconfig() takes no string over 256 bytes.
        if (item.size() > 255) throw Error(named + ": option \"" + item + "\" is too long");
        if (eq == std::string::npos)
          fs.options.push_back({item, "", true});
        else
          fs.options.push_back({item.substr(0, eq), item.substr(eq + 1), false});
      }
      if (fs.options.size() > kMaxFsOptions)
        throw Error(named + ": more than " + std::to_string(kMaxFsOptions) + " options");
    }
    fs.attrs = (m.no_suid ? MOUNT_ATTR_NOSUID : 0) | (m.no_dev ? MOUNT_ATTR_NODEV : 0) |
               (m.no_exec ? MOUNT_ATTR_NOEXEC : 0);
    if (fs.target.rfind("dev/", 0) == 0) dev_dirs_.push_back(fs.target);
    fs_mounts_.push_back(std::move(fs));
  }
}

// The caller's masked and read-only paths and kernel parameters.
void MountPlan::render_kernel_settings() {
  for (const auto& path : spec_.masked_paths)
    masked_.push_back(sandbox_relative(path, "masked path"));
  for (const auto& path : spec_.read_only_paths)
    read_only_.push_back(sandbox_relative(path, "read-only path"));
  for (const auto& [key, value] : spec_.sysctls) {
    const std::string named = "sysctl \"" + key + "\"";
    if (key.empty()) throw Error("sysctl: an empty key");
    for (char c : key)
      if (!(c >= 'a' && c <= 'z') && !(c >= 'A' && c <= 'Z') && !(c >= '0' && c <= '9') &&
          c != '_' && c != '.' && c != '-' && c != '/')
        throw Error(named + ": a key holds only letters, digits and _ . - /");
    if (key.find("..") != std::string::npos) throw Error(named + ": a key must not contain \"..\"");
    if (key[0] == '/') throw Error(named + ": a key must not start with '/'");
    std::string path = key;
    for (char& c : path)
      if (c == '.') c = '/';
    if (path[0] == '/' || path.back() == '/' || path.find("//") != std::string::npos)
      throw Error(named + ": the key has an empty part");
    sysctls_.push_back({key, "proc/sys/" + path, value});
  }
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

namespace {

// A tree cloned from a shared mount is a peer of it: what the sandbox later
// mounts on it (its /proc, its /dev) would propagate back to the host's
// copy, and pivot_root refuses a shared new root. Every tree handed over is
// made private first; a tree that cannot be is not handed over.
UniqueFd private_tree(const std::string& path, bool recursive) {
  unsigned flags = OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | (recursive ? AT_RECURSIVE : 0);
  UniqueFd tree(::open_tree(AT_FDCWD, path.c_str(), flags));
  if (!tree) return tree;
  mount_attr attr{};
  attr.propagation = MS_PRIVATE;
  if (::mount_setattr(tree.get(), "", AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0), &attr,
                      sizeof attr) != 0)
    return UniqueFd();
  return tree;
}

}  // namespace

std::vector<UniqueFd> MountPlan::idmapped_trees(int userns_fd, const IdMap& map, uint32_t uid,
                                                uint32_t gid, bool shift) const {
  auto idmapped = [&userns_fd, shift](const std::string& path, bool recursive, unsigned extra) {
    if (!shift) return UniqueFd();
    UniqueFd tree = private_tree(path, recursive);
    if (!tree) return UniqueFd();
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | extra;
    attr.userns_fd = static_cast<uint64_t>(userns_fd);
    unsigned at = AT_EMPTY_PATH | (recursive ? AT_RECURSIVE : 0);
    if (::mount_setattr(tree.get(), "", at, &attr, sizeof attr) != 0) return UniqueFd();
    return tree;
  };
  auto plain_tree = [](const std::string& path, unsigned extra) {
    UniqueFd tree = private_tree(path, true);
    if (!tree) return UniqueFd();
    mount_attr attr{};
    attr.attr_set = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | extra;
    if (::mount_setattr(tree.get(), "", AT_EMPTY_PATH | AT_RECURSIVE, &attr, sizeof attr) != 0)
      return UniqueFd();
    return tree;
  };
  std::vector<UniqueFd> trees;
  for (const Lower& lower : lowers_) {
    UniqueFd tree = idmapped(lower.host, false, 0);
    if (!tree) {
      // A file system that takes no id mapping (an engine's overlayfs
      // root): the tree as it is, so that the child need not walk the
      // host's path to it (an engine's state directory is root's alone).
      // Its owners read as nobody inside.
      tree = private_tree(lower.host, false);
      if (tree && shift)
        log::warn("the root " + lower.host +
                  " cannot be id-mapped (its file system takes no id mapping): its files' owners "
                  "read as nobody "
                  "inside, and what only they may change cannot be changed (an engine's id map "
                  "makes them the container's: docs/oci.md, Ownership)");
    }
    trees.push_back(std::move(tree));
  }
  UniqueFd layer;
  if (!spec_.layer_dir.empty()) layer = private_tree(spec_.layer_dir, false);
  trees.push_back(std::move(layer));
  const auto sandbox_uid = map.host_uid(uid);
  const auto sandbox_gid = map.host_gid(gid);
  std::map<std::pair<uid_t, gid_t>, UniqueFd> owner_namespaces;
  for (const Bind& b : binds_) {
    struct stat st;
    const unsigned extra =
        (b.read_only ? MOUNT_ATTR_RDONLY : 0) | (b.no_exec ? MOUNT_ATTR_NOEXEC : 0);
    if (!shift || !sandbox_uid || !sandbox_gid || ::stat(b.host_source.c_str(), &st) != 0 ||
        st.st_uid == 0 || st.st_gid == 0) {
      // Not shifted: the tree as it is (owners read as nobody inside), so
      // that the child need not walk the host's path to it (an engine's
      // state directory is root's alone).
      trees.push_back(plain_tree(b.host_source, extra));
      continue;
    }
    // The owner's ids read as the sandbox user's kernel ids; nothing else maps.
    auto& owner_ns = owner_namespaces[{st.st_uid, st.st_gid}];
    if (!owner_ns)
      owner_ns =
          make_user_namespace({{st.st_uid, *sandbox_uid, 1}}, {{st.st_gid, *sandbox_gid, 1}});
    userns_fd = owner_ns.get();
    // Recursive where every submount allows it, else the top mount alone.
    UniqueFd tree = idmapped(b.host_source, true, extra);
    if (!tree) tree = idmapped(b.host_source, false, extra);
    trees.push_back(std::move(tree));
  }
  return trees;
}

}  // namespace openshell::namespaces
