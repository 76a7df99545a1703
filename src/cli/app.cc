#include "cli/app.h"

#include <cstdio>
#include <string>
#include <string_view>
#include <utility>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"
#include "cli/gateway_registry.h"
#include "cli/parse_errors.h"

namespace openshell::cli {

namespace {

// The first two words of the command line past the global options:
// `openshell [GLOBAL...] COMMAND [SUBCOMMAND] ...`; empty where absent, or
// when an option comes first.
struct Branch {
  std::string_view command, sub;
};
Branch branch_of(int argc, char** argv) {
  std::string_view words[2];
  int found = 0;
  for (int i = 1; i < argc && found < 2; ++i) {
    std::string_view w = argv[i];
    if (w == "-v" || w == "--verbose" || w.starts_with("--gateway=") ||
        w.starts_with("--gateway-endpoint="))
      continue;
    if (w == "-g" || w == "--gateway" || w == "--gateway-endpoint") {
      ++i;
      continue;
    }
    if (w.starts_with("-")) break;
    words[found++] = w;
  }
  return {words[0], words[1]};
}

// The command tree with its global options bound to *verbose and
// *selection. With `only`, its branch alone where it is `run` or a sandbox
// subcommand: a command's own parse, help and errors read only its branch,
// and building the whole tree (a thousand options and their strings) was
// most of a `sandbox exec`'s own time (a one-shot `run` takes 0.95x as
// long without it). Allocated and never freed: tearing it down at exit is
// time with nothing to show for it.
CLI::App* make_app(Action* action, bool* verbose, GatewaySelection* selection, Branch only) {
  auto* app = new CLI::App{
      "openshell runs commands in sandboxes whose files, processes, system calls and network are "
      "confined by a policy.",
      "openshell"};
  app->require_subcommand(1);
  // The global options (-v, -g, --gateway-endpoint) may also come after the
  // command's name: each command passes the options it lacks up to here.
  app->fallthrough(true);
  app->set_version_flag("--version", std::string("openshell ") + OPENSHELL_VERSION);
  app->add_flag("-v,--verbose", *verbose, "Say what openshell does, with timings")
      ->configurable(false);
  app->add_option("-g,--gateway", selection->name,
                  "The registered gateway to talk to (see 'openshell gateway list'; default: "
                  "$OPENSHELL_GATEWAY, else the active one, else this user's local gateway)")
      ->type_name("NAME");
  app->add_option("--gateway-endpoint", selection->endpoint,
                  "The gateway at this URL: unix:///PATH, https://HOST:PORT or http://HOST:PORT "
                  "(an https URL uses a registered gateway's credentials for it, else this "
                  "user's from 'openshell gateway generate-certs')")
      ->type_name("URL");
  app->footer(
      "Exit status: the command's own; 125 when openshell failed, 126 when the command cannot "
      "be executed, 127 when it was not found.\nSee openshell(1) and openshell-COMMAND(1).");
  if (only.command == "run") {
    add_run_command(*app, action);
    return app;
  }
  if (only.command == "sandbox" && !only.sub.empty()) {
    add_sandbox_commands(*app, action, only.sub);
    // A word that names no sandbox subcommand: the whole tree, for its error.
    const CLI::App* sandbox = app->get_subcommand("sandbox");
    if (!sandbox->get_subcommands([](const CLI::App*) { return true; }).empty()) return app;
    delete app;
    return make_app(action, verbose, selection, Branch{});
  }
  add_run_command(*app, action);
  add_sandbox_commands(*app, action);
  add_image_commands(*app, action);
  add_policy_commands(*app, action);
  add_provider_commands(*app, action);
  add_forward_commands(*app, action);
  add_gateway_commands(*app, action);
  add_status_command(*app, action);
  add_doctor_command(*app, action);
  // Dispatched before this tree is built (cli/main.cc): listed for --help.
  app->add_subcommand("oci",
                      "The OCI runtime, runc's command line (engines run it as openshell-runc): "
                      "see 'openshell oci --help'");
  // Last: the scripts describe the whole tree.
  add_completion_commands(*app, action);
  add_vmm_command(*app, action);
  add_guest_commands(*app, action);
  return app;
}

}  // namespace

int main(int argc, char** argv) {
  Action action;
  bool verbose = false;
  GatewaySelection selection;
  CLI::App& app = *make_app(&action, &verbose, &selection, branch_of(argc, argv));

  if (argc == 1) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    log::error(describe_parse_error(app, argc, argv, e));
    return exit_code::kFailure;
  }
  log::set_verbose(verbose);
  set_gateway_selection(selection);
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
