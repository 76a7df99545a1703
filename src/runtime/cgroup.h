// Resource limits through cgroups, on whichever hierarchy holds each
// controller: cgroup v2 where the unified hierarchy has it, v1 otherwise (a
// hybrid host has both). Every cgroup made here is removed by its owner.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"

namespace openshell::runtime {

// One rule of the cgroup's device list: "c 195:0 rw" (minor nullopt: any).
struct DeviceRule {
  char type = 'c';
  uint32_t major = 0;
  std::optional<uint32_t> minor;
  std::string access = "rwm";
  std::string text() const;
};

// What every sandbox's /dev holds (namespaces/kernel_paths.cc): null, zero,
// full, random, urandom, tty, ptmx and the pseudo-terminals.
std::vector<DeviceRule> default_device_rules();

struct Limits {
  std::optional<uint64_t> memory_bytes;
  std::optional<uint64_t> pids;
  std::optional<double> cpus;
  // Set: the sandbox may open these devices and no other (the v1 devices
  // controller: devices.deny "a", then each rule to devices.allow).
  std::optional<std::vector<DeviceRule>> devices;
  bool any() const { return memory_bytes || pids || cpus || devices; }
};

// Where this process's cgroups are, per hierarchy.
struct CgroupLayout {
  struct Hierarchy {
    std::string dir;  // absolute directory of this process's cgroup in it
    // Where the hierarchy is mounted, and which of its cgroups the mount
    // shows at the top ("/" mostly): at() turns a cgroup's path into its
    // directory here.
    std::string mountpoint;
    std::string root = "/";
    std::string at(const std::string& cgroup_path) const;
  };
  std::optional<Hierarchy> unified;              // cgroup v2
  std::map<std::string, Hierarchy> controllers;  // v1: controller name -> hierarchy

  // Reads /proc/self/cgroup and /proc/self/mountinfo.
  static CgroupLayout discover();
  // The same from their text (tests use fake trees).
  static CgroupLayout parse(std::string_view proc_self_cgroup, std::string_view mountinfo);
};

class CgroupSet {
 public:
  CgroupSet() = default;
  CgroupSet(CgroupSet&&) noexcept = default;
  CgroupSet& operator=(CgroupSet&&) noexcept;
  ~CgroupSet();

  // Creates one child cgroup named `name` per hierarchy that the limits need,
  // and writes the limits. A limit that no writable hierarchy can hold is
  // named in *not_enforced ("--memory: ...") instead of failing.
  //
  // A name that starts with "/" is a cgroup path of its own (an OCI
  // config's cgroupsPath): made, with its missing parents, in every v1
  // hierarchy of the memory, pids, cpu, cpuacct, freezer and blkio
  // controllers and in the unified one, limits or not. Only the last
  // component is removed again.
  static CgroupSet create(const CgroupLayout& layout, const std::string& name, const Limits& limits,
                          std::vector<std::string>* not_enforced);

  // cgroup v2 directory fd for clone3's CLONE_INTO_CGROUP; -1 when none.
  int unified_fd() const { return unified_fd_.get(); }
  // The v1 cgroups' `tasks` files, opened for the new process to join them
  // itself (it writes "0" to each before it has a second thread). A
  // single thread moving itself skips the kernel's global threadgroup lock
  // and its RCU grace period, which a write of a pid to cgroup.procs waits
  // for (7 to 20 ms here, against 0.03). A directory whose file cannot be
  // opened is left to attach().
  std::vector<UniqueFd> open_for_self_join();
  // Moves pid into the v1 cgroups not opened above (v2 is joined at clone
  // time).
  void attach(pid_t pid) const;
  // How many processes the kernel's OOM killer ended at the memory limit.
  int oom_kills() const;
  // Removes the cgroups, waiting briefly for exiting tasks. Idempotent.
  void remove() noexcept;
  // From now on remove() leaves the cgroups where they are: their owner
  // removes them later by dirs() (an OCI container's stay until `delete`,
  // for the engine's stats and OOM watch of a container that has exited).
  void keep() noexcept { keep_ = true; }

  const std::vector<std::string>& dirs() const { return dirs_; }
  bool empty() const { return dirs_.empty(); }

 private:
  std::vector<std::string> dirs_;     // every directory made, v2 first
  std::vector<std::string> v1_dirs_;  // those attach() moves by pid (none self-joined)
  std::string memory_dir_;            // the one holding the memory limit (v1 or v2)
  bool memory_v2_ = false;
  bool keep_ = false;
  UniqueFd unified_fd_;
};

}  // namespace openshell::runtime
