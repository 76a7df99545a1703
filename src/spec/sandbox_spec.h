// What a sandbox is made of, as the user asked for it: the gateway stores it,
// signs it into the launch file, and the supervisor builds the container
// from it (spec/container_spec.h); `openshell run` builds one from its flags
// for the same builder. JSON on the wire and on disk.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/sandbox_limits.h"

namespace openshell {

// The image a sandbox's root is made of, as resolved when it was created:
// later changes to the image's name do not change the sandbox.
struct SandboxImage {
  std::string name;                 // canonical reference
  std::string id;                   // config digest
  std::string digest;               // manifest digest
  std::vector<std::string> layers;  // diff ids, bottom first
  std::string user;                 // the config's User (may be empty)
  std::string working_dir;          // the config's WorkingDir (may be empty)
};

// A host path bind-mounted into a gateway's sandbox (`create --bind`), at
// every launch, as `run --bind` mounts one (spec/container_spec.h).
struct SandboxBind {
  std::string source;  // absolute, canonical when the sandbox was created
  std::string target;  // absolute path inside
  bool read_only = false;
  bool operator==(const SandboxBind&) const = default;
};

// A sandbox that runs as a micro-VM (`--vm`; docs/vm.md): the guest's
// resources, and the kernel it boots, fixed at create.
struct SandboxVm {
  uint32_t vcpus = 1;
  uint64_t memory_mib = 512;
  std::string kernel;  // absolute path of the guest kernel, resolved at create
  bool operator==(const SandboxVm&) const = default;
};

struct SandboxSpec {
  // "host"; an absolute directory (the root's lower layer); or an image
  // reference, resolved by the gateway into `image`.
  std::string from = "host";
  std::optional<SandboxImage> image;
  std::string storage;               // "" (overlay) or "copy" (the root is a copy: no overlayfs)
  std::string storage_note;          // why "copy"
  std::vector<std::string> command;  // the main process; empty: none (the sandbox idles)
  std::vector<std::string> env;      // KEY=VALUE
  // `create --user`: UID[:GID] or NAME[:GROUP] in the sandbox's root, over
  // the policy's and the image's; root only where the policy allows it.
  std::string user;
  std::vector<SandboxBind> binds;
  std::optional<double> cpus;
  std::optional<uint64_t> memory_bytes;
  std::optional<uint64_t> pids;            // 0: no limit
  std::optional<uint64_t> tmp_size_bytes;  // the size of /tmp (a tmpfs)
  std::optional<uint64_t> shm_size_bytes;  // the size of /dev/shm (a tmpfs)
  // As root: the first host uid and gid of the sandbox's own id range, set
  // by the gateway at create (none: the shared range of older sandboxes).
  std::optional<uint32_t> host_uid_start, host_gid_start;
  std::map<std::string, std::string> labels;
  bool no_keep = false;  // delete the sandbox once the main process exits
  // The main process gets a pseudo-terminal (create --tty), which `sandbox
  // connect` attaches to; without a command it is then a login shell.
  bool tty = false;
  // Whether the gateway starts it again when, at its own start, it finds
  // the sandbox's supervisor gone (gateway/restart_policy.h): "no",
  // "on-failure", "unless-stopped"; "" is unless-stopped.
  std::string restart;
  std::string policy;         // policy TOML text; empty: the default policy
  std::string policy_source;  // the file it came from, for messages
  // PEM certificates (--ca-cert) added to the sandbox's system CA bundle
  // (spec/ca_certs.h), one entry a file given.
  std::vector<std::string> ca_certs;
  // Set: the sandbox is a micro-VM booting its image's root as the guest's
  // disk; cpus and memory_bytes then bound the VMM process, not the guest.
  std::optional<SandboxVm> vm;
  // `--gpu`: "all" or a count N (the first N GPUs); "": none. Resolved at
  // every launch into the host's devices (runtime/gpu.h, docs/gpu.md).
  std::string gpu;

  // Throws Error naming the field at fault.
  void validate() const;
  // Fills what the spec leaves unset: pids, tmp_size_bytes, shm_size_bytes
  // (see base/sandbox_limits.h).
  void apply_limit_defaults(const limits::Defaults& defaults, uint64_t memory_total);
  // The limits as a JSON object (for `sandbox get`): pids, memory_bytes,
  // cpus, tmp_size_bytes, shm_size_bytes; unset ones are left out.
  nlohmann::json limits_json() const;
  std::string to_json() const;
  static SandboxSpec from_json(const std::string& text);  // throws Error
};

// k=v with a DNS-label-like key: checks one label; returns the reason or "".
std::string check_label(const std::string& key, const std::string& value);

}  // namespace openshell
