// A container's record under the state root (runc's --root): ROOT/ID/ holds
// state.json, the monitor's socket (monitor.sock) and nothing else. The
// status is never stored stale: it is read from the init itself (its pid
// and start time), so a container whose monitor was killed reads stopped.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace openshell::oci {

struct State {
  std::string id;
  std::string bundle;
  std::string oci_version;
  std::string created;     // RFC 3339
  pid_t pid = 0;           // the init, in the host's pid namespace
  uint64_t pid_start = 0;  // its start time (/proc/PID/stat field 22): the same process
  pid_t monitor_pid = 0;
  bool started = false;  // `start` ran the main process
  uint32_t owner = 0;
  std::map<std::string, std::string> annotations;
  std::vector<std::string> cgroup_dirs;
  std::string rootfs;
};

// --root's default: /run/openshell-runc as root, else
// $XDG_RUNTIME_DIR/openshell-runc (or /tmp/openshell-runc-UID).
std::string default_state_root();

// A container id as runc takes them: [A-Za-z0-9_+.-], not "." or "..", at
// most 1024 bytes. Throws Error naming it.
void check_id(const std::string& id);

// Throws Error("container ID does not exist") when there is no record.
State read_state(const std::string& root, const std::string& id);
void write_state(const std::string& root, const State& state);
std::vector<std::string> list_ids(const std::string& root);

// "created", "running" or "stopped", from the init itself.
std::string live_status(const State& state);
// The pid's start time, 0 when it has none (gone).
uint64_t process_start(pid_t pid);

// The runtime spec's state object (what `oci state` prints and hooks read).
nlohmann::json spec_state(const State& state, const std::string& status);

// Every process of the container (those in its init's pid namespace).
std::vector<pid_t> container_pids(const State& state);

}  // namespace openshell::oci
