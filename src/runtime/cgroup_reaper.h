// The cgroups of a sandbox whose owner is killed outright (SIGKILL), and
// the claim on its host ids, have no one left to remove them: the sandbox's init ends everything
// when its owner goes, but it lives inside them. A small helper process, forked by the owner, waits
// for the owner to go and then removes them once they are empty. The owner's normal end tells it to
// go without doing anything.
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace openshell::runtime {

class CgroupReaper {
 public:
  CgroupReaper() = default;
  // Forks the helper for the cgroups named `name` below this process's own
  // in every hierarchy (those CgroupSet::create may make): before they
  // exist, so that no instant is left uncovered. Call while the process
  // has a single thread.
  // after_death: more to undo then (run in the helper, which is a fork of
  // a single-threaded process: it may allocate).
  explicit CgroupReaper(const std::string& name, std::function<void()> after_death = {});
  CgroupReaper(const CgroupReaper&) = delete;
  CgroupReaper& operator=(const CgroupReaper&) = delete;
  // The owner has removed them itself: the helper exits.
  ~CgroupReaper();

 private:
  pid_t pid_ = -1;
  UniqueFd done_;  // a byte: the owner cleaned up; EOF alone: it died
};

}  // namespace openshell::runtime
