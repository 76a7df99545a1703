#include "gateway/restart_policy.h"

namespace openshell::gateway {

std::optional<RestartPolicy> parse_restart_policy(std::string_view text) {
  if (text.empty() || text == "unless-stopped") return RestartPolicy::kUnlessStopped;
  if (text == "on-failure") return RestartPolicy::kOnFailure;
  if (text == "no") return RestartPolicy::kNo;
  return std::nullopt;
}

std::string_view restart_policy_name(RestartPolicy policy) {
  switch (policy) {
    case RestartPolicy::kNo:
      return "no";
    case RestartPolicy::kOnFailure:
      return "on-failure";
    case RestartPolicy::kUnlessStopped:
      break;
  }
  return "unless-stopped";
}

std::string ready_reason(const SandboxRecord& record) {
  for (const auto& c : record.conditions)
    if (c.type == "Ready") return c.reason;
  return "";
}

bool meant_to_run(const SandboxRecord& found) {
  if (found.intent == "stop" || found.intent == "delete") return false;
  switch (found.phase) {
    case Phase::kProvisioning:
    case Phase::kStarting:
    case Phase::kReady:
      return true;
    case Phase::kStopped:
      return ready_reason(found) == kStoppedBySignal;
    default:
      return false;
  }
}

bool restarts(RestartPolicy policy, Phase settled, std::string_view reason) {
  switch (policy) {
    case RestartPolicy::kNo:
      return false;
    case RestartPolicy::kOnFailure:
      return settled == Phase::kError;
    case RestartPolicy::kUnlessStopped:
      return settled == Phase::kError || (settled == Phase::kStopped && reason == kStoppedBySignal);
  }
  return false;
}

}  // namespace openshell::gateway
