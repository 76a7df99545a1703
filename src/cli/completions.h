// Shell completion scripts, generated from the CLI11 command tree itself so
// that they cannot drift from it. Names of sandboxes, images and gateways
// come from the live gateway at completion time, through the hidden
// `openshell __complete sandboxes|images|gateways`.
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace openshell::cli {

// One command of the tree, flattened: its path (" sandbox create"; "" for
// the root), subcommands, options, and which names its arguments take.
struct CommandNode {
  std::string path;
  std::vector<std::string> subcommands;    // names and aliases, hidden ones left out
  std::vector<std::string> flags;          // options that take no value ("-v", "--all")
  std::vector<std::string> value_options;  // options that take one ("--from")
  std::string argument_kind;               // "sandboxes", "images", "gateways" or ""
};

std::vector<CommandNode> command_nodes(const CLI::App& root);

// The kind of names an option's value takes ("--from": images), "" for none.
std::string option_value_kind(const std::string& option);

std::string bash_completion(const CLI::App& root);
std::string zsh_completion(const CLI::App& root);
std::string fish_completion(const CLI::App& root);

// `openshell completions bash|zsh|fish` and the hidden `__complete`.
// (declared in cli/commands.h: add_completion_commands)

}  // namespace openshell::cli
