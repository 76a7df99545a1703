// openshell sandbox upload: a file or directory from here into a running
// sandbox.
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "cli/copy.h"
#include "cli/gateway_client.h"
#include "cli/sandbox_common.h"

namespace openshell::cli {

void add_sandbox_upload(CLI::App* sandbox, Action* action) {
  auto name = std::make_shared<std::string>();
  auto local = std::make_shared<std::string>();
  auto dest = std::make_shared<std::string>("/sandbox");
  auto options = std::make_shared<UploadOptions>();
  CLI::App* c =
      sandbox->add_subcommand("upload", "Copy a file or directory into a running sandbox");
  c->add_option("name", *name, "The sandbox")->required();
  c->add_option("local", *local, "A file, directory or symbolic link on this machine")->required();
  c->add_option("dest", *dest, "The directory in the sandbox it goes into")->capture_default_str();
  c->add_flag("!--no-git-ignore", options->git_ignore,
              "Copy everything, also what .gitignore leaves out");
  c->add_flag("-v,--verbose", options->verbose, "Name each file and directory copied");
  c->footer(
      "Copied as the sandbox's user, under its own name, through tar in the sandbox; its policy "
      "applies (by default only /sandbox and /tmp are writable). From a directory, what "
      ".gitignore leaves out stays behind: git decides in a git work tree, else openshell reads "
      "the .gitignore files (see openshell-sandbox(1)). Prints what it copied. Errors are one "
      "line, exit status 125.\n"
      "Example: openshell sandbox upload demo ./src            # becomes /sandbox/src");
  c->callback([name, local, dest, options, action] {
    *action = [name, local, dest, options] {
      GatewayClient client;
      require_ready(client, *name, "upload");
      return upload(client, *name, *local, *dest, *options);
    };
  });
}

}  // namespace openshell::cli
