// OCI lifecycle hooks (runtime-spec config.md "POSIX-platform Hooks"), as a
// CDI spec's containerEdits.hooks names them: a program run on the host at a
// moment of the container's life, with the container's state as JSON on its
// stdin. Which of our moments each hook name maps to is in docs/gpu.md.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

namespace openshell::runtime {

enum class HookStage {
  kCreateRuntime,    // namespaces made, id maps written, before the root is built
  kCreateContainer,  // the root built and pivoted into, before the confinement
  kStartContainer,   // the same moment, after createContainer, just before the main process
  kPoststart,        // the main process runs
  kPoststop,         // the sandbox has ended
};

struct Hook {
  HookStage stage = HookStage::kCreateRuntime;
  std::string path;               // absolute, on the host
  std::vector<std::string> args;  // argv, args[0] included (empty: the path alone)
  std::vector<std::string> env;   // KEY=VALUE, exactly its environment
  std::optional<int> timeout_s;   // none: kDefaultHookTimeoutS
};

// A hook that gives no timeout of its own is killed after this long: a hung
// hook must not hang a sandbox's start forever.
inline constexpr int kDefaultHookTimeoutS = 60;

// "createRuntime" -> kCreateRuntime; "prestart" (deprecated) is
// createRuntime. nullopt for a name that is none of them.
std::optional<HookStage> hook_stage(const std::string& name);
const char* hook_stage_name(HookStage stage);

// The container's state as the runtime spec gives it to hooks (ociVersion,
// id, status, pid, bundle).
std::string hook_state_json(const std::string& id, const std::string& status, pid_t pid,
                            const std::string& bundle);

// Runs every hook of `stage` in order, each with `state` on its stdin, its
// stdout and stderr ours, and waits for it (up to its timeout, then
// SIGKILL). Returns "" when all exited 0, else the first failure, naming
// the hook ("createContainer hook /usr/bin/x: exited with 1"); the hooks
// after a failure are not run.
std::string run_hooks(const std::vector<Hook>& hooks, HookStage stage, const std::string& state);

// A bundle directory for the hooks (runtime-spec: "bundle"): a private
// directory with a config.json whose root.path is the sandbox's root as the
// host reaches it (/proc/PID/root). Removed by the destructor.
class HookBundle {
 public:
  HookBundle() = default;
  HookBundle(HookBundle&& other) noexcept : dir_(std::move(other.dir_)) { other.dir_.clear(); }
  HookBundle& operator=(HookBundle&& other) noexcept;
  ~HookBundle();
  // Throws Error.
  static HookBundle create(pid_t pid, const std::string& hostname);
  const std::string& dir() const { return dir_; }

 private:
  void remove() noexcept;
  std::string dir_;
};

}  // namespace openshell::runtime
