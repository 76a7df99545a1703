// The limits every sandbox gets unless it asks for others: a bound on its
// processes, and on the memory its /tmp and /dev/shm (tmpfs) may take. The
// kernel's own default for a tmpfs is half the RAM, each, and a pid limit
// none at all: one sandbox could exhaust the host's memory or pids.
//
//  - pids: 4096 (0: no limit);
//  - /tmp: the memory limit when there is one, else a tenth of the RAM;
//  - /dev/shm: half of /tmp's default;
//  - inodes of each: one per 16 KiB of its size (at least 4096), so empty
//    files cannot take unaccounted kernel memory without bound.
//
// The gateway's configuration ($STATE_DIR/gateway.toml, [sandbox_defaults])
// may replace each default for its sandboxes (a size given there applies
// whatever the memory limit).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace openshell::limits {

inline constexpr uint64_t kDefaultPids = 4096;
inline constexpr uint64_t kMinTmpfsSize = 1u << 20;  // 1 MiB
inline constexpr uint64_t kInodeBytes = 16u << 10;
inline constexpr uint64_t kMinInodes = 4096;

// A micro-VM's guest (`--vm`, a policy's [vm]): its vCPUs and its RAM in MiB.
inline constexpr uint32_t kMinVcpus = 1, kMaxVcpus = 64;
inline constexpr uint64_t kMinGuestMib = 64, kMaxGuestMib = 65536;

// MemTotal of /proc/meminfo in bytes; 0 when it cannot be read.
uint64_t memory_total();

// The defaults above, from a memory limit (if any) and the RAM's size;
// rounded down to whole MiB.
uint64_t default_tmp_size(std::optional<uint64_t> memory_limit, uint64_t memory_total);
uint64_t default_shm_size(std::optional<uint64_t> memory_limit, uint64_t memory_total);
// nr_inodes for a tmpfs of this size.
uint64_t tmpfs_inodes(uint64_t size);

// What a gateway's configuration says; unset fields keep the built-in rule.
struct Defaults {
  std::optional<uint64_t> pids;
  std::optional<uint64_t> tmp_size;
  std::optional<uint64_t> shm_size;
};

// The limits a user gives on the command line (create and run alike), in
// docker's and Kubernetes' spellings. Each throws Error with one line naming
// the option and the value at fault.
//  - CPUs: "2", "1.5", or millicores "500m" (half a CPU); above 0, at most 4096.
//  - Memory: bytes ("1073741824"), or a number with a unit: K/M/G/T or
//    Ki/Mi/Gi/Ti (also KB/MB/KiB/MiB, any case); all binary, as docker reads
//    them ("1G" = "1Gi" = 1073741824 bytes); at least 4M.
double parse_cpus(const std::string& option, const std::string& value);
uint64_t parse_memory(const std::string& option, const std::string& value);

// Reads [sandbox_defaults] of a TOML file (pids = N, tmp_size = "1G",
// shm_size = "512M"); a missing file gives no changes. Throws Error naming
// the file, line and key at fault.
Defaults load_defaults(const std::string& path);

}  // namespace openshell::limits
