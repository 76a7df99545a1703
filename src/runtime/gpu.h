// GPUs for a sandbox (`--gpu [N|all]`; docs/gpu.md): what the host's NVIDIA
// devices need inside a sandbox, as the runtime applies it: device nodes
// bound into /dev, read-only bind mounts of the driver's files, environment,
// hooks, and the groups that may open the nodes.
//
// From CDI specs of kind nvidia.com/gpu where the host has them
// (runtime/cdi.h; /etc/cdi and /var/run/cdi), else by discovery: the
// /dev/nvidia* nodes, the driver's user-space libraries (ld.so.cache and the
// usual library directories) and nvidia-smi.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "namespaces/mounts.h"
#include "runtime/hooks.h"

namespace openshell::runtime::gpu {

inline constexpr const char* kKind = "nvidia.com/gpu";

// Environment variables for tests and unusual hosts (docs/gpu.md):
// the CDI spec directories (colon-separated; set and empty: none), and the
// root under which discovery looks for /dev/nvidia*, the libraries and
// nvidia-smi (their paths inside are those below it).
inline constexpr const char* kCdiDirsVariable = "OPENSHELL_CDI_DIRS";
inline constexpr const char* kRootVariable = "OPENSHELL_GPU_ROOT";

// --gpu's value: "all" (also what a bare --gpu means), or the first N.
struct Request {
  bool all = true;
  unsigned count = 0;
  std::string text() const { return all ? "all" : std::to_string(count); }
};

// "" -> nullopt; "all" or 1..1024 -> the request. Throws Error, one line
// naming --gpu.
std::optional<Request> parse_request(const std::string& value);

// A device node as the sandbox gets it: the host's node bound at `path`.
struct Node {
  std::string host_path;  // canonical
  std::string path;       // inside, below /dev
  char type = 'c';        // 'c' or 'b'
  uint32_t major = 0, minor = 0;
  std::string access = "rw";  // the cgroup's: a subset of "rwm"
  uint32_t gid = 0;           // the host node's group and mode
  uint32_t mode = 0;
};

struct Plan {
  std::string source;                // "CDI spec FILE[, FILE]" or "discovery under ROOT"
  std::vector<std::string> devices;  // the GPUs given: CDI names, or /dev/nvidiaN
  std::vector<Node> nodes;
  std::vector<namespaces::BindSpec> mounts;
  std::vector<std::string> env;  // KEY=VALUE, in order
  std::vector<Hook> hooks;
  // Host groups the sandbox's user must hold: those of nodes that only
  // their group may open, and CDI's additionalGids.
  std::vector<uint32_t> groups;
};

struct Host {
  std::vector<std::string> cdi_dirs = {"/etc/cdi", "/var/run/cdi"};  // lowest priority first
  std::string root = "/";
  // From kCdiDirsVariable and kRootVariable, else the defaults.
  static Host from_environment();
};

// What the request gets on this host. Throws Error, one line: no GPU, fewer
// than asked for, a CDI spec naming what is not there (naming its file).
Plan plan(const Request& request, const Host& host);

// The library paths of an ld.so.cache file's text (glibc's format 1.1);
// empty when it is not one. Exposed for tests.
std::vector<std::string> ld_cache_paths(std::string_view cache);

}  // namespace openshell::runtime::gpu
