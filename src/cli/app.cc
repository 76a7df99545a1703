#include "cli/app.h"

#include <cstdio>
#include <string>
#include <utility>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/log.h"
#include "cli/commands.h"

namespace openshell::cli {

namespace {

// CLI11's "The following arguments were not expected: -- --bogus" becomes
// "unknown option --bogus".
std::string describe_parse_error(const CLI::ParseError& e) {
  std::string message = e.what();
  static const std::string kExtras = "The following argument";
  if (message.rfind(kExtras, 0) != 0) return message;
  auto colon = message.find(": ");
  if (colon == std::string::npos) return message;
  std::vector<std::string> options, others;
  std::string rest = message.substr(colon + 2);
  for (size_t start = 0; start <= rest.size();) {
    size_t end = rest.find(' ', start);
    if (end == std::string::npos) end = rest.size();
    std::string word = rest.substr(start, end - start);
    if (!word.empty() && word != "--") (word[0] == '-' ? options : others).push_back(word);
    start = end + 1;
  }
  if (!options.empty())
    return std::string(options.size() > 1 ? "unknown options " : "unknown option ") +
           CLI::detail::join(options, " ");
  return "unexpected argument " + CLI::detail::join(others, " ");
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "openshell runs commands in sandboxes whose files, processes, system calls and network are "
      "confined by a policy.",
      "openshell"};
  app.require_subcommand(1);
  app.fallthrough(false);
  app.set_version_flag("--version", std::string("openshell ") + OPENSHELL_VERSION);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "Say what openshell does, with timings")
      ->configurable(false);
  app.footer(
      "Exit status: the command's own; 125 when openshell failed, 126 when the command cannot "
      "be executed, 127 when it was not found.\nSee openshell(1) and openshell-COMMAND(1).");

  Action action;
  add_run_command(app, &action);
  add_sandbox_commands(app, &action);
  add_image_commands(app, &action);
  add_policy_commands(app, &action);
  add_gateway_commands(app, &action);

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
    if (app.get_subcommands().empty() && argc > 1 && argv[1][0] != '-') {
      log::error(std::string("unknown command '") + argv[1] + "' (see 'openshell --help')");
      return exit_code::kFailure;
    }
    // The deepest command given: "openshell sandbox exec".
    std::string where = "openshell";
    for (const CLI::App* at = &app;;) {
      auto subs = at->get_subcommands();
      if (subs.empty()) break;
      at = subs.front();
      where += " " + at->get_name();
    }
    log::error(describe_parse_error(e) + " (see '" + where + " --help')");
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
