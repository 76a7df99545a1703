// How openshell's long-lived processes show in ps, top and `ss -p`.
//
// Started from /proc/self/exe, a process's name (comm) would be "exe" and
// its command line "openshell supervisor --launch FILE". The gateway and the
// supervisors run instead under names of their own: their command line
// begins with the role ("openshell-gateway ...", "openshell-supervisor NAME
// ..."), which is what `ps -o args` shows, and each sets its comm (what
// `ps -o comm`, top and `ss -p` show; at most 15 bytes) to a short name.
// The argv is given at exec, not rewritten in place afterwards: that needs
// no privilege and no room in the original argv, and /proc/PID/cmdline stays
// a plain NUL-separated list.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace openshell::process_name {

inline constexpr std::string_view kGateway = "openshell-gateway";
inline constexpr std::string_view kSupervisor = "openshell-supervisor";
inline constexpr std::string_view kGatewayComm = "osh-gateway";
inline constexpr std::string_view kSupervisorComm = "osh-supervisor";

// Sets the calling thread's comm (the main thread's is the process's);
// longer than 15 bytes is cut. Best effort: a name is no reason to fail.
void set_comm(std::string_view name);

// The command-line words for a process started under a role's name:
// "openshell-gateway ARGS..." gives "openshell gateway run ARGS...", and
// "openshell-supervisor NAME ARGS..." gives "openshell supervisor ARGS..."
// (NAME, the sandbox's, is there for people reading ps). Empty when argv[0]
// (its last path component) names no role.
std::vector<std::string> role_arguments(int argc, const char* const* argv);

}  // namespace openshell::process_name
