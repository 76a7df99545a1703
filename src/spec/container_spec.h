// From a sandbox's spec to the runtime's container spec: the one place that
// decides a sandbox's root, user, environment, limits and confinement, for a
// gateway's sandbox (its supervisor calls it) and for `openshell run` alike.
//
// The two kinds differ where their lives differ, and only there:
//  - a gateway's sandbox has a directory of its own (sandboxes/<id>) that
//    keeps its writable layer and its workspace, /sandbox, across stops and
//    starts; the workspace is HOME and the default working directory. A
//    one-shot sandbox's writable layer is thrown away; HOME is the user's
//    home in the root's /etc/passwd, the working directory "/".
//  - a gateway's sandbox may have its network policy changed while it runs,
//    so it always has its egress proxy; a one-shot sandbox has one only when
//    its policy has network policies, and no network at all otherwise.
//  - a gateway's sandbox without a filesystem policy gets the default one
//    (policy::default_policy); a one-shot sandbox gets no Landlock rule
//    (its root is read-only or thrown away) and a read-only /proc instead.
//  - only a one-shot sandbox takes the caller's privileges and mounts
//    (OneShot below): --user root, capabilities, no seccomp, bind mounts.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/paths.h"
#include "policy/policy.h"
#include "runtime/spec.h"
#include "runtime/users.h"
#include "spec/sandbox_spec.h"

namespace openshell::image {
struct ImageRecord;
}

namespace openshell::spec {

inline constexpr const char* kWorkspace = "/sandbox";
inline constexpr const char* kProxyUrl = "http://127.0.0.1:3128";

// What only a one-shot sandbox (openshell run) is given: options of the
// caller's that a gateway's sandbox never takes.
struct OneShot {
  bool read_only = false;                   // the root itself (not for the host's: always)
  std::vector<namespaces::BindSpec> binds;  // host paths, mounted after the root
  std::string workdir;                      // absolute; "": the image's, else "/"
  // UID[:GID] or NAME[:GROUP]: wins over the policy's and the image's, and
  // may be root; "": chosen as for any sandbox.
  std::string user;
  bool tty = false;
  std::string term;  // TERM with a tty
  std::vector<runtime::Rlimit> rlimits;
  runtime::caps::Set cap_add = 0;
  bool seccomp = true;
  // A directory of the run's own, outside its root, where write_ca_bundle
  // puts its CA bundle (its CA's, --ca-cert's); "": it has none. The bundle
  // is mounted over the root's from there, as a gateway's sandbox's is from
  // its directory.
  std::string ca_dir;
};

// Where a sandbox runs, as its owner knows it.
struct Placement {
  std::string hostname = "sandbox";  // also HOSTNAME
  std::string cgroup_name;
  std::string images_dir;           // the image store (see image/store.h), for spec.image
  std::vector<std::string> hidden;  // runtime::openshell_private_paths
  // A gateway's sandbox: its own directory (sandboxes/<id>), which keeps its
  // writable layer (or the copy of its root) and its workspace.
  std::string sandbox_dir;
  std::optional<OneShot> one_shot;  // set: `openshell run`'s sandbox, without a sandbox_dir
};

// A gateway's sandbox, named as its launch file names it.
Placement sandbox_placement(const std::string& sandbox_id, const std::string& sandbox_name,
                            const Paths& paths);

// The container spec. Throws Error (a bad policy, an unknown user, a
// policy's user that is root...).
runtime::ContainerSpec container_spec_for(const SandboxSpec& spec, const Placement& where);

// Who a process exec'd in a gateway's sandbox runs as: `user` (UID[:GID] or
// NAME[:GROUP] in the sandbox's image or directory; "": the sandbox's own),
// by the rule the main process's user follows (root only with the policy's
// process.allow_root). Throws Error naming --user and the policy field.
runtime::ResolvedUser exec_user(const SandboxSpec& spec, const Placement& where,
                                const std::string& user);

// The policy the sandbox runs under: its own, else the default; the
// filesystem part as the header says. Throws Error naming the policy's
// source.
policy::Policy effective_policy(const SandboxSpec& spec, const Placement& where);

// An image's part of a sandbox spec, when the sandbox is made from it:
// spec->image, the main process (the image's entrypoint, then the caller's
// command or else the image's cmd, as Docker does) and the environment (the
// image's, then the caller's on top).
void resolve_image(SandboxSpec* spec, const image::ImageRecord& record);

// `entries` over `base`, in order: each KEY=VALUE replaces base's entry of
// that KEY in place, or is appended. An entry without '=' or without a key
// is skipped (callers validate what users give; an image's is untrusted).
std::vector<std::string> merge_env(std::vector<std::string> base,
                                   const std::vector<std::string>& entries);

// The environment that points a sandbox's programs at its egress proxy.
std::vector<std::string> proxy_env();

// What a gateway's sandbox needs in its directory before each launch, its
// CA bundle aside (write_ca_bundle, by the gateway as it launches): with
// storage "copy", its root as a copy of its image (or directory) before its
// first start: sandboxes/<id>/rootfs, kept across stops and starts like a
// writable layer (made once). Throws Error.
void prepare_root(const SandboxSpec& spec, const std::string& sandbox_id, const Paths& paths);

// A sandbox's CA bundle (spec/ca_certs.h), written afresh into `dir` (a
// gateway's sandbox's directory, or a one-shot sandbox's OneShot::ca_dir):
// the host's roots, sandbox_ca (the PEM of the CA made for this start) and
// spec.ca_certs. None for a micro-VM, nor without a CA or ca_certs. As
// root, it is owned by spec.host_uid_start and host_gid_start when set.
// Throws Error.
void write_ca_bundle(const SandboxSpec& spec, const std::string& dir,
                     const std::string& sandbox_ca);

// Whether a policy has an endpoint its egress proxy inspects (`protocol`
// set, and `tls` not "skip"): only then does the sandbox need a CA of its
// own.
bool inspects_traffic(const policy::Policy& policy);

}  // namespace openshell::spec
