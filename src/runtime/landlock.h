// Landlock: the file system policy, enforced by the kernel for the sandbox's
// processes and everything they start.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/child_failure.h"
#include "policy/policy.h"

namespace openshell::runtime::landlock {

// The kernel's Landlock ABI version; 0 when Landlock is unavailable.
int abi_version();

// Access rights (the kernel's LANDLOCK_ACCESS_FS_* bits).
uint64_t fs_rights_for_abi(int abi);
uint64_t read_only_rights();
uint64_t file_rights();  // the subset that applies to non-directories

struct Rule {
  std::string path;  // inside the sandbox
  uint64_t access;
};

struct Plan {
  bool enabled = false;
  bool hard = false;         // hard_requirement: every rule must apply
  bool warn_missing = true;  // say which policy paths the sandbox lacks
  int abi = 0;
  uint64_t handled_fs = 0;
  uint64_t scoped = 0;  // ABI 6: abstract unix sockets and signals
  std::vector<Rule> rules;
};

// Builds the plan from a policy for the given working directory; warns (best
// effort) or throws Error (hard requirement) when the kernel falls short.
Plan plan(const policy::Policy& policy, const std::string& workdir, int abi);

// Child side, inside the new root: opens each path, adds the rules and
// restricts the process. extra_exec_fd (or -1) is a file the sandbox may
// execute and read whatever the rules say (the init's sealed image). Paths
// that do not exist are skipped under best effort; their names go to
// *skipped (comma separated), and fail under hard_requirement.
bool apply(const Plan& plan, int extra_exec_fd, char* skipped, size_t skipped_size,
           ChildFailure* failure) noexcept;

}  // namespace openshell::runtime::landlock
