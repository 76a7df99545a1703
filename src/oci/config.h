// An OCI bundle's config.json (runtime-spec 1.0 to 1.2) read into what the
// runtime starts: the same runtime::ContainerSpec that `openshell run` fills,
// so there is no second runtime. Everything the spec asks for that the
// runtime cannot do is refused, one line naming the field; where the spec
// leaves room, the sandbox's own hardening stays (a user namespace always,
// no_new_privs always, a private mount, pid and cgroup namespace always).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "oci/seccomp_json.h"
#include "policy/policy.h"
#include "runtime/hooks.h"
#include "runtime/init_protocol.h"
#include "runtime/spec.h"

namespace openshell::oci {

// The annotation naming a policy file (as `openshell run --policy` takes)
// whose filesystem part (Landlock) and network part (the egress proxy, in
// the monitor) apply (docs/oci.md).
inline constexpr const char* kPolicyAnnotation = "org.openshell.policy";

struct Bundle {
  std::string dir;  // absolute
  nlohmann::json config;
  std::string oci_version;
  std::map<std::string, std::string> annotations;
  // The init's start, with no main process (that comes with `start`).
  runtime::ContainerSpec spec;
  // The main process, as the init is asked to start it.
  runtime::ExecRequest process;
  bool terminal = false;
  // The compiled profile spec.seccomp_program points into (kept here, so
  // the Bundle must not be copied once read: it is handed out by pointer).
  SeccompFilter seccomp;
  // Run by the OCI commands themselves at their moments: startContainer by
  // the monitor in the container's namespaces before the main process,
  // poststart after it started, poststop by delete.
  std::vector<runtime::Hook> start_container;
  std::vector<runtime::Hook> poststart;
  std::vector<runtime::Hook> poststop;
  std::string policy_file;               // kPolicyAnnotation's value, "" none
  std::optional<policy::Policy> policy;  // read from policy_file
};

// Where the runtime runs, which decides what a config may ask for.
struct Context {
  // Root of a user namespace that is not the initial one: the runtime
  // under rootless Podman, in Podman's own namespace, whose every id is
  // the invoking user's already. A config's linux.uidMappings and
  // gidMappings (in that namespace's ids) are taken then; root of the host
  // and an ordinary user map the container's ids themselves.
  bool nested_root = false;
  // Root of the host: takes the engine's maps too, in host ids (never one
  // that maps host id 0 in).
  bool host_root = false;
  // Whether linux.seccomp is compiled into a filter. Not where nothing
  // starts from the read (delete's poststop hooks, exec's environment):
  // the compile is most of a read's time.
  bool compile_seccomp = true;
};
Context current_context();

// What a read of the bundle is for.
enum class ReadFor { kStart, kInspect };

// Reads dir/config.json. Throws Error: "config.json: FIELD: why".
// kInspect leaves the seccomp filter uncompiled (the profile still checked
// as JSON is not).
std::unique_ptr<Bundle> read_bundle(const std::string& dir, ReadFor purpose = ReadFor::kStart);

// The same from a parsed config (tests); dir is where relative paths start.
std::unique_ptr<Bundle> bundle_from_json(const nlohmann::json& config, const std::string& dir,
                                         Context context = {});

// The config `openshell oci spec` writes: a busybox-style sh in rootfs/,
// as runc spec writes one.
nlohmann::json example_config(bool rootless);

}  // namespace openshell::oci
