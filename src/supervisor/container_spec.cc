#include "supervisor/container_spec.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.h"
#include "base/files.h"
#include "base/root_files.h"
#include "base/sandbox_limits.h"
#include "image/flatten.h"
#include "image/store.h"
#include "namespaces/userns.h"
#include "policy/policy.h"
#include "runtime/cleanup.h"
#include "runtime/landlock.h"
#include "runtime/private_paths.h"
#include "runtime/users.h"

namespace openshell::supervisor {

namespace {

// An image's User, unless it names root (runtime::names_root, against the
// root's own passwd: the sandbox never runs as root, such images get the
// sandbox user).
std::optional<std::string> image_user(const SandboxSpec& spec,
                                      const std::vector<std::string>& layers,
                                      const std::string& root_dir) {
  if (!spec.image || spec.image->user.empty()) return std::nullopt;
  const std::string passwd = layers.empty()
                                 ? files::read_in_root(root_dir, "etc/passwd").value_or("")
                                 : image::read_from_layers(layers, "etc/passwd");
  if (runtime::names_root(spec.image->user, passwd)) return std::nullopt;
  return spec.image->user;
}

}  // namespace

void prepare_root(const SandboxSpec& spec, const std::string& sandbox_id, const Paths& paths) {
  if (spec.storage != "copy") return;
  const std::string dir = paths.sandbox(sandbox_id);
  const std::string rootfs = dir + "/rootfs";
  const std::string ready = dir + "/rootfs.ready";
  if (files::exists(ready)) return;
  // What an interrupted copy left is made again.
  if (files::exists(rootfs)) runtime::remove_tree(rootfs);
  if (::mkdir(rootfs.c_str(), 0755) != 0) throw_errno("create " + rootfs);
  std::vector<std::string> layers;
  if (spec.image) {
    image::Store store(paths.images());
    for (const auto& d : spec.image->layers) layers.push_back(store.layer_root(d));
  } else {
    layers.push_back(spec.from);
  }
  image::flatten_layers(layers, rootfs);
  // The workspace is made at the launch, like an overlay root's, for the
  // user the sandbox runs as.
  UniqueFd marker(::open(ready.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0600));
  if (!marker) throw_errno("create " + ready);
}

runtime::ContainerSpec container_spec_for(const SandboxSpec& spec, const std::string& sandbox_id,
                                          const std::string& sandbox_name, const Paths& paths) {
  runtime::ContainerSpec c;
  const std::string dir = paths.sandbox(sandbox_id);
  std::string root_dir = "/";
  if (spec.from == "host") {
    // The host's root read-only; the workspace is a directory of the sandbox's.
    c.fs.root = namespaces::RootKind::kHost;
    c.fs.binds.push_back({dir + "/workspace", kWorkspace, false});
  } else if (spec.storage == "copy") {
    // No overlayfs here: the sandbox's own copy of its image or directory.
    c.fs.root = namespaces::RootKind::kDirectory;
    c.fs.rootfs = dir + "/rootfs";
    c.fs.plain_root = true;
    root_dir = c.fs.rootfs;
  } else if (spec.image) {
    // The image's layers below, the sandbox's own writable layer above.
    c.fs.root = namespaces::RootKind::kDirectory;
    image::Store store(paths.images());
    for (auto it = spec.image->layers.rbegin(); it != spec.image->layers.rend(); ++it)
      c.fs.layers.push_back(store.layer_root(*it));
    c.fs.layer_dir = dir + "/layer";
  } else {
    // The directory below, the sandbox's own writable layer above: it
    // persists across stop and start, /sandbox with it.
    c.fs.root = namespaces::RootKind::kDirectory;
    c.fs.rootfs = spec.from;
    c.fs.layer_dir = dir + "/layer";
    root_dir = spec.from;
  }
  c.fs.workdir =
      spec.image && !spec.image->working_dir.empty() ? spec.image->working_dir : kWorkspace;
  c.fs.home = kWorkspace;  // HOME, made for the sandbox's user when missing
  c.fs.hidden = runtime::openshell_private_paths({paths});

  policy::Policy policy =
      spec.policy.empty()
          ? policy::default_policy()
          : policy::parse(spec.policy, spec.policy_source.empty() ? "policy" : spec.policy_source);
  // A policy without a filesystem section keeps the default one: leaving a
  // section out never lifts a confinement.
  const policy::Policy defaults = policy::default_policy();
  if (!policy.has_filesystem_policy) {
    policy.filesystem = defaults.filesystem;
    policy.has_filesystem_policy = true;
  }
  // The policy's user, else the image's, else the sandbox user.
  std::string user;
  if (policy.process.run_as_user) {
    user = *policy.process.run_as_user;
    if (policy.process.run_as_group) user += ":" + *policy.process.run_as_group;
  } else if (auto from_image = image_user(spec, c.fs.layers, root_dir)) {
    user = *from_image;
    // The policy's group, when it names one, wins over the image's.
    if (policy.process.run_as_group)
      user = user.substr(0, user.find(':')) + ":" + *policy.process.run_as_group;
  } else {
    user = std::to_string(runtime::kDefaultUid) + ":" +
           policy.process.run_as_group.value_or(std::to_string(runtime::kDefaultGid));
  }
  runtime::ResolvedUser resolved =
      c.fs.layers.empty()
          ? runtime::resolve_user_in_root(user, root_dir)
          : runtime::resolve_user(user, image::read_from_layers(c.fs.layers, "etc/passwd"),
                                  image::read_from_layers(c.fs.layers, "etc/group"),
                                  spec.image->name);
  if (resolved.uid == 0 || (policy.process.run_as_group && resolved.gid == 0))
    throw Error("policy: the sandbox's process must not run as root");
  c.uid = resolved.uid;
  c.gid = resolved.gid;

  c.argv = spec.command;
  c.hostname = sandbox_name;
  // The only way out is the sandbox's egress proxy; names resolve through its
  // DNS stub. Both listen on the sandbox's loopback. The proxy variables come
  // first, so that -e may change them (the network namespace has no other
  // way out whatever they say).
  c.egress = true;
  c.fs.dns_stub = true;
  c.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           std::string("HOME=") + kWorkspace, "HOSTNAME=" + sandbox_name};
  for (const char* var :
       {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"})
    c.env.push_back(std::string(var) + "=" + kProxyUrl);
  c.env.push_back("NO_PROXY=localhost,127.0.0.1");
  c.env.push_back("no_proxy=localhost,127.0.0.1");
  for (const auto& entry : spec.env) {
    std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (auto& existing : c.env)
      if (existing.compare(0, key.size() + 1, key + "=") == 0) existing = entry, replaced = true;
    if (!replaced) c.env.push_back(entry);
  }

  c.limits.cpus = spec.cpus;
  c.limits.memory_bytes = spec.memory_bytes;
  // Sandboxes created before the defaults existed get them at launch.
  SandboxSpec limited = spec;
  limits::apply_defaults(&limited, limits::Defaults{}, limits::memory_total());
  if (*limited.pids > 0) c.limits.pids = limited.pids;
  c.fs.tmp_size = *limited.tmp_size_bytes;
  if (spec.host_uid_start && spec.host_gid_start)
    c.host_range = namespaces::HostRange{*spec.host_uid_start, *spec.host_gid_start};
  c.fs.shm_size = *limited.shm_size_bytes;
  c.rlimits.push_back(runtime::Rlimit{RLIMIT_CORE, 0, 0, "core"});
  c.landlock = runtime::landlock::plan(policy, c.fs.workdir, runtime::landlock::abi_version());
  // The default filesystem policy names directories an image may not have.
  if (policy.filesystem == defaults.filesystem) c.landlock.warn_missing = false;
  c.cgroup_name = "openshell-" + sandbox_id;
  return c;
}

}  // namespace openshell::supervisor
