// openshell sandbox start and stop: the two lifecycle verbs, which share
// their options and output.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "cli/sandbox_lifecycle.h"

namespace openshell::cli {

using nlohmann::json;

void add_sandbox_start_stop(CLI::App* sandbox, Action* action) {
  for (const char* verb : {"start", "stop"}) {
    auto name = std::make_shared<std::string>();
    auto all = std::make_shared<bool>(false);
    auto output = std::make_shared<std::string>("table");
    std::string what =
        std::string(verb) == "start"
            ? "Start a sandbox again (from Stopped, Completed or Error) and wait until it runs"
            : "Stop a sandbox's processes, keeping its workspace, and wait until they are gone";
    CLI::App* c = sandbox->add_subcommand(verb, what);
    c->add_option("name", *name, "The sandbox (default: the last one named)");
    if (std::string(verb) == "start")
      c->add_flag("--all", *all, "Every Stopped, Completed and Error sandbox (not with a name)");
    add_output(c, output.get());
    std::string v = verb;
    c->callback([name, all, output, action, v] {
      *action = [name, all, output, v] {
        if (*all && !name->empty()) throw Error("sandbox start: give a name or --all (not both)");
        GatewayClient client;
        std::vector<std::string> names =
            *all ? startable_sandboxes(client)
                 : std::vector<std::string>{sandbox_name(client.paths(), *name)};
        json started = json::array();
        int status = 0;
        for (const auto& n : names) {
          json s;
          try {
            s = v == "start" ? launch_call(client, "start", target(n, v))
                             : client.call("POST", target(n, v));
          } catch (const Error& e) {
            if (!*all) throw;
            log::error(e.what());  // the others still start
            status = exit_code::kFailure;
            continue;
          }
          if (*output == "json" && !*all)
            print_sandbox(s, "json");
          else if (*output == "json")
            started.push_back(s);
          else
            std::printf("%s: %s\n", s.value("name", "").c_str(), s.value("phase", "").c_str());
          // The start failed only if the launch did; a main process that
          // ended at once is the sandbox's business (see its phase).
          if (v == "start" && launch_failed(s)) {
            log::error("sandbox '" + n + "' failed to start: " + why(s));
            status = exit_code::kFailure;
          }
        }
        if (*all && *output == "json") std::printf("%s\n", started.dump(2).c_str());
        return status;
      };
    });
  }
}

}  // namespace openshell::cli
