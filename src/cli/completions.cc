#include "cli/completions.h"

#include <cstdio>
#include <functional>
#include <memory>
#include <set>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/gateway_client.h"
#include "cli/gateway_registry.h"
#include "cli/images.h"
#include "image/reference.h"
#include "image/store.h"

namespace openshell::cli {

namespace {

// Which names a command's positional arguments are. The commands' trees
// say what exists; this says which resource each one acts on.
std::string argument_kind_of(const std::string& path) {
  if (path == " sandbox create" || path == " sandbox list") return "";
  if (path.starts_with(" sandbox ") || path == " logs") return "sandboxes";
  if (path.starts_with(" policy ") && path != " policy validate") return "sandboxes";
  if (path == " image inspect" || path == " image rm") return "images";
  if (path == " gateway select" || path == " gateway info" || path == " gateway remove")
    return "gateways";
  return "";
}

// canonical: the path by the commands' own names (path may take an alias).
void walk(const CLI::App& app, const std::string& path, const std::string& canonical,
          std::vector<CommandNode>* out) {
  CommandNode node;
  node.path = path;
  node.argument_kind = argument_kind_of(canonical);
  std::vector<const CLI::App*> children;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_group().empty() || sub->get_name().starts_with("_")) continue;  // hidden
    children.push_back(sub);
    node.subcommands.push_back(sub->get_name());
    for (const auto& alias : sub->get_aliases()) node.subcommands.push_back(alias);
  }
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->get_group().empty() || opt->get_positional()) continue;
    auto& list = opt->get_expected_min() == 0 ? node.flags : node.value_options;
    for (const auto& s : opt->get_snames()) list.push_back("-" + s);
    for (const auto& l : opt->get_lnames()) list.push_back("--" + l);
  }
  out->push_back(node);
  for (const CLI::App* sub : children)
    walk(*sub, path + " " + sub->get_name(), canonical + " " + sub->get_name(), out);
  // An alias reaches the same command: the scripts know its path too.
  for (const CLI::App* sub : children)
    for (const auto& alias : sub->get_aliases()) {
      std::vector<CommandNode> aliased;
      walk(*sub, path + " " + alias, canonical + " " + sub->get_name(), &aliased);
      out->insert(out->end(), aliased.begin(), aliased.end());
    }
}

std::string words(const std::vector<std::string>& list) { return text::join(list, " "); }

std::string quoted_paths(const std::vector<CommandNode>& nodes, const char* sep) {
  std::vector<std::string> q;
  for (const auto& n : nodes)
    if (!n.path.empty()) q.push_back("\"" + n.path + "\"");
  return text::join(q, sep);
}

// The bash function, for bash itself and for zsh's bashcompinit.
std::string bash_function(const CLI::App& root) {
  const auto nodes = command_nodes(root);
  std::string s;
  s += "_openshell() {\n";
  s += "  local cur=\"${COMP_WORDS[COMP_CWORD]}\" prev=\"\" path=\"\" word i kind=\"\" list=\"\" "
       "valueopts=\"\"\n";
  s += "  local -a gw=()\n";
  s += "  [ \"$COMP_CWORD\" -gt 0 ] && prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n";
  s += "  for ((i = 1; i < COMP_CWORD; i++)); do\n";
  s += "    word=\"${COMP_WORDS[i]}\"\n";
  s += "    case \"$word\" in\n";
  s += "      -g | --gateway | --gateway-endpoint) gw+=(\"$word\" \"${COMP_WORDS[i+1]}\") ;;\n";
  s += "    esac\n";
  s += "    case \"$path $word\" in\n";
  s += "      " + quoted_paths(nodes, " | ") + ") path=\"$path $word\" ;;\n";
  s += "    esac\n";
  s += "  done\n";
  s += "  case \"$path\" in\n";
  for (const auto& n : nodes) {
    std::vector<std::string> all = n.subcommands;
    all.insert(all.end(), n.flags.begin(), n.flags.end());
    all.insert(all.end(), n.value_options.begin(), n.value_options.end());
    s += "    \"" + n.path + "\") list=\"" + words(all) + "\" valueopts=\"" +
         words(n.value_options) + "\" kind=\"" + n.argument_kind + "\" ;;\n";
  }
  s += "  esac\n";
  s += "  if [ -n \"$prev\" ] && [[ \" $valueopts -g --gateway --gateway-endpoint \" == *\" "
       "$prev \"* ]]; then\n";
  s += "    case \"$prev\" in\n";
  for (const std::string o : {"--from", "--image", "-g", "--gateway"})
    s += "      " + o + ") kind=" + option_value_kind(o) + " list=\"\" ;;\n";
  s += "      *) COMPREPLY=(); return 0 ;;\n";
  s += "    esac\n";
  s += "  fi\n";
  s += "  if [ -n \"$kind\" ] && [[ \"$cur\" != -* ]]; then\n";
  s += "    list=\"$list $(openshell \"${gw[@]}\" __complete \"$kind\" 2>/dev/null)\"\n";
  s += "  fi\n";
  s += "  local IFS=$' \\t\\n'\n";
  s += "  COMPREPLY=($(compgen -W \"$list\" -- \"$cur\"))\n";
  s += "}\n";
  return s;
}

}  // namespace

std::vector<CommandNode> command_nodes(const CLI::App& root) {
  std::vector<CommandNode> out;
  walk(root, "", "", &out);
  return out;
}

std::string option_value_kind(const std::string& option) {
  if (option == "--from" || option == "--image") return "images";
  if (option == "-g" || option == "--gateway") return "gateways";
  return "";
}

std::string bash_completion(const CLI::App& root) {
  return "# bash completion for openshell, made by 'openshell completions bash'\n" +
         bash_function(root) + "complete -o default -F _openshell openshell\n";
}

std::string zsh_completion(const CLI::App& root) {
  // zsh runs the bash function through its bashcompinit, so both shells
  // complete alike.
  return "#compdef openshell\n# zsh completion for openshell, made by 'openshell completions "
         "zsh'\nautoload -U +X bashcompinit && bashcompinit\n" +
         bash_function(root) + "complete -o default -F _openshell openshell\n";
}

std::string fish_completion(const CLI::App& root) {
  const auto nodes = command_nodes(root);
  std::string s = "# fish completion for openshell, made by 'openshell completions fish'\n";
  s += "set -g __openshell_paths " + quoted_paths(nodes, " ") + "\n";
  s += "function __openshell_path\n";
  s += "    set -l path ''\n";
  s += "    for word in (commandline -opc)[2..-1]\n";
  s += "        if contains -- \"$path $word\" $__openshell_paths\n";
  s += "            set path \"$path $word\"\n";
  s += "        end\n";
  s += "    end\n";
  s += "    test \"$path\" = \"$argv[1]\"\n";
  s += "end\n";
  s += "complete -c openshell -f\n";
  for (const auto& n : nodes) {
    const std::string cond = "-n '__openshell_path \"" + n.path + "\"'";
    if (!n.subcommands.empty())
      s += "complete -c openshell " + cond + " -a '" + words(n.subcommands) + "'\n";
    if (!n.argument_kind.empty())
      s += "complete -c openshell " + cond + " -a '(openshell __complete " + n.argument_kind +
           " 2>/dev/null)'\n";
    auto option = [&](const std::string& o, bool value) {
      std::string line = "complete -c openshell " + cond;
      line += o.starts_with("--") ? " -l " + o.substr(2) : " -o " + o.substr(1);
      if (o.size() == 2) line = "complete -c openshell " + cond + " -s " + o.substr(1);
      if (value) {
        line += " -r";
        const std::string kind = option_value_kind(o);
        line += kind.empty() ? " -F" : " -a '(openshell __complete " + kind + " 2>/dev/null)'";
      }
      s += line + "\n";
    };
    for (const auto& f : n.flags) option(f, false);
    for (const auto& v : n.value_options) option(v, true);
  }
  return s;
}

void add_completion_commands(CLI::App& app, Action* action) {
  auto shell = std::make_shared<std::string>();
  CLI::App* c = app.add_subcommand("completions", "Print a shell completion script");
  c->add_option("shell", *shell, "bash, zsh or fish")
      ->required()
      ->check(CLI::IsMember({"bash", "zsh", "fish"}));
  c->footer(
      "  bash: openshell completions bash > /etc/bash_completion.d/openshell (or source it "
      "from ~/.bashrc)\n"
      "  zsh:  openshell completions zsh > \"${fpath[1]}/_openshell\"\n"
      "  fish: openshell completions fish > ~/.config/fish/completions/openshell.fish\n"
      "Sandbox, image and gateway names come from the chosen gateway as you type.");
  CLI::App* root = &app;
  c->callback([shell, root, action] {
    *action = [shell, root] {
      const std::string text = *shell == "bash"  ? bash_completion(*root)
                               : *shell == "zsh" ? zsh_completion(*root)
                                                 : fish_completion(*root);
      std::fputs(text.c_str(), stdout);
      return 0;
    };
  });

  // What the scripts call for live names: one a line, nothing (status 0)
  // when the gateway cannot be asked, so a shell never shows an error.
  auto kind = std::make_shared<std::string>();
  CLI::App* h = app.add_subcommand("__complete", "");
  h->group("");
  h->add_option("kind", *kind)
      ->required()
      ->check(CLI::IsMember({"sandboxes", "images", "gateways"}));
  h->callback([kind, action] {
    *action = [kind] {
      try {
        if (*kind == "gateways") {
          std::set<std::string> names;
          for (const auto& g : GatewayRegistry::from_environment().list()) names.insert(g.name);
          for (const auto& n : names) std::printf("%s\n", n.c_str());
        } else if (*kind == "images") {
          for (const auto& r : image::Store(chosen_images_dir()).list())
            std::printf("%s\n", image::parse_reference(r.name).familiar().c_str());
        } else {
          GatewayClient client(chosen_gateway(), false);
          const auto list = client.call("GET", "/v1/sandboxes");
          for (const auto& s : list.value("sandboxes", nlohmann::json::array()))
            std::printf("%s\n", s.value("name", "").c_str());
        }
      } catch (const std::exception& e) {
        log::debug(std::string("__complete: ") + e.what());
      }
      return 0;
    };
  });
}

}  // namespace openshell::cli
