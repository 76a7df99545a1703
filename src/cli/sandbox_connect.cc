// openshell sandbox connect: this terminal attached to a sandbox's main
// process (its pseudo-terminal with create --tty), until Ctrl-P Ctrl-Q.
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/connect.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

void add_sandbox_connect(CLI::App* sandbox, Action* action) {
  auto name = std::make_shared<std::string>();
  auto o = std::make_shared<ConnectOptions>();
  auto no_replay = std::make_shared<bool>(false);
  CLI::App* c =
      sandbox->add_subcommand("connect", "Attach this terminal to a sandbox's main process");
  c->add_option("name", *name, "The sandbox (default: the last one named)");
  c->add_option("--detach-keys", o->detach_keys,
                "The keys that detach, leaving the main process running: single characters "
                "and ctrl-X, comma-separated")
      ->capture_default_str();
  c->add_flag("--no-replay", *no_replay,
              "Do not show the main process's recent output (up to 1 MiB) first");
  c->footer(
      "The main process has a terminal when the sandbox was created with --tty (the default "
      "when create's stdin is a terminal); without a command it is then a login shell. "
      "Without one, connect shows its output and sends no input.\nOne terminal is attached at a "
      "time: another connect takes over, and this one is told. The exit status is the main "
      "process's when it ends, 0 when detached.\nExamples:\n  openshell sandbox create --name "
      "dev --tty -d\n  openshell sandbox connect dev        (Ctrl-P Ctrl-Q detaches)\nSee "
      "openshell-sandbox(1).");
  c->callback([name, o, no_replay, action] {
    try {
      parse_detach_keys(o->detach_keys);  // bad keys stop here, before the gateway
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());
    }
    *action = [name, o, no_replay] {
      GatewayClient client;
      const std::string which = sandbox_name(client.paths(), *name);
      require_ready(client, which, "connect");
      o->replay = !*no_replay;
      return connect_console(client, which, *o);
    };
  });
}

}  // namespace openshell::cli
