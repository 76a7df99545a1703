// Holding a running sandbox still while its files are read (sandbox
// commit): every process of its PID namespace moved into a v1 freezer
// cgroup of its own and frozen; thawed and moved back where it was when the
// hold ends, however it ends. The processes do not see it: no signal, no
// stop a parent could wait for, only time that passes.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>

namespace openshell::runtime {

class SandboxFreeze {
 public:
  // Freezes the processes in init_pid's PID namespace; `name` names the
  // freezer cgroup made for them. Throws Error when this host has no
  // freezer this process may use (rootless: none), and when the processes
  // do not freeze in time (they are thawed again).
  SandboxFreeze(pid_t init_pid, const std::string& name);
  ~SandboxFreeze();
  SandboxFreeze(const SandboxFreeze&) = delete;
  SandboxFreeze& operator=(const SandboxFreeze&) = delete;

  // How many processes are held.
  size_t processes() const { return origins_.size(); }

 private:
  void thaw() noexcept;

  std::string dir_;                       // the freezer cgroup made
  std::string hierarchy_root_;            // the freezer hierarchy's mount
  std::map<pid_t, std::string> origins_;  // pid -> its freezer cgroup before
};

// Whether a freezer this process can use exists here (a v1 freezer
// hierarchy it may write).
bool can_freeze();

}  // namespace openshell::runtime
