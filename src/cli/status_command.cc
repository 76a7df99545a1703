// openshell status: which gateway commands use, whether it answers, who we
// are to it, its version and its sandboxes by phase. It never starts one.
#include <cerrno>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "cli/gateway_registry.h"
#include "cli/sandbox_common.h"
#include "net/http.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

constexpr const char* kNoGateway =
    "No gateway is running and none is registered. Start this user's with 'openshell gateway "
    "run' (or any sandbox command, e.g. 'openshell sandbox create'), or register one with "
    "'openshell gateway add https://HOST:PORT --local'.";

std::string source_name(GatewayChoice::Source source) {
  switch (source) {
    case GatewayChoice::Source::kFlagName:
      return "--gateway";
    case GatewayChoice::Source::kFlagEndpoint:
      return "--gateway-endpoint";
    case GatewayChoice::Source::kEnvironment:
      return "OPENSHELL_GATEWAY";
    case GatewayChoice::Source::kActive:
      return "active";
    case GatewayChoice::Source::kSystem:
      return "system";
    case GatewayChoice::Source::kLocal:
      return "local";
  }
  return "";
}

// "2 (Ready 1, Completed 1)".
std::string counts_text(const std::map<std::string, int>& by_phase) {
  int total = 0;
  std::string parts;
  for (const auto& [phase, n] : by_phase) {
    total += n;
    parts += (parts.empty() ? "" : ", ") + phase + " " + std::to_string(n);
  }
  return std::to_string(total) + (parts.empty() ? "" : " (" + parts + ")");
}

int status(const std::string& output) {
  GatewayChoice choice = chosen_gateway();
  json out = {{"gateway",
               {{"name", choice.name.empty() ? json(nullptr) : json(choice.name)},
                {"endpoint", choice.endpoint.url()},
                {"source", source_name(choice.source)}}}};
  std::unique_ptr<GatewayClient> client;
  try {
    client = std::make_unique<GatewayClient>(choice, false);
  } catch (const Error& e) {
    // Nothing chosen and the local one not running: a state, not a failure.
    const bool none = choice.local_default();
    out["reachable"] = false;
    out["error"] = e.what();
    if (output == "json") {
      if (none) out["hint"] = kNoGateway;
      std::printf("%s\n", out.dump(2).c_str());
    } else if (none) {
      std::printf("%s\n", kNoGateway);
    } else {
      std::printf("Gateway: %s\nStatus: not reachable: %s\n", choice.describe().c_str(), e.what());
    }
    return none ? 0 : 1;
  }
  const GatewayProbe probe = probe_gateway(*client);
  std::map<std::string, int> by_phase;
  for (const auto& s : client->call("GET", "/v1/sandboxes").value("sandboxes", json::array()))
    ++by_phase[s.value("phase", "Unknown")];
  out["reachable"] = true;
  out["version"] = probe.version;
  out["whoami"] = probe.whoami ? *probe.whoami : json("unknown");
  int total = 0;
  for (const auto& [phase, n] : by_phase) total += n;
  out["sandboxes"] = {{"total", total}, {"by_phase", by_phase}};
  if (output == "json") {
    std::printf("%s\n", out.dump(2).c_str());
    return 0;
  }
  std::string who = "unknown";
  if (probe.whoami) {
    who = probe.whoami->value("principal", "unknown");
    if (probe.whoami->value("admin", false)) who += " (admin)";
    const std::string transport = probe.whoami->value("transport", "");
    if (!transport.empty()) who += ", over " + transport;
  }
  std::printf("Gateway: %s\nStatus: %s\nYou: %s\nVersion: %s\nSandboxes: %s\n",
              choice.name.empty() && choice.local_default()
                  ? ("local (" + choice.endpoint.url() + ")").c_str()
                  : choice.describe().c_str(),
              connection_line(*client, probe).c_str(), who.c_str(), probe.version.c_str(),
              counts_text(by_phase).c_str());
  return 0;
}

}  // namespace

void add_status_command(CLI::App& app, Action* action) {
  auto output = std::make_shared<std::string>("table");
  CLI::App* c = app.add_subcommand(
      "status", "Say which gateway commands use, whether it answers, and who you are to it");
  add_output(c, output.get());
  c->footer(
      "The gateway is the one -g, --gateway-endpoint, OPENSHELL_GATEWAY or the registry's "
      "active entry names, else this user's local one; status never starts it. With no "
      "gateway running or registered it says how to start one, and exits 0; a chosen gateway "
      "that does not answer exits 1. 'You' comes from GET /v1/whoami ('unknown' from a "
      "gateway without it).\nExample: openshell -g lab status -o json\nSee openshell-status(1).");
  c->callback([output, action] { *action = [output] { return status(*output); }; });
}

}  // namespace openshell::cli
