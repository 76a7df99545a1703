// openshell sandbox: the command tree of long-lived sandboxes, one
// subcommand a file (sandbox_<name>.cc), and openshell logs.
#include <initializer_list>
#include <string_view>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

namespace {

constexpr const char* kSandboxHelp = "Create and manage long-lived sandboxes (through the gateway)";
constexpr const char* kLogsHelp = "Print a sandbox's main process output";

}  // namespace

void add_sandbox_commands(CLI::App& app, Action* action, std::string_view only) {
  CLI::App* sandbox = app.add_subcommand("sandbox", kSandboxHelp);
  sandbox->require_subcommand(1);
  // Every subcommand, or the one named (a name or an alias).
  auto want = [only](std::initializer_list<std::string_view> names) {
    if (only.empty()) return true;
    for (std::string_view n : names)
      if (n == only) return true;
    return false;
  };
  if (want({"create"})) add_sandbox_create(sandbox, action);
  if (want({"get"})) add_sandbox_get(sandbox, action);
  if (want({"list", "ls"})) add_sandbox_list(sandbox, action);
  if (want({"start", "stop"})) add_sandbox_start_stop(sandbox, action);
  if (want({"delete", "rm"})) add_sandbox_delete(sandbox, action);
  if (want({"exec"})) add_sandbox_exec(sandbox, action);
  if (want({"connect"})) add_sandbox_connect(sandbox, action);
  if (want({"upload"})) add_sandbox_upload(sandbox, action);
  if (want({"download"})) add_sandbox_download(sandbox, action);
  if (want({"wait"})) add_sandbox_wait(sandbox, action);
  if (want({"commit"})) add_sandbox_commit(sandbox, action);
  if (want({"logs"})) add_logs_command(sandbox, kLogsHelp, action);
  if (only.empty())
    add_logs_command(&app, "Print a sandbox's main process output (same as 'sandbox logs')",
                     action);
}

}  // namespace openshell::cli
