// What `sandbox create` and `sandbox start` say beyond the gateway's
// answer: a main process that ended at once, and which sandboxes
// `start --all` starts.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "cli/gateway_client.h"
#include "cli/streams.h"

namespace openshell::cli {

// How soon after the start an ended main process counts as "at once".
inline constexpr std::chrono::milliseconds kExitedAtOnce{1000};

// The caller's sandboxes that `sandbox start --all` starts: the Stopped,
// Completed and Error ones, oldest first.
std::vector<std::string> startable_sandboxes(GatewayClient& client);

// A detached create whose main process is the image's: waits up to
// kExitedAtOnce for it to end and, if it did, says so on stderr with a
// hint (busybox's command, a shell, ends at once without input: the
// sandbox is Completed before anyone could exec into it).
void warn_if_it_exits_at_once(GatewayClient& client, const nlohmann::json& created);
// The same for an attached create, once its output ended (end), begun at
// `since`.
void warn_if_it_exited_at_once(const nlohmann::json& created, const LogEnd& end,
                               std::chrono::steady_clock::time_point since);

}  // namespace openshell::cli
