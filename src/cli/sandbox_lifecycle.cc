#include "cli/sandbox_lifecycle.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "base/log.h"
#include "base/text.h"
#include "net/http.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

void warn_exited(const json& created, const std::string& phase, const std::string& status) {
  const std::string name = created.value("name", "");
  const std::string command = text::join(created.value("command", std::vector<std::string>{}), " ");
  log::warn("sandbox '" + name + "': the main process exited at once with status " + status + ": " +
            command + " (the image's command; a shell with no input ends at once), and the " +
            "sandbox is " + phase + ". For a sandbox that keeps running for 'sandbox exec', give " +
            "it a command that lasts: openshell sandbox create --from " +
            created.value("from", "IMAGE") + " -- sleep infinity");
}

}  // namespace

std::vector<std::string> startable_sandboxes(GatewayClient& client) {
  std::vector<std::string> names;
  for (const auto& s : client.call("GET", "/v1/sandboxes").value("sandboxes", json::array())) {
    std::string phase = s.value("phase", "");
    if (phase == "Stopped" || phase == "Completed" || phase == "Error")
      names.push_back(s.value("name", ""));
  }
  return names;
}

void warn_if_it_exits_at_once(GatewayClient& client, const json& created) {
  const std::string name = created.value("name", "");
  const auto deadline = std::chrono::steady_clock::now() + kExitedAtOnce;
  json s = created;
  for (;;) {
    std::string phase = s.value("phase", "");
    if (phase == "Completed" || phase == "Error") {
      warn_exited(s, phase,
                  s.contains("exit_code") ? std::to_string(s["exit_code"].get<int>()) : "unknown");
      return;
    }
    if (phase != "Ready" && phase != "Provisioning" && phase != "Starting") return;
    if (std::chrono::steady_clock::now() >= deadline) return;
    ::usleep(50000);
    try {
      s = client.call("GET", "/v1/sandboxes/" + net::percent_encode(name));
    } catch (const Error&) {
      return;  // gone (--no-keep): nothing to say about it
    }
  }
}

void warn_if_it_exited_at_once(const json& created, const LogEnd& end,
                               std::chrono::steady_clock::time_point since) {
  if (std::chrono::steady_clock::now() - since > kExitedAtOnce) return;
  if (end.phase != "Completed" && end.phase != "Error") return;
  warn_exited(created, end.phase, end.exit_code ? std::to_string(*end.exit_code) : "unknown");
}

}  // namespace openshell::cli
