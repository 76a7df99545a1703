#include "cli/app.h"

#include <utility>  // before CLI11 with GCC 12

#include <CLI/CLI.hpp>

#include <cstdio>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"

namespace openshell::cli {

int main(int argc, char** argv) {
  CLI::App app{
      "openshell runs commands in sandboxes whose files, processes, system calls and network are "
      "confined by a policy.",
      "openshell"};
  app.require_subcommand(1);
  app.fallthrough(false);
  app.set_version_flag("--version", std::string("openshell ") + OPENSHELL_VERSION);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Say what openshell does, with timings")->configurable(false);
  app.footer(
      "Exit status: the command's own; 125 when openshell failed, 126 when the command cannot "
      "be executed, 127 when it was not found.\nSee openshell(1) and openshell-COMMAND(1).");

  Action action;
  add_run_command(app, &action);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::string where = "openshell";
    for (const CLI::App* sub : app.get_subcommands()) where += " " + sub->get_name();
    log::error(std::string(e.what()) + " (see '" + where + " --help')");
    return exit_code::kFailure;
  }
  log::set_verbose(verbose);
  try {
    return action ? action() : exit_code::kFailure;
  } catch (const Error& e) {
    log::error(e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    log::error(e.what());
    return exit_code::kFailure;
  }
}

}  // namespace openshell::cli
