// The mount plan, parent side: a FilesystemSpec validated and rendered into
// strings (no decisions left for the child), and the idmapped trees the
// child attaches.
#include "namespaces/mounts.h"

#include <sys/mount.h>
#include <sys/stat.h>

#include <map>

#include "base/error.h"
#include "base/files.h"
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
                      b.read_only, files::is_directory(source)});
  }
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
  if (spec_.root == RootKind::kDirectory && !spec_.plain_root) {
    for (const char* dir : {"proc", "dev", "sys", "tmp"})
      mount_points_.push_back({dir, true, false});
    for (const Bind& b : binds_) mount_points_.push_back({b.target, b.directory, false});
    if (spec_.dns_stub) mount_points_.push_back({"etc/resolv.conf", false, false});
    if (!hosts_.empty()) mount_points_.push_back({"etc/hosts", false, false});
    if (!workdir_.empty()) mount_points_.push_back({workdir_, true, true});
    if (!home_.empty()) mount_points_.push_back({home_, true, true});
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

}  // namespace openshell::namespaces
