// What to run and how to confine it: everything the runtime needs to start a
// container, as plain data. The command line (openshell run) and the
// supervisor fill it; the runtime knows nothing of either.
#pragma once

#include <sys/resource.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "namespaces/mounts.h"
#include "policy/policy.h"
#include "runtime/caps.h"
#include "runtime/cgroup.h"
#include "runtime/hooks.h"
#include "runtime/landlock.h"
#include "runtime/seccomp.h"

namespace openshell::runtime {

struct Rlimit {
  int resource;  // RLIMIT_*
  rlim_t soft;
  rlim_t hard;
  const char* name = "";  // "nofile", for messages
};

inline constexpr uint32_t kDefaultUid = 1000;
inline constexpr uint32_t kDefaultGid = 1000;

struct ContainerSpec {
  namespaces::FilesystemSpec fs;
  std::vector<std::string> argv;  // the main process
  std::vector<std::string> env;   // "KEY=VALUE", exactly the main process's environment
  std::string hostname = "sandbox";
  // As root: the sandbox's own host id range (namespaces/id_pool.h); none:
  // root's subordinate range, shared (sandboxes made before ranges were
  // per sandbox keep it, their files are its).
  std::optional<namespaces::HostRange> host_range;
  // Root of a nested user namespace only (rootless Podman's runtime): the
  // map an engine gives (an OCI config's linux.uidMappings), in that
  // namespace's ids, written as it is instead of the planned one.
  std::optional<namespaces::IdMap> id_map;
  uint32_t uid = kDefaultUid;  // inside the sandbox
  uint32_t gid = kDefaultGid;
  std::vector<uint32_t> supplementary_gids;
  // Host groups the sandbox's user holds besides (the groups of the device
  // nodes it is given, --gpu): as root each is mapped into the sandbox at
  // its own number and set as a supplementary group; rootless, the
  // caller's own supplementary groups are kept (no setgroups), as crun's
  // keep-groups does, for a user namespace can hold no other host group.
  std::vector<uint32_t> host_groups;
  // OCI hooks (a CDI spec's), run on the host at their moments
  // (runtime/hooks.h); their failure before the start stops it.
  std::vector<Hook> hooks;
  // The hooks' state names this id and bundle (an OCI container's); by
  // default the cgroup's name and a bundle directory made for them.
  std::string hook_id;
  std::string hook_bundle;
  bool tty = false;              // a pseudo-terminal from the sandbox's own devpts
  unsigned short tty_rows = 24;  // its size from the start
  unsigned short tty_cols = 80;
  Limits limits;
  std::vector<Rlimit> rlimits;  // core dumps are off unless a core limit is given here
  caps::Set cap_add = 0;
  bool seccomp = true;
  // A program of the caller's (an OCI config's linux.seccomp), installed
  // beside the default profile when it has a length: the kernel applies
  // the stricter answer of the two to each call, so a profile can narrow
  // the sandbox but never widen it. It must outlive start().
  seccomp::Program seccomp_program;
  // The init may start exec'd processes as other ids of the sandbox (exec
  // --user): it keeps CAP_SETUID and CAP_SETGID for itself, out of the
  // bounding set, and drops them in each child before its exec, so that
  // every process it starts has exactly cap_add, as the main process has.
  bool exec_as_others = false;
  // Egress through the owner: the sandbox gets a proxy listener and a DNS
  // stub socket on its loopback, served by whoever started it
  // (Container::egress_sockets); fs.dns_stub makes resolv.conf point there.
  bool egress = false;
  landlock::Plan landlock;
  // What landlock was planned from: the effective policy's filesystem part
  // and compatibility, nothing else (a --vm guest plans it again for its
  // own kernel's ABI).
  policy::Policy landlock_policy;
  std::string cgroup_name;  // default: openshell-<pid>
  // Absolute instead ("/default/abc"): this path in every hierarchy that
  // holds a controller, made whether or not a limit is set (an OCI
  // config's cgroupsPath, where engines read the container's statistics).
  std::string cgroup_path;
  // Namespaces joined instead of made (an OCI config's paths): the net,
  // IPC and UTS namespaces at these paths ("" makes a new one). Joining
  // takes privilege over the namespace: root's, for one an engine made.
  std::string join_net;
  std::string join_ipc;
  std::string join_uts;
  // The kernel's OOM score of the sandbox's processes (-1000..1000).
  std::optional<int> oom_score_adj;
  // The init becomes a sibling of the caller (CLONE_PARENT), a child of the
  // caller's parent, and is not killed when that parent ends: `oci create`,
  // whose engine reaps the container's init as its own child. Container::
  // wait() then learns the end from the pidfd, but no status.
  bool orphan = false;
  // The init's program: a sealed image of the small init (runtime/
  // init_image.h), which the caller keeps open, else -1 for this binary.
  // One image serves any number of sandboxes: their inits share its pages.
  int init_image_fd = -1;
  // The main process's stdio (the caller's by default).
  int stdin_fd = 0;
  int stdout_fd = 1;
  int stderr_fd = 2;
};

}  // namespace openshell::runtime
