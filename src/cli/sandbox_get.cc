// openshell sandbox get: one sandbox, and its latest events.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

using nlohmann::json;

void add_sandbox_get(CLI::App* sandbox, Action* action) {
  auto name = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>("table");
  CLI::App* c = sandbox->add_subcommand("get", "Show a sandbox");
  c->add_option("name", *name, "The sandbox (default: the last one named)");
  add_output(c, output.get());
  c->callback([name, output, action] {
    *action = [name, output] {
      GatewayClient client;
      *name = sandbox_name(client.paths(), *name);
      json sandbox = client.call("GET", target(*name));
      print_sandbox(sandbox, *output);
      if (*output != "json") {
        // What happened to it lately, as `kubectl describe` shows.
        json events = client.call("GET", target(*name, "events") + "?limit=10")
                          .value("events", json::array());
        std::printf("Events:%s\n", events.empty() ? " none" : "");
        for (const auto& e : events)
          std::printf("  %s  %s  %s\n", e.value("time", "").c_str(), e.value("type", "").c_str(),
                      e.value("message", "").c_str());
      }
      return 0;
    };
  });
}

}  // namespace openshell::cli
