#include "supervisor/container_spec.h"

#include <sys/resource.h>

#include "base/error.h"
#include "policy/policy.h"
#include "runtime/landlock.h"
#include "runtime/users.h"

namespace openshell::supervisor {

runtime::ContainerSpec container_spec_for(const SandboxSpec& spec, const std::string& sandbox_id,
                                          const std::string& sandbox_name, const Paths& paths) {
  runtime::ContainerSpec c;
  const std::string dir = paths.sandbox(sandbox_id);
  std::string root_dir = "/";
  if (spec.from == "host") {
    // The host's root read-only; the workspace is a directory of the sandbox's.
    c.fs.root = namespaces::RootKind::kHost;
    c.fs.binds.push_back({dir + "/workspace", kWorkspace, false});
  } else {
    // The image below, the sandbox's own writable layer above: it persists
    // across stop and start, /sandbox with it.
    c.fs.root = namespaces::RootKind::kDirectory;
    c.fs.rootfs = spec.from;
    c.fs.layer_dir = dir + "/layer";
    root_dir = spec.from;
  }
  c.fs.workdir = kWorkspace;

  policy::Policy policy = spec.policy.empty()
                              ? policy::default_policy()
                              : policy::parse(spec.policy, spec.policy_source.empty() ? "policy" : spec.policy_source);
  std::string user = policy.process.run_as_user.value_or(std::to_string(runtime::kDefaultUid));
  user += ":" + policy.process.run_as_group.value_or(
                    policy.process.run_as_user ? "" : std::to_string(runtime::kDefaultGid));
  if (user.back() == ':') user.pop_back();
  runtime::ResolvedUser resolved = runtime::resolve_user_in_root(user, root_dir);
  if (resolved.uid == 0 || (policy.process.run_as_group && resolved.gid == 0))
    throw Error("policy: the sandbox's process must not run as root");
  c.uid = resolved.uid;
  c.gid = resolved.gid;

  c.argv = spec.command;
  c.hostname = sandbox_name;
  c.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
           std::string("HOME=") + kWorkspace, "HOSTNAME=" + sandbox_name};
  for (const auto& entry : spec.env) {
    std::string key = entry.substr(0, entry.find('='));
    bool replaced = false;
    for (auto& existing : c.env)
      if (existing.compare(0, key.size() + 1, key + "=") == 0) existing = entry, replaced = true;
    if (!replaced) c.env.push_back(entry);
  }

  // The only way out is the sandbox's egress proxy; names resolve through its
  // DNS stub. Both listen on the sandbox's loopback.
  c.egress = true;
  c.fs.dns_stub = true;
  for (const char* var : {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"})
    c.env.push_back(std::string(var) + "=" + kProxyUrl);
  c.env.push_back("NO_PROXY=localhost,127.0.0.1");
  c.env.push_back("no_proxy=localhost,127.0.0.1");

  c.limits.cpus = spec.cpus;
  c.limits.memory_bytes = spec.memory_bytes;
  c.limits.pids = spec.pids;
  c.rlimits.push_back(runtime::Rlimit{RLIMIT_CORE, 0, 0, "core"});
  c.landlock = runtime::landlock::plan(policy, kWorkspace, runtime::landlock::abi_version());
  // The default policy names directories an image may not have.
  if (spec.policy.empty()) c.landlock.warn_missing = false;
  c.cgroup_name = "openshell-" + sandbox_id;
  return c;
}

}  // namespace openshell::supervisor
