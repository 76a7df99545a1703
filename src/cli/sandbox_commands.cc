// openshell sandbox: the command tree of long-lived sandboxes, one
// subcommand a file (sandbox_<name>.cc), and openshell logs.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

void add_sandbox_commands(CLI::App& app, Action* action) {
  CLI::App* sandbox =
      app.add_subcommand("sandbox", "Create and manage long-lived sandboxes (through the gateway)");
  sandbox->require_subcommand(1);
  add_sandbox_create(sandbox, action);
  add_sandbox_get(sandbox, action);
  add_sandbox_list(sandbox, action);
  add_sandbox_start_stop(sandbox, action);
  add_sandbox_delete(sandbox, action);
  add_sandbox_exec(sandbox, action);
  add_sandbox_connect(sandbox, action);
  add_sandbox_upload(sandbox, action);
  add_sandbox_download(sandbox, action);
  add_sandbox_wait(sandbox, action);
  add_sandbox_commit(sandbox, action);
  add_logs_command(sandbox, "Print a sandbox's main process output", action);
  add_logs_command(&app, "Print a sandbox's main process output (same as 'sandbox logs')", action);
}

}  // namespace openshell::cli
