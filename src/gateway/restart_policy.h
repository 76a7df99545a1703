// Which sandboxes start again when the gateway starts (after the host came
// back, or after the gateway and supervisors were killed) and finds their
// supervisors gone.
//
// A sandbox is a candidate when it was meant to run: its record says it ran
// (Provisioning, Starting, Ready) and no user stopped or deleted it; or its
// supervisor was stopped by a signal that did not come through the gateway
// (the host shutting down: Stopped, reason SupervisorStopped). Once the
// gateway has settled its phase (what the supervisor's exit file says, else
// SupervisorLost), its policy decides, as docker's restart policies do:
//
//   no              never;
//   on-failure      when it failed: Error (its main process failed, or its
//                   supervisor was lost);
//   unless-stopped  (the default) when it failed, or when it was stopped by
//                   the host rather than by a user. Not when its main
//                   process completed (status 0): that work is done.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "gateway/store.h"

namespace openshell::gateway {

enum class RestartPolicy { kNo, kOnFailure, kUnlessStopped };

// "" and "unless-stopped", "on-failure", "no"; nullopt for anything else.
std::optional<RestartPolicy> parse_restart_policy(std::string_view text);
std::string_view restart_policy_name(RestartPolicy policy);

// The reason of a Stopped sandbox whose supervisor a signal stopped, not
// the gateway (`sandbox stop` gives "Stopped").
inline constexpr std::string_view kStoppedBySignal = "SupervisorStopped";

// The reason of a record's Ready condition ("" when it has none).
std::string ready_reason(const SandboxRecord& record);

// Whether the record, as the gateway found it at its start with the
// supervisor gone (before settling it), was meant to run.
bool meant_to_run(const SandboxRecord& found);

// Whether a sandbox meant to run, now settled in this phase with this
// reason, starts again under the policy.
bool restarts(RestartPolicy policy, Phase settled, std::string_view reason);

}  // namespace openshell::gateway
