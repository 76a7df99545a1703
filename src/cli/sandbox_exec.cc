// openshell sandbox exec: a command in a running sandbox, with its stdio here.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/env_file.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"
#include "cli/streams.h"

namespace openshell::cli {

void add_sandbox_exec(CLI::App* sandbox, Action* action) {
  auto name = std::make_shared<std::string>();
  auto o = std::make_shared<ExecOptions>();
  // Options may follow the name; the command follows "--".
  auto name_flag = std::make_shared<std::string>();
  CLI::App* c = sandbox->add_subcommand("exec", "Run a command in a running sandbox");
  c->add_option("name", *name, "The sandbox (or give it with -n)");
  c->add_option("-n", *name_flag, "The sandbox, as OpenShell's exec takes it: exec -n NAME -- CMD");
  c->add_flag("-t,--tty", o->tty, "Give the command a pseudo-terminal (and this terminal's TERM)");
  repeatable(c->add_option("-e,--env", o->env,
                           "KEY=VALUE added to its environment, or KEY for the caller's value "
                           "(repeatable)"));
  auto env_files = std::make_shared<std::vector<std::string>>();
  repeatable(c->add_option("--env-file", *env_files,
                           "A file of KEY=VALUE lines, as docker reads it (repeatable; -e wins)"));
  c->add_option("-w,--workdir", o->workdir,
                "Its working directory (default: the image's WorkingDir, else /sandbox)");
  c->add_option("-u,--user", o->user, kUserHelp);
  c->add_option("--timeout", o->timeout_s, "Kill it after this many seconds (exit status 124)");
  // Not required here: with -n NAME, a one-word command is taken as the
  // name by CLI11, and the callback gives it back.
  c->add_option("command", o->argv, "The command and its arguments");
  c->footer("The exit status is the command's own.\nExample: openshell sandbox exec demo -- ls -l");
  c->callback([name, name_flag, o, env_files, action] {
    // With -n NAME, the first positional word is the command's.
    if (!name_flag->empty()) {
      if (!name->empty()) o->argv.insert(o->argv.begin(), *name);
      *name = *name_flag;
    }
    if (name->empty())
      throw CLI::ValidationError("no sandbox named (exec NAME -- CMD, or exec -n NAME -- CMD)");
    // After the name, CLI11 keeps a "--" as a word of the command.
    if (!o->argv.empty() && o->argv.front() == "--") o->argv.erase(o->argv.begin());
    if (o->argv.empty()) throw CLI::ValidationError("no command given (exec NAME -- CMD)");
    *action = [name, o, env_files] {
      // -e KEY passes the caller's value (as `run` does); a terminal gets TERM.
      std::vector<std::string> env = environment_entries(*env_files, o->env);
      if (o->tty && std::none_of(env.begin(), env.end(),
                                 [](const std::string& e) { return e.rfind("TERM=", 0) == 0; })) {
        const char* term = std::getenv("TERM");
        env.push_back(std::string("TERM=") + (term && *term ? term : "xterm"));
      }
      o->env = env;
      // Straight to the stream, on its one connection: a sandbox that is
      // not Ready refuses the upgrade, and only then is asked why; a
      // gateway that does not answer is started (or named) then, and the
      // stream opened again (nothing ran: it never reached a sandbox).
      GatewayClient client{GatewayClient::Deferred{}};
      int status;
      try {
        try {
          status = exec(client, *name, *o);
        } catch (const StreamUnreachable&) {
          if (client.connected()) throw;
          client.connect();
          status = exec(client, *name, *o);
        }
      } catch (const StreamRefused&) {
        require_ready(client, *name, "exec");
        throw;
      }
      remember(client.paths(), *name);
      return status;
    };
  });
}

}  // namespace openshell::cli
