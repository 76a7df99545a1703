// openshell sandbox wait: until a sandbox's main process has ended, as
// docker wait does; prints its exit status and exits with it.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

bool final_phase(const std::string& phase) {
  return phase == "Completed" || phase == "Error" || phase == "Stopped";
}

// One sandbox: its main process's status once it has ended.
int wait_one(GatewayClient& client, const std::string& name) {
  json sandbox = client.call("GET", target(name));
  // The gateway answers a wait after at most a minute, finished or not.
  while (!final_phase(sandbox.value("phase", "")))
    sandbox = client.call("GET", target(name, "wait"));
  if (launch_failed(sandbox))
    throw Error("sandbox '" + name + "' failed to start: " + why(sandbox));
  // Stopped without an exit status: its main process ended by the stop's SIGTERM.
  const int status = sandbox.contains("exit_code")             ? sandbox["exit_code"].get<int>()
                     : sandbox.value("phase", "") == "Stopped" ? 128 + 15
                                                               : 0;
  std::printf("%d\n", status);
  std::fflush(stdout);
  return status;
}

}  // namespace

void add_sandbox_wait(CLI::App* sandbox, Action* action) {
  auto names = std::make_shared<std::vector<std::string>>();
  CLI::App* c = sandbox->add_subcommand(
      "wait", "Wait until a sandbox's main process has ended; print its exit status");
  c->add_option("name", *names, "The sandboxes (default: the last one named)");
  c->footer(
      "Waits until each sandbox is Completed, Error or Stopped, prints the exit status of its "
      "main process (one a line; 143 when a stop ended it), and exits with the last one's, as "
      "docker wait does. A sandbox that could not start at all: one line on stderr, exit 125.\n"
      "Example: openshell sandbox create --name job -d -- make && openshell sandbox wait job\n"
      "See openshell-sandbox(1).");
  c->callback([names, action] {
    *action = [names] {
      GatewayClient client;
      if (names->empty()) names->push_back(sandbox_name(client.paths(), ""));
      int status = 0;
      for (const auto& name : *names) status = wait_one(client, sandbox_name(client.paths(), name));
      return status;
    };
  });
}

}  // namespace openshell::cli
