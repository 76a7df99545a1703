// openshell sandbox start and stop: the two lifecycle verbs, which share
// their options and output.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

using nlohmann::json;

void add_sandbox_start_stop(CLI::App* sandbox, Action* action) {
  for (const char* verb : {"start", "stop"}) {
    auto name = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    std::string what =
        std::string(verb) == "start"
            ? "Start a sandbox again (from Stopped, Completed or Error) and wait until it runs"
            : "Stop a sandbox's processes, keeping its workspace, and wait until they are gone";
    CLI::App* c = sandbox->add_subcommand(verb, what);
    c->add_option("name", *name, "The sandbox (default: the last one named)");
    add_output(c, output.get());
    std::string v = verb;
    c->callback([name, output, action, v] {
      *action = [name, output, v] {
        GatewayClient client;
        *name = sandbox_name(client.paths(), *name);
        json s = client.call("POST", target(*name, v));
        if (*output == "json") {
          print_sandbox(s, "json");
        } else {
          std::printf("%s: %s\n", s.value("name", "").c_str(), s.value("phase", "").c_str());
        }
        // The start failed only if the launch did; a main process that
        // ended at once is the sandbox's business (see its phase).
        if (v == "start" && launch_failed(s)) {
          log::error("sandbox '" + *name + "' failed to start: " + why(s));
          return exit_code::kFailure;
        }
        return 0;
      };
    });
  }
}

}  // namespace openshell::cli
