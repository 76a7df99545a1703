// openshell sandbox download: a file or directory out of a running sandbox.
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/copy.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

void add_sandbox_download(CLI::App* sandbox, Action* action) {
  auto name = std::make_shared<std::string>();
  auto remote = std::make_shared<std::string>();
  auto local = std::make_shared<std::string>(".");
  CLI::App* c =
      sandbox->add_subcommand("download", "Copy a file or directory out of a running sandbox");
  c->add_option("name", *name, "The sandbox")->required();
  c->add_option("remote", *remote, "An absolute path in the sandbox")->required();
  c->add_option("local", *local,
                "A directory here it goes into under its own name, or a new name for it (its "
                "parent must exist); what it becomes must not exist yet")
      ->capture_default_str();
  c->footer(
      "Read as the sandbox's user through tar in the sandbox; what arrives is unpacked like an "
      "untrusted archive and appears only when complete.\n"
      "Errors are one line, exit status 125.\n"
      "Example: openshell sandbox download demo /sandbox/out ./results   # ./results/out, or "
      "./results when it does not exist");
  c->callback([name, remote, local, action] {
    *action = [name, remote, local] {
      GatewayClient client;
      require_ready(client, *name, "download");
      return download(client, *name, *remote, *local);
    };
  });
}

}  // namespace openshell::cli
