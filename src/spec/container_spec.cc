#include "spec/container_spec.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <string>
#include <utility>

#include "base/ca_bundles.h"
#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/root_files.h"
#include "base/sandbox_limits.h"
#include "base/unique_fd.h"
#include "image/flatten.h"
#include "image/store.h"
#include "runtime/cleanup.h"
#include "runtime/gpu.h"
#include "runtime/landlock.h"
#include "runtime/private_paths.h"
#include "runtime/users.h"
#include "spec/ca_certs.h"

namespace openshell::spec {

namespace {

// The bundle in the sandbox's directory.
constexpr const char* kCaBundleFile = "ca-certificates.crt";

// The root's /etc/passwd and /etc/group: of the image's layers (the topmost
// that has each), else of the root directory.
struct RootFiles {
  std::vector<std::string> layers;  // top first
  std::string root_dir;

  std::string passwd() const {
    return layers.empty() ? files::read_in_root(root_dir, "etc/passwd").value_or("")
                          : image::read_from_layers(layers, "etc/passwd");
  }
  runtime::ResolvedUser resolve(const std::string& user, const std::string& where) const {
    return layers.empty()
               ? runtime::resolve_user_in_root(user, root_dir)
               : runtime::resolve_user(user, image::read_from_layers(layers, "etc/passwd"),
                                       image::read_from_layers(layers, "etc/group"), where);
  }
};

// Where a sandbox's users are read from: its image's layers or its
// directory (a root that is a copy of them, storage "copy", too: the same
// names whatever the storage, and known before the copy is made).
RootFiles root_files(const SandboxSpec& spec, const Placement& where) {
  if (spec.from == "host") return {{}, "/"};
  if (!spec.image) return {{}, spec.from};
  RootFiles root;
  image::Store store(where.images_dir);
  for (auto it = spec.image->layers.rbegin(); it != spec.image->layers.rend(); ++it)
    root.layers.push_back(store.layer_root(*it));
  return root;
}

// The one rule for who a sandbox's processes run as, its main process and
// every exec'd one. The caller's choice (run --user, create --user, exec
// --user), else the policy's, else the image's unless it names root, else
// the default 1000; the policy's group, when it names one, replaces the
// group. Root in the sandbox (uid or gid 0 in its own files) only where the
// policy has process.allow_root, or as `openshell run`'s caller's choice:
// an image's root User is passed over (runtime::names_root), a caller's or
// a policy's is an Error naming the field.
runtime::ResolvedUser choose_user(const SandboxSpec& spec, const Placement& where,
                                  const policy::Policy& policy, const RootFiles& root,
                                  const std::string& asked) {
  const auto& process = policy.process;
  const std::string source = spec.policy_source.empty() ? "policy" : spec.policy_source;
  const std::string image_name = spec.image ? spec.image->name : std::string();
  if (!asked.empty()) {
    runtime::ResolvedUser resolved = root.resolve(asked, image_name);
    if ((resolved.uid == 0 || resolved.gid == 0) && !process.allow_root && !where.one_shot)
      throw Error("--user " + asked + ": root in the sandbox needs process.allow_root = true in " +
                  (spec.policy.empty() ? std::string("its policy (it has the default one)")
                                       : "its policy (" + source + ")"));
    return resolved;
  }
  std::string user;
  if (process.run_as_user) {
    user = *process.run_as_user;
    if (process.run_as_group) user += ":" + *process.run_as_group;
  } else if (spec.image && !spec.image->user.empty() &&
             !runtime::names_root(spec.image->user, root.passwd())) {
    user = spec.image->user;
    if (process.run_as_group) user = user.substr(0, user.find(':')) + ":" + *process.run_as_group;
  } else {
    user = std::to_string(runtime::kDefaultUid) + ":" +
           process.run_as_group.value_or(std::to_string(runtime::kDefaultGid));
  }
  runtime::ResolvedUser resolved = root.resolve(user, image_name);
  // Only the policy's user can be root here: the image's never is, the
  // default is 1000.
  if (resolved.uid == 0 && !process.allow_root)
    throw Error(source + ": process.run_as_user: " + process.run_as_user.value_or(user) +
                " is root in the sandbox's /etc/passwd (process.allow_root = true allows it)");
  if (process.run_as_group && resolved.gid == 0 && !process.allow_root)
    throw Error(source + ": process.run_as_group: " + *process.run_as_group +
                " is root's group in the sandbox's /etc/group (process.allow_root = true " +
                "allows it)");
  return resolved;
}

// The caller's choice: run's --user, else create's.
const std::string& caller_user(const SandboxSpec& spec, const Placement& where) {
  return where.one_shot && !where.one_shot->user.empty() ? where.one_shot->user : spec.user;
}

}  // namespace

Placement sandbox_placement(const std::string& sandbox_id, const std::string& sandbox_name,
                            const Paths& paths) {
  Placement where;
  where.hostname = sandbox_name;
  where.cgroup_name = "openshell-" + sandbox_id;
  where.images_dir = paths.images();
  where.hidden = runtime::openshell_private_paths({paths});
  where.sandbox_dir = paths.sandbox(sandbox_id);
  return where;
}

policy::Policy effective_policy(const SandboxSpec& spec, const Placement& where) {
  // A one-shot sandbox's root is read-only or thrown away: no Landlock rule
  // unless its policy asks for one (/proc is read-only instead, see
  // container_spec_for).
  if (spec.policy.empty()) return where.one_shot ? policy::Policy{} : policy::default_policy();
  policy::Policy policy =
      policy::parse(spec.policy, spec.policy_source.empty() ? "policy" : spec.policy_source);
  // A gateway's sandbox whose policy leaves its filesystem section out keeps
  // the default one: leaving a section out never lifts a confinement.
  if (!policy.has_filesystem_policy && !where.one_shot) {
    policy.filesystem = policy::default_policy().filesystem;
    policy.has_filesystem_policy = true;
  }
  return policy;
}

void resolve_image(SandboxSpec* spec, const image::ImageRecord& record) {
  const image::ImageConfig& config = record.config;
  spec->image = SandboxImage{record.name,     record.id(), record.manifest_digest,
                             record.diff_ids, config.user, config.working_dir};
  std::vector<std::string> command = config.entrypoint;
  const auto& rest = spec->command.empty() ? config.cmd : spec->command;
  command.insert(command.end(), rest.begin(), rest.end());
  spec->command = std::move(command);
  spec->env = merge_env(merge_env({}, config.env), spec->env);
}

std::vector<std::string> merge_env(std::vector<std::string> base,
                                   const std::vector<std::string>& entries) {
  for (const auto& entry : entries) {
    const size_t eq = entry.find('=');
    if (eq == std::string::npos || eq == 0) continue;
    bool replaced = false;
    for (auto& existing : base)
      if (existing.compare(0, eq + 1, entry, 0, eq + 1) == 0) {
        existing = entry;
        replaced = true;
        break;
      }
    if (!replaced) base.push_back(entry);
  }
  return base;
}

std::vector<std::string> proxy_env() {
  std::vector<std::string> env;
  for (const char* var :
       {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"})
    env.push_back(std::string(var) + "=" + kProxyUrl);
  // The sandbox's processes reach each other directly.
  env.push_back("NO_PROXY=localhost,127.0.0.1");
  env.push_back("no_proxy=localhost,127.0.0.1");
  return env;
}

namespace {

// Where a sandbox's CA bundle goes: over each system bundle its root has
// (one holding something), else at kCaBundle when --ca-cert asks for it.
std::vector<std::string> ca_bundle_targets(const SandboxSpec& spec, const Placement& where) {
  const RootFiles root = root_files(spec, where);
  std::vector<std::string> targets;
  for (const char* path : kCaBundlePaths) {
    const std::string relative = std::string(path).substr(1);
    bool present = false;
    try {
      present = root.layers.empty() ? files::read_in_root(root.root_dir, relative).has_value()
                                    : !image::read_from_layers(root.layers, relative).empty();
    } catch (const Error&) {
      // Not a regular file (a directory, a loop of links): no bundle to replace.
    }
    if (present) targets.push_back(path);
  }
  if (targets.empty() && !spec.ca_certs.empty()) targets.push_back(kCaBundle);
  return targets;
}

}  // namespace

runtime::ContainerSpec container_spec_for(const SandboxSpec& spec, const Placement& where) {
  runtime::ContainerSpec c;
  const OneShot* one_shot = where.one_shot ? &*where.one_shot : nullptr;
  const std::string& dir = where.sandbox_dir;
  if (!one_shot && dir.empty()) throw Error("sandbox spec: a sandbox without its directory");

  // The root, and the writable layer above it: the sandbox's own (kept
  // across stop and start, /sandbox with it), or a throw-away one.
  if (spec.from == "host") {
    // The host's root, read-only; a gateway's sandbox's workspace is a
    // directory of its own.
    c.fs.root = namespaces::RootKind::kHost;
    if (!one_shot) c.fs.binds.push_back({dir + "/workspace", kWorkspace, false});
    if (one_shot && one_shot->read_only)
      log::debug("--read-only: the host root is always read-only");
  } else if (!one_shot && spec.storage == "copy") {
    // No overlayfs here: the sandbox's own copy of its image or directory.
    c.fs.root = namespaces::RootKind::kDirectory;
    c.fs.rootfs = dir + "/rootfs";
    c.fs.plain_root = true;
  } else if (spec.image) {
    c.fs.root = namespaces::RootKind::kDirectory;
    image::Store store(where.images_dir);
    for (auto it = spec.image->layers.rbegin(); it != spec.image->layers.rend(); ++it)
      c.fs.layers.push_back(store.layer_root(*it));
    if (!one_shot) c.fs.layer_dir = dir + "/layer";
  } else {
    c.fs.root = namespaces::RootKind::kDirectory;
    c.fs.rootfs = spec.from;
    if (!one_shot) c.fs.layer_dir = dir + "/layer";
  }
  if (one_shot && spec.from != "host") c.fs.read_only = one_shot->read_only;
  if (one_shot) c.fs.binds.insert(c.fs.binds.end(), one_shot->binds.begin(), one_shot->binds.end());
  // The CA bundle that write_ca_bundle wrote, over each of the root's own:
  // a bind in the sandbox's mount namespace, which leaves the root's files
  // (a directory of the user's, the host's) as they are.
  const std::string& ca_dir = one_shot ? one_shot->ca_dir : dir;
  const std::vector<std::string> bundles =
      ca_dir.empty() || spec.vm ? std::vector<std::string>{} : ca_bundle_targets(spec, where);
  for (const auto& bundle : bundles)
    c.fs.binds.push_back({ca_dir + "/" + kCaBundleFile, bundle, true});
  // A gateway's sandbox's own (create --bind), mounted as run's are: as
  // root, idmapped to the sandbox user (namespaces::MountPlan).
  for (const auto& b : spec.binds) c.fs.binds.push_back({b.source, b.target, b.read_only});
  c.fs.hidden = where.hidden;
  const std::string image_workdir = spec.image ? spec.image->working_dir : std::string();
  c.fs.workdir = one_shot && !one_shot->workdir.empty() ? one_shot->workdir
                 : !image_workdir.empty()               ? image_workdir
                 : one_shot                             ? "/"
                                                        : kWorkspace;
  if (!one_shot) c.fs.home = kWorkspace;  // made for the sandbox's user when missing

  const policy::Policy policy = effective_policy(spec, where);
  const runtime::ResolvedUser user =
      choose_user(spec, where, policy, root_files(spec, where), caller_user(spec, where));
  c.uid = user.uid;
  c.gid = user.gid;
  c.argv = spec.command;
  c.hostname = where.hostname;
  c.tty = one_shot ? one_shot->tty : spec.tty;
  // A gateway's sandbox with a terminal and no command is a login shell:
  // its user's, unless that one refuses logins.
  if (!one_shot && c.tty && c.argv.empty()) {
    const bool refuses =
        user.shell.empty() || user.shell.ends_with("/nologin") || user.shell.ends_with("/false");
    c.argv = {refuses ? "/bin/sh" : user.shell, "-l"};
  }

  // The only way out is the sandbox's egress proxy; names resolve through
  // its DNS stub. Both listen on the sandbox's loopback.
  c.egress = !one_shot || !policy.network.empty();
  c.fs.dns_stub = c.egress;
  c.fs.hosts_name = where.hostname;
  // Without a filesystem policy no Landlock rule covers /proc, where a
  // process could write another's memory (/proc/PID/mem: ptrace is refused,
  // that file is not) and so act as a binary the network policy names.
  c.fs.proc_read_only = !policy.has_filesystem_policy;

  // The environment: a clean one, never the caller's. The proxy variables
  // come before the spec's, so that -e may change them (the network
  // namespace has no other way out whatever they say).
  c.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           "HOME=" + (one_shot ? user.home : std::string(kWorkspace)),
           "HOSTNAME=" + where.hostname};
  if (c.tty)
    c.env.push_back("TERM=" + (!one_shot || one_shot->term.empty() ? "xterm" : one_shot->term));
  if (c.egress) c.env = merge_env(std::move(c.env), proxy_env());
  if (!bundles.empty()) c.env = merge_env(std::move(c.env), ca_bundle_env(bundles.front()));
  // GPUs, found on this host at every launch (a driver update moves its
  // files): nodes in /dev, the driver's files read-only, the spec's
  // environment (under the caller's -e), hooks, and the nodes' groups.
  std::optional<runtime::gpu::Plan> gpus;
  if (auto request = runtime::gpu::parse_request(spec.gpu)) {
    gpus = runtime::gpu::plan(*request, runtime::gpu::Host::from_environment());
    for (const auto& node : gpus->nodes) c.fs.devices.push_back({node.host_path, node.path, false});
    c.fs.binds.insert(c.fs.binds.end(), gpus->mounts.begin(), gpus->mounts.end());
    c.env = merge_env(std::move(c.env), gpus->env);
    c.hooks = gpus->hooks;
    c.host_groups = gpus->groups;
  }
  c.env = merge_env(std::move(c.env), spec.env);

  // Limits; a sandbox made before the defaults existed gets them here.
  SandboxSpec limited = spec;
  limited.apply_limit_defaults(limits::Defaults{}, limits::memory_total());
  c.limits.cpus = spec.cpus;
  c.limits.memory_bytes = spec.memory_bytes;
  if (*limited.pids > 0) c.limits.pids = limited.pids;
  if (gpus) {
    // The cgroup's device list: what every sandbox's /dev has, and these.
    c.limits.devices = runtime::default_device_rules();
    for (const auto& node : gpus->nodes)
      c.limits.devices->push_back({node.type, node.major, node.minor, node.access});
  }
  c.fs.tmp_size = *limited.tmp_size_bytes;
  c.fs.shm_size = *limited.shm_size_bytes;
  if (spec.host_uid_start && spec.host_gid_start)
    c.host_range = namespaces::HostRange{*spec.host_uid_start, *spec.host_gid_start};
  // No core dumps unless a core limit is given.
  bool core_given = false;
  if (one_shot)
    for (const auto& r : one_shot->rlimits) {
      c.rlimits.push_back(r);
      core_given = core_given || r.resource == RLIMIT_CORE;
    }
  if (!core_given) c.rlimits.insert(c.rlimits.begin(), runtime::Rlimit{RLIMIT_CORE, 0, 0, "core"});

  // Privilege and confinement.
  if (one_shot) {
    c.cap_add = one_shot->cap_add;
    c.seccomp = one_shot->seccomp;
  }
  // exec --user: a gateway's sandbox's init starts processes as its other ids.
  c.exec_as_others = !one_shot;
  // What the caller bound in (create --bind) is reachable as it was bound,
  // whatever the filesystem policy lists.
  policy::Policy confined = policy;
  if (confined.has_filesystem_policy)
    for (const auto& b : spec.binds)
      (b.read_only ? confined.filesystem.read_only : confined.filesystem.read_write)
          .push_back(b.target);
  // So are the GPUs' nodes (read, write and their ioctls) and files.
  if (confined.has_filesystem_policy && gpus) {
    for (const auto& node : gpus->nodes) confined.filesystem.read_write.push_back(node.path);
    for (const auto& m : gpus->mounts)
      (m.read_only ? confined.filesystem.read_only : confined.filesystem.read_write)
          .push_back(m.target);
  }
  c.landlock = runtime::landlock::plan(confined, c.fs.workdir, runtime::landlock::abi_version());
  // The default filesystem policy names directories an image may not have.
  if (policy.filesystem == policy::default_policy().filesystem) c.landlock.warn_missing = false;
  c.landlock_policy.has_filesystem_policy = confined.has_filesystem_policy;
  c.landlock_policy.filesystem = confined.filesystem;
  c.landlock_policy.landlock = confined.landlock;
  c.cgroup_name = where.cgroup_name;
  return c;
}

runtime::ResolvedUser exec_user(const SandboxSpec& spec, const Placement& where,
                                const std::string& user) {
  return choose_user(spec, where, effective_policy(spec, where), root_files(spec, where),
                     user.empty() ? caller_user(spec, where) : user);
}

namespace {

// The host's roots: what the proxy trusts upstream is what the sandbox
// trusts where it goes uninspected, whatever its image carries.
// The host's bundle, read again only when its file changed (another file,
// size or time): a gateway writes it into every launch's bundle, and read
// it afresh at each (220 KB on Debian).
std::string host_ca_bundle() {
  const std::string path = ca_bundles::host_path();
  if (path.empty()) return "";
  static std::mutex mutex;
  static std::string cached_path, cached_text;
  static struct stat cached_stat {};
  struct stat now {};
  std::lock_guard<std::mutex> lock(mutex);
  const bool same = ::stat(path.c_str(), &now) == 0 && path == cached_path &&
                    now.st_dev == cached_stat.st_dev && now.st_ino == cached_stat.st_ino &&
                    now.st_size == cached_stat.st_size &&
                    now.st_mtim.tv_sec == cached_stat.st_mtim.tv_sec &&
                    now.st_mtim.tv_nsec == cached_stat.st_mtim.tv_nsec &&
                    now.st_ctim.tv_sec == cached_stat.st_ctim.tv_sec &&
                    now.st_ctim.tv_nsec == cached_stat.st_ctim.tv_nsec;
  if (same) return cached_text;
  std::string text;
  if (int err = files::read_into(path, &text)) throw_errno("read " + path, err);
  cached_path = path;
  cached_text = text;
  cached_stat = now;
  return text;
}

}  // namespace

// Written afresh at every launch: the sandbox's CA is new at each, and the
// host's bundle may be what changed.
void write_ca_bundle(const SandboxSpec& spec, const std::string& dir,
                     const std::string& sandbox_ca) {
  if (spec.vm || (sandbox_ca.empty() && spec.ca_certs.empty())) return;
  const std::string file = dir + "/" + kCaBundleFile;
  // Not synced (milliseconds at every start): a bundle a crash loses is
  // made again at the next start, as is every one.
  files::replace(file, ca_bundle(host_ca_bundle(), spec.ca_certs, sandbox_ca), 0644);
  // As root, the sandbox's own range owns it: a bind of a file that host
  // root owns is not idmapped into the sandbox, and its source directory is
  // not one the sandbox's ids may search.
  if (::geteuid() == 0 && spec.host_uid_start && spec.host_gid_start &&
      ::chown(file.c_str(), *spec.host_uid_start, *spec.host_gid_start) != 0)
    throw_errno("chown " + file);
}

bool inspects_traffic(const policy::Policy& policy) {
  for (const auto& network : policy.network)
    for (const auto& endpoint : network.endpoints)
      if (!endpoint.protocol.empty() && endpoint.tls != "skip") return true;
  return false;
}

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

}  // namespace openshell::spec
