// Container Device Interface specs (cdiVersion 0.3.0 to 0.8.0; SPEC.md of
// https://github.com/cncf-tags/container-device-interface): JSON or YAML files that a
// vendor's tool (nvidia-ctk cdi generate) writes into /etc/cdi or
// /var/run/cdi, naming each device of a kind ("nvidia.com/gpu") and the
// container edits it takes: device nodes, mounts, environment, hooks and
// groups. We read them and apply the edits ourselves (runtime/gpu.h).
//
// A spec file is untrusted input: every field is checked for type, bounds
// and shape, and an error names the file and the field
// ("/etc/cdi/nvidia.yaml: devices[1].containerEdits.deviceNodes[0].path:
// must be an absolute path").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/hooks.h"

namespace openshell::runtime::cdi {

struct DeviceNode {
  std::string path;       // inside the container
  std::string host_path;  // on the host; "" = path
  char type = 0;          // 'c', 'b', 'p'; 0: the host node's
  std::optional<int64_t> major, minor;
  std::string permissions;  // cgroup access, a subset of "rwm"; "": "rwm"
  std::optional<uint32_t> file_mode, uid, gid;
};

struct Mount {
  std::string host_path;
  std::string container_path;
  std::string type;  // "" or "bind"
  std::vector<std::string> options;
};

struct Edits {
  std::vector<std::string> env;  // KEY=VALUE
  std::vector<DeviceNode> device_nodes;
  std::vector<Mount> mounts;
  std::vector<Hook> hooks;
  std::vector<uint32_t> additional_gids;  // cdiVersion 0.7.0
  bool empty() const {
    return env.empty() && device_nodes.empty() && mounts.empty() && hooks.empty() &&
           additional_gids.empty();
  }
};

struct Device {
  std::string name;  // "0", "all", a UUID...
  Edits edits;
};

struct Spec {
  std::string file;  // where it was read from, for messages
  std::string version;
  std::string kind;  // VENDOR/CLASS: "nvidia.com/gpu"
  std::vector<Device> devices;
  Edits edits;  // the spec's own containerEdits, applied with any of its devices
  const Device* find(std::string_view name) const;
};

// Bounds on what one file may hold.
inline constexpr size_t kMaxFileBytes = 4 << 20;
inline constexpr size_t kMaxDevices = 4096;
inline constexpr size_t kMaxEntries = 4096;  // of each list of one containerEdits

// Parses a spec's text. yaml: YAML (the subset that is JSON-shaped: maps,
// lists, scalars; anchors allowed, bounded), else JSON. Throws Error
// naming `file` and the field.
Spec parse(std::string_view text, const std::string& file, bool yaml);

// The spec files of a directory (*.json, *.yaml, *.yml, in name order).
// A missing directory has none; one that cannot be read throws Error.
std::vector<std::string> spec_files(const std::string& dir);

// Reads and parses one file: too large, not a regular file, or writable by
// others than root and the caller (a spec names programs to run) is an
// Error naming it.
Spec load_file(const std::string& path);

// Every spec of `kind` in `dirs`, highest priority first: CDI gives a later
// directory priority over an earlier one (/var/run/cdi over /etc/cdi). A
// file that fails to load is skipped with its error in *skipped.
std::vector<Spec> load_kind(const std::vector<std::string>& dirs, const std::string& kind,
                            std::vector<std::string>* skipped);

}  // namespace openshell::runtime::cdi
