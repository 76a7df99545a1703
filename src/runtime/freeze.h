// Holding a running sandbox still while its files are read (sandbox
// commit): every process of its PID namespace moved into a freezer cgroup
// of its own and frozen (the v1 freezer where the host has one, else
// cgroup v2's cgroup.freeze); thawed and moved back where it was when the
// hold ends, however it ends. The processes do not see it: no signal, no
// stop a parent could wait for, only time that passes.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace openshell::runtime {

enum class Freezer { kAny, kV1, kV2 };

class SandboxFreeze {
 public:
  // Freezes the processes in init_pid's PID namespace; `name` names the
  // freezer cgroup made for them. Throws Error when this host has no
  // freezer this process may use (rootless: none), and when the processes
  // do not freeze in time (they are thawed again).
  // `which` forces a hierarchy (tests); kAny: v1, else v2. With v2, where
  // every process is in a cgroup named sandbox_cgroup that holds nothing
  // else (the sandbox's own, with its limits), that one is frozen in place.
  SandboxFreeze(pid_t init_pid, const std::string& name, Freezer which = Freezer::kAny,
                const std::string& sandbox_cgroup = "");
  ~SandboxFreeze();
  SandboxFreeze(const SandboxFreeze&) = delete;
  SandboxFreeze& operator=(const SandboxFreeze&) = delete;

  // How many processes were moved to be held (0 when frozen in place).
  size_t processes() const { return origins_.size(); }
  bool in_place() const { return in_place_; }

 private:
  void thaw() noexcept;

  bool v2_ = false;
  bool in_place_ = false;                 // v2: the sandbox's own cgroup, frozen where it is
  std::string dir_;                       // the freezer cgroup made
  std::string hierarchy_root_;            // the freezer hierarchy's mount
  std::map<pid_t, std::string> origins_;  // pid -> its freezer cgroup before
};

// Whether a freezer this process can use exists here (a v1 freezer
// hierarchy or a cgroup v2 hierarchy it may write).
bool can_freeze();

}  // namespace openshell::runtime
