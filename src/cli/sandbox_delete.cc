// openshell sandbox delete: sandboxes named, or all of them, with everything
// they own.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

using nlohmann::json;

void add_sandbox_delete(CLI::App* sandbox, Action* action) {
  auto names = std::make_shared<std::vector<std::string>>();
  auto all = std::make_shared<bool>(false);
  CLI::App* c =
      sandbox->add_subcommand("delete", "Delete sandboxes: their processes, files and state");
  c->alias("rm");
  c->add_option("names", *names, "The sandboxes");
  c->add_flag("--all", *all, "Every sandbox of yours (those 'sandbox list' shows)");
  c->callback([names, all, action] {
    *action = [names, all] {
      if (*all == !names->empty()) throw Error("sandbox delete: give names or --all (not both)");
      GatewayClient client;
      std::vector<std::string> targets = *names;
      if (*all) {
        json list = client.call("GET", "/v1/sandboxes");
        for (const auto& s : list["sandboxes"]) targets.push_back(s.value("name", ""));
      }
      int status = 0;
      for (const auto& n : targets) {
        try {
          client.call("DELETE", target(n));
          std::printf("%s\n", n.c_str());
        } catch (const Error& e) {
          log::error(e.what());
          status = exit_code::kFailure;
        }
      }
      return status;
    };
  });
}

}  // namespace openshell::cli
