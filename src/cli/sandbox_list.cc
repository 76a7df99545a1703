// openshell sandbox list: every sandbox, or those with a label.
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "net/http.h"

namespace openshell::cli {

void add_sandbox_list(CLI::App* sandbox, Action* action) {
  auto output = std::make_shared<std::string>("table");
  auto selector = std::make_shared<std::string>();
  CLI::App* c = sandbox->add_subcommand("list", "List the sandboxes");
  c->alias("ls");
  c->add_option("--selector,-l", *selector, "Only those with label KEY=VALUE (or KEY)");
  add_output(c, output.get());
  c->callback([output, selector, action] {
    *action = [output, selector] {
      GatewayClient client;
      std::string path = "/v1/sandboxes";
      if (!selector->empty()) path += "?selector=" + net::percent_encode(*selector);
      print_sandboxes(client.call("GET", path)["sandboxes"], *output);
      return 0;
    };
  });
}

}  // namespace openshell::cli
