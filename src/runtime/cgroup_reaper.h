// The cgroups of a sandbox whose owner is killed outright (SIGKILL), and
// the claim on its host ids, have no one left to remove them: the sandbox's
// init ends everything when its owner goes, but it lives inside them. A
// small helper process waits for the owner to go and then removes them once
// they are empty. The owner's normal end tells it to go without doing
// anything.
//
// The helper is a clone that shares the owner's memory (as posix_spawn's
// child does), not a fork: copying the page tables of a 24 MB static binary
// and then paying a copy-on-write fault for each page the owner writes cost
// a one-shot `openshell run` 2-2.6 ms of its 19 here (bench: docs/benchmarks.md).
// So the helper runs only code that allocates nothing and touches nothing
// of the owner's but what the constructor prepared.
#pragma once

#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>

#include "base/unique_fd.h"
#include "namespaces/id_pool.h"

namespace openshell::runtime {

class CgroupReaper {
 public:
  CgroupReaper() = default;
  // Starts the helper for the cgroups named `name` below this process's own
  // in every hierarchy (those CgroupSet::create may make): before they
  // exist, so that no instant is left uncovered. Call with the signals the
  // owner handles blocked (block_forwarded_signals): the helper ignores
  // them all, and none may reach the owner's handlers in it first.
  // release: a run's claim on its host ids, freed too if the owner dies.
  explicit CgroupReaper(const std::string& name,
                        std::optional<namespaces::RunRelease> release = std::nullopt);
  CgroupReaper(const CgroupReaper&) = delete;
  CgroupReaper& operator=(const CgroupReaper&) = delete;
  // The owner has removed them itself: the helper exits.
  ~CgroupReaper();

  struct Plan;  // what the helper reads: made before it starts, kept until it ends

 private:
  std::unique_ptr<Plan> plan_;
  void* stack_ = nullptr;
  pid_t pid_ = -1;
  UniqueFd done_;  // a byte: the owner cleaned up; EOF alone: it died
};

}  // namespace openshell::runtime
