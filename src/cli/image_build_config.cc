// The instructions of `image build` that change the config only: ARG, ENV,
// LABEL, WORKDIR, USER, EXPOSE, CMD, ENTRYPOINT, SHELL.
#include "base/error.h"
#include "base/text.h"
#include "cli/image_build.h"

namespace openshell::cli::build {

std::string join_path(const std::string& dir, const std::string& path) {
  // ".." resolved by name, never above "/" (as Docker cleans the path).
  std::vector<std::string> parts;
  auto take = [&parts](const std::string& text) {
    for (const auto& part : text::split(text, '/')) {
      if (part.empty() || part == ".") continue;
      if (part != "..")
        parts.push_back(part);
      else if (!parts.empty())
        parts.pop_back();
    }
  };
  if (path.empty() || path[0] != '/') take(dir);
  take(path);
  std::string out;
  for (const auto& part : parts) out.append("/").append(part);
  return out.empty() ? std::string("/") : out;
}

std::string apply_config(const image::Instruction& in, const std::vector<std::string>& words,
                         char escape, const std::map<std::string, std::string>& given_args,
                         const std::map<std::string, std::string>& global, State* state) {
  std::string extra;
  if (in.name == "ARG") {
    auto [name, def] = image::parse_arg(in, state->vars(), escape);
    std::string value;
    if (given_args.count(name))
      value = given_args.at(name);
    else if (def)
      value = *def;
    else if (global.count(name))
      value = global.at(name);
    state->args[name] = value;
    extra = name + "=" + value;
  } else if (in.name == "ENV") {
    for (auto& [k, v] : image::parse_pairs(in, state->vars(), escape)) {
      state->edits.env.push_back(k + "=" + v);
      extra += k + "=" + v + "\n";
    }
  } else if (in.name == "LABEL") {
    for (auto& [k, v] : image::parse_pairs(in, state->vars(), escape)) {
      state->edits.labels[k] = v;
      extra += k + "=" + v + "\n";
    }
  } else if (in.name == "WORKDIR") {
    if (words.size() != 1) throw Error("expected one path");
    state->edits.working_dir = join_path(state->working_dir(), words[0]);
    extra = *state->edits.working_dir;
  } else if (in.name == "USER") {
    if (words.size() != 1) throw Error("expected USER NAME[:GROUP] or UID[:GID]");
    state->edits.user = words[0];
  } else if (in.name == "EXPOSE") {
    for (auto port : words) {
      if (port.find('/') == std::string::npos) port += "/tcp";
      auto slash = port.find('/');
      auto number = text::parse_uint(port.substr(0, slash), 65535);
      std::string proto = port.substr(slash + 1);
      if (!number || *number == 0 || (proto != "tcp" && proto != "udp" && proto != "sctp"))
        throw Error("'" + port + "' is not PORT[/tcp|udp|sctp]");
      state->edits.exposed_ports.push_back(port);
    }
  } else if (in.name == "CMD" || in.name == "ENTRYPOINT") {
    std::vector<std::string> argv = in.exec_form ? in.exec_args : state->shell;
    if (!in.exec_form) {
      if (in.args.empty())
        argv.clear();
      else
        argv.push_back(in.args);
    }
    if (in.name == "CMD") {
      state->edits.cmd = argv;
      state->cmd_set = true;
    } else {
      state->edits.entrypoint = argv;
      if (!state->cmd_set) state->edits.cmd = std::vector<std::string>{};
    }
  } else if (in.name == "SHELL") {
    state->shell = in.exec_args;
  }
  return extra;
}

}  // namespace openshell::cli::build
