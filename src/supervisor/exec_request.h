// What a `sandbox exec`'s Start asks of the sandbox's init, the same for a
// container's init (exec_session.h) and a micro-VM's guest init
// (guest_exec.h): the command, its terminal, the sandbox's environment with
// the caller's additions, the working directory, and the user's ids.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "protocol/exec_stream.h"
#include "runtime/init_protocol.h"

namespace openshell::supervisor {

// What an exec takes from its sandbox.
struct ExecDefaults {
  std::vector<std::string> env;  // the sandbox's environment ("K=V")
  std::string workdir = "/";     // where a command runs when Start names no workdir
  // Start's user as ids: none for the sandbox's own; throws Error naming
  // what is wrong. Empty: only the sandbox's user (any user refused).
  std::function<std::optional<runtime::ExecUser>(const std::string& user)> resolve_user;
  // Why this sandbox takes no such command ("": it does); empty: any.
  std::function<std::string(const std::vector<std::string>& argv, bool tty)> refuse;
};

// Start's request to the init. Throws Error (from resolve_user) for a user
// the command cannot run as.
runtime::ExecRequest exec_request(const protocol::exec::Start& start, uint64_t id,
                                  const ExecDefaults& sandbox);

}  // namespace openshell::supervisor
