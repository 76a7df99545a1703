// openshell sandbox create|get|list|start|stop|delete|exec|logs, openshell
// logs, openshell gateway run|status|stop, and the supervisor's entry.
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <utility>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "cli/commands.h"
#include "cli/copy.h"
#include "cli/gateway_client.h"
#include "cli/images.h"
#include "cli/run_options.h"
#include "cli/streams.h"
#include "cli/table.h"
#include "gateway/gateway.h"
#include "net/http.h"
#include "spec/ca_certs.h"
#include "spec/sandbox_spec.h"
#include "supervisor/supervisor.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

CLI::Option* repeatable(CLI::Option* option) {
  return option->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

CLI::Option* add_output(CLI::App* app, std::string* output) {
  return app->add_option("-o,--output", *output, "Output format: table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
}

// The last sandbox a command named, for the commands that may leave the
// name out (get, start, stop, logs), as OpenShell's do. Best effort: a
// state directory that cannot be written only loses the convenience.
std::string last_used_file(const Paths& paths) { return paths.state_dir + "/last-sandbox"; }

void remember(const Paths& paths, const std::string& name) {
  const std::string file = last_used_file(paths);
  const std::string temp = file + ".tmp." + std::to_string(::getpid());
  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
  if (!fd) return;
  const std::string line = name + "\n";
  if (::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()) ||
      ::rename(temp.c_str(), file.c_str()) != 0)
    ::unlink(temp.c_str());
}

// `given`, remembered; else the one remembered.
std::string sandbox_name(const Paths& paths, const std::string& given) {
  if (!given.empty()) {
    remember(paths, given);
    return given;
  }
  std::string last = files::try_read(last_used_file(paths)).value_or("");
  while (!last.empty() && (last.back() == '\n' || last.back() == ' ')) last.pop_back();
  if (last.empty()) throw Error("no sandbox named, and none used before: give its name");
  return last;
}

std::string target(const std::string& name, const std::string& action = "") {
  return "/v1/sandboxes/" + net::percent_encode(name) + (action.empty() ? "" : "/" + action);
}

// For the commands that run something in the sandbox (exec, upload,
// download): it must be Ready; it becomes the last one named.
void require_ready(GatewayClient& client, const std::string& name, const std::string& verb) {
  json s = client.call("GET", target(name));
  if (s.value("phase", "") != "Ready")
    throw Error("sandbox '" + name + "' is " + s.value("phase", "") + " (" + verb +
                " needs a Ready sandbox; see 'openshell sandbox start')");
  remember(client.paths(), name);
}

std::string age(const std::string& rfc3339) {
  // "2026-11-29T19:51:23.123Z" -> "5s", "3m", "2h", "4d".
  tm t{};
  if (!strptime(rfc3339.c_str(), "%Y-%m-%dT%H:%M:%S", &t)) return "?";
  time_t then = timegm(&t);
  long s = static_cast<long>(std::time(nullptr) - then);
  if (s < 0) s = 0;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 172800) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string command_text(const json& sandbox) {
  std::vector<std::string> words = sandbox.value("command", std::vector<std::string>{});
  return words.empty() ? "-" : text::join(words, " ");
}

std::string exit_text(const json& sandbox) {
  return sandbox.contains("exit_code") ? std::to_string(sandbox["exit_code"].get<int>()) : "-";
}

void print_sandboxes(const json& list, const std::string& output) {
  if (output == "json") {
    std::printf("%s\n", list.dump(2).c_str());
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "PHASE", "GEN", "EXIT", "AGE", "FROM", "COMMAND"}};
  for (const auto& s : list)
    rows.push_back({s.value("name", ""), s.value("phase", ""),
                    std::to_string(s.value("generation", 0)), exit_text(s),
                    age(s.value("created_at", "")), s.value("from", ""), command_text(s)});
  print_table(rows);
}

// The reason shown for a sandbox in Error.
std::string why(const json& sandbox) {
  for (const auto& c : sandbox.value("conditions", json::array()))
    if (c.value("type", "") == "Ready" && c.value("status", "") == "False") {
      std::string reason = c.value("reason", ""), message = c.value("message", "");
      return reason + (message.empty() ? "" : ": " + message);
    }
  return "";
}

// "pids=4096 memory=64.0 MiB tmp=2.3 GiB shm=1.2 GiB"; what is not limited is left out.
std::string limits_text(const json& s) {
  const json l = s.value("limits", json::object());
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : " ") + part; };
  if (l.contains("pids"))
    add(l["pids"].get<uint64_t>() ? "pids=" + std::to_string(l["pids"].get<uint64_t>())
                                  : "pids=unlimited");
  if (l.contains("memory_bytes"))
    add("memory=" + text::format_bytes(l["memory_bytes"].get<uint64_t>()));
  if (l.contains("cpus")) add("cpus=" + l["cpus"].dump());
  if (l.contains("tmp_size_bytes"))
    add("tmp=" + text::format_bytes(l["tmp_size_bytes"].get<uint64_t>()));
  if (l.contains("shm_size_bytes"))
    add("shm=" + text::format_bytes(l["shm_size_bytes"].get<uint64_t>()));
  return out.empty() ? "-" : out;
}

void print_sandbox(const json& s, const std::string& output) {
  if (output == "json") {
    std::printf("%s\n", s.dump(2).c_str());
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"Name:", s.value("name", "")},
      {"Id:", s.value("id", "")},
      {"Phase:", s.value("phase", "")},
      {"Generation:", std::to_string(s.value("generation", 0))},
      {"Exit code:", exit_text(s)},
      {"From:", s.value("from", "")},
      {"Image:", s.contains("image") ? s["image"].value("name", "") + " (" +
                                           s["image"].value("id", "").substr(7, 12) + ")"
                                     : "-"},
      {"Storage:", s.value("storage", "") +
                       (s.contains("storage_note") ? ": " + s.value("storage_note", "") : "")},
      {"Command:", command_text(s)},
      {"Limits:", limits_text(s)},
      {"Created:", s.value("created_at", "")}};
  std::string labels;
  const json label_map = s.value("labels", json::object());
  for (const auto& [k, v] : label_map.items())
    labels += (labels.empty() ? "" : ",") + k + "=" + v.get<std::string>();
  if (!labels.empty()) rows.push_back({"Labels:", labels});
  print_table(rows);
  std::printf("Conditions:\n");
  for (const auto& c : s.value("conditions", json::array()))
    std::printf("  %s=%s %s %s (%s)\n", c.value("type", "").c_str(), c.value("status", "").c_str(),
                c.value("reason", "").c_str(), c.value("message", "").c_str(),
                c.value("last_transition_time", "").c_str());
}

// Whether the sandbox could not be launched at all (not: its main process
// ended, which is a result like any other).
bool launch_failed(const json& sandbox) {
  if (sandbox.value("phase", "") != "Error") return false;
  for (const auto& c : sandbox.value("conditions", json::array()))
    if (c.value("type", "") == "Ready") {
      std::string reason = c.value("reason", "");
      return reason != "MainProcessFailed" && reason != "MainProcessCompleted";
    }
  return true;
}

// A finished sandbox's main process status as this command's exit status.
int exit_status_of(const json& sandbox) {
  if (sandbox.contains("exit_code")) return sandbox["exit_code"].get<int>();
  return sandbox.value("phase", "") == "Error" ? exit_code::kFailure : 0;
}

void check_name(const std::string& name) {
  if (!text::is_dns_label(name))
    throw Error("sandbox name '" + name +
                "': must be a DNS label (a-z, 0-9 and '-', at most 63, not starting or ending "
                "with '-')");
}

struct CreateOptions {
  std::string name, from = "base", policy, cpu, memory, pids, tmp_size, shm_size, output = "table";
  std::vector<std::string> env, labels, command, ca_certs;
  bool no_keep = false, detach = false, insecure = false;
  bool name_given = false;  // --name, even an empty one
};

int create(const CreateOptions& o) {
  SandboxSpec spec;
  // A directory, else an image (pulled now when the store lacks it).
  spec.from = o.from;
  const bool directory = o.from != "host" && files::is_directory(o.from);
  if (directory) spec.from = files::canonical(o.from, "--from");
  spec.command = o.command;
  spec.env = o.env;
  if (!o.cpu.empty()) {
    auto cpus = text::parse_positive_decimal(o.cpu);
    if (!cpus || *cpus > 4096) throw Error("--cpu " + o.cpu + ": not a positive number of CPUs");
    spec.cpus = cpus;
  }
  if (!o.memory.empty()) {
    auto bytes = text::parse_size(o.memory);
    if (!bytes) throw Error("--memory " + o.memory + ": not a size (like 512M or 2G)");
    spec.memory_bytes = bytes;
  }
  if (!o.pids.empty()) {
    auto pids = text::parse_uint(o.pids, 4194304);
    if (!pids) throw Error("--pids " + o.pids + ": not a number of processes (0: no limit)");
    spec.pids = pids;
  }
  spec.tmp_size_bytes = parse_tmpfs_size("--tmp-size", o.tmp_size);
  spec.shm_size_bytes = parse_tmpfs_size("--shm-size", o.shm_size);
  for (const auto& label : o.labels) {
    auto eq = label.find('=');
    if (eq == std::string::npos) throw Error("--label " + label + ": expected KEY=VALUE");
    spec.labels[label.substr(0, eq)] = label.substr(eq + 1);
  }
  if (!o.policy.empty()) {
    if (int err = files::read_into(o.policy, &spec.policy))
      throw_errno("--policy " + o.policy, err);
    spec.policy_source = o.policy;
  }
  for (const auto& file : o.ca_certs) spec.ca_certs.push_back(spec::read_ca_cert(file));
  spec.no_keep = o.no_keep;
  if (o.name_given) check_name(o.name);
  spec.validate();  // bad input stops here, before the gateway
  if (o.from != "host" && !directory) ensure_image(o.from, o.insecure, "--from");

  GatewayClient client;
  json body = {{"spec", json::parse(spec.to_json())}};
  if (!o.name.empty()) body["name"] = o.name;
  json sandbox = client.call("POST", "/v1/sandboxes?wait=ready", body.dump());
  const std::string name = sandbox.value("name", "");
  if (!o.no_keep) remember(client.paths(), name);

  if (sandbox.contains("storage_note")) log::warn(sandbox.value("storage_note", ""));
  if (launch_failed(sandbox)) {
    log::error("sandbox '" + name + "' failed to start: " + why(sandbox));
    return exit_status_of(sandbox);
  }
  // With a main process (the caller's, or the image's), show its output.
  if (!sandbox.value("command", json::array()).empty() && !o.detach) {
    // Show the main process's output and end with its status.
    LogEnd end = follow_logs(client.paths(), name, LogOptions{});
    if (end.exit_code) return *end.exit_code;
    if (end.phase == "Stopped") return 128 + 15;
    return exit_code::kFailure;
  }
  if (o.output == "json")
    print_sandbox(sandbox, "json");
  else
    std::printf("%s\n", name.c_str());
  return 0;
}

}  // namespace

void add_sandbox_commands(CLI::App& app, Action* action) {
  CLI::App* sandbox =
      app.add_subcommand("sandbox", "Create and manage long-lived sandboxes (through the gateway)");
  sandbox->require_subcommand(1);

  // create
  {
    auto o = std::make_shared<CreateOptions>();
    CLI::App* c = sandbox->add_subcommand("create", "Create a sandbox and start its main process");
    c->positionals_at_end();
    CLI::Option* name_option =
        c->add_option("--name", o->name, "Its name, a DNS label (default: generated)");
    c->add_option("--from", o->from,
                  "Its root: an image (pulled when missing), a directory, or 'host' for the host's "
                  "/ read-only")
        ->capture_default_str();
    c->add_flag("--insecure", o->insecure,
                "Pull a missing --from image over plain HTTP (localhost registries use it anyway)");
    c->add_option("--policy", o->policy, "Policy file (TOML)");
    repeatable(c->add_option("-e,--env", o->env, "KEY=VALUE for its processes (repeatable)"));
    c->add_option("--cpu", o->cpu, "CPU limit, in CPUs (1.5 = one and a half)");
    c->add_option("-m,--memory", o->memory, "Memory limit, like 512M or 2G");
    c->add_option("--pids", o->pids,
                  "Most processes and threads at once (default 4096; 0: no limit)");
    c->add_option("--tmp-size", o->tmp_size,
                  "Size of /tmp, a memory file system (default: the --memory limit, else a tenth "
                  "of the RAM)");
    c->add_option("--shm-size", o->shm_size, "Size of /dev/shm (default: half of /tmp's default)");
    repeatable(c->add_option("--label", o->labels, "A label KEY=VALUE (repeatable)"));
    repeatable(c->add_option("--ca-cert", o->ca_certs,
                             "A PEM file of CA certificates its programs trust, added to its "
                             "system bundle and named by SSL_CERT_FILE and the like (repeatable)"));
    c->add_flag("--no-keep", o->no_keep, "Delete the sandbox once its main process exits");
    c->add_flag("-d,--detach", o->detach, "Return once it runs, without showing its output");
    add_output(c, &o->output);
    c->add_option(
        "command", o->command,
        "The main process (default: the image's entrypoint and command; none: the sandbox idles)");
    c->footer(
        "With a command and without --detach, create shows the main process's output and exits "
        "with its status.\nExamples:\n  openshell sandbox create --name demo -- echo hello\n"
        "  openshell sandbox create --name agent --from ./rootfs --memory 1G\nSee "
        "openshell-sandbox(1).");
    c->callback([o, action, name_option] {
      o->name_given = name_option->count() > 0;
      *action = [o] { return create(*o); };
    });
  }

  // get
  {
    auto name = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    CLI::App* c = sandbox->add_subcommand("get", "Show a sandbox");
    c->add_option("name", *name, "The sandbox (default: the last one named)");
    add_output(c, output.get());
    c->callback([name, output, action] {
      *action = [name, output] {
        GatewayClient client;
        *name = sandbox_name(client.paths(), *name);
        json sandbox = client.call("GET", target(*name));
        print_sandbox(sandbox, *output);
        if (*output != "json") {
          // What happened to it lately, as `kubectl describe` shows.
          json events = client.call("GET", target(*name, "events") + "?limit=10")
                            .value("events", json::array());
          std::printf("Events:%s\n", events.empty() ? " none" : "");
          for (const auto& e : events)
            std::printf("  %s  %s  %s\n", e.value("time", "").c_str(), e.value("type", "").c_str(),
                        e.value("message", "").c_str());
        }
        return 0;
      };
    });
  }

  // list
  {
    auto output = std::make_shared<std::string>("table");
    auto selector = std::make_shared<std::string>();
    CLI::App* c = sandbox->add_subcommand("list", "List the sandboxes");
    c->alias("ls");
    c->add_option("--selector,-l", *selector, "Only those with label KEY=VALUE (or KEY)");
    add_output(c, output.get());
    c->callback([output, selector, action] {
      *action = [output, selector] {
        GatewayClient client;
        std::string path = "/v1/sandboxes";
        if (!selector->empty()) path += "?selector=" + net::percent_encode(*selector);
        print_sandboxes(client.call("GET", path)["sandboxes"], *output);
        return 0;
      };
    });
  }

  // start / stop
  for (const char* verb : {"start", "stop"}) {
    auto name = std::make_shared<std::string>();
    auto output = std::make_shared<std::string>("table");
    std::string what =
        std::string(verb) == "start"
            ? "Start a sandbox again (from Stopped, Completed or Error) and wait until it runs"
            : "Stop a sandbox's processes, keeping its workspace, and wait until they are gone";
    CLI::App* c = sandbox->add_subcommand(verb, what);
    c->add_option("name", *name, "The sandbox (default: the last one named)");
    add_output(c, output.get());
    std::string v = verb;
    c->callback([name, output, action, v] {
      *action = [name, output, v] {
        GatewayClient client;
        *name = sandbox_name(client.paths(), *name);
        json s = client.call("POST", target(*name, v));
        if (*output == "json") {
          print_sandbox(s, "json");
        } else {
          std::printf("%s: %s\n", s.value("name", "").c_str(), s.value("phase", "").c_str());
        }
        // The start failed only if the launch did; a main process that
        // ended at once is the sandbox's business (see its phase).
        if (v == "start" && launch_failed(s)) {
          log::error("sandbox '" + *name + "' failed to start: " + why(s));
          return exit_code::kFailure;
        }
        return 0;
      };
    });
  }

  // delete
  {
    auto names = std::make_shared<std::vector<std::string>>();
    auto all = std::make_shared<bool>(false);
    CLI::App* c =
        sandbox->add_subcommand("delete", "Delete sandboxes: their processes, files and state");
    c->alias("rm");
    c->add_option("names", *names, "The sandboxes");
    c->add_flag("--all", *all, "Every sandbox");
    c->callback([names, all, action] {
      *action = [names, all] {
        if (*all == !names->empty()) throw Error("sandbox delete: give names or --all (not both)");
        GatewayClient client;
        std::vector<std::string> targets = *names;
        if (*all) {
          json list = client.call("GET", "/v1/sandboxes");
          for (const auto& s : list["sandboxes"]) targets.push_back(s.value("name", ""));
        }
        int status = 0;
        for (const auto& n : targets) {
          try {
            client.call("DELETE", target(n));
            std::printf("%s\n", n.c_str());
          } catch (const Error& e) {
            log::error(e.what());
            status = exit_code::kFailure;
          }
        }
        return status;
      };
    });
  }

  // exec
  {
    auto name = std::make_shared<std::string>();
    auto o = std::make_shared<ExecOptions>();
    // Options may follow the name; the command follows "--".
    auto name_flag = std::make_shared<std::string>();
    CLI::App* c = sandbox->add_subcommand("exec", "Run a command in a running sandbox");
    c->add_option("name", *name, "The sandbox (or give it with -n)");
    c->add_option("-n", *name_flag,
                  "The sandbox, as OpenShell's exec takes it: exec -n NAME -- CMD");
    c->add_flag("-t,--tty", o->tty, "Give the command a pseudo-terminal");
    repeatable(
        c->add_option("-e,--env", o->env, "KEY=VALUE added to its environment (repeatable)"));
    c->add_option("-w,--workdir", o->workdir,
                  "Its working directory (default: the image's WorkingDir, else /sandbox)");
    c->add_option("--timeout", o->timeout_s, "Kill it after this many seconds (exit status 124)");
    c->add_option("command", o->argv, "The command and its arguments")->required();
    c->footer(
        "The exit status is the command's own.\nExample: openshell sandbox exec demo -- ls -l");
    c->callback([name, name_flag, o, action] {
      // With -n NAME, the first positional word is the command's.
      if (!name_flag->empty()) {
        if (!name->empty()) o->argv.insert(o->argv.begin(), *name);
        *name = *name_flag;
      }
      if (name->empty())
        throw CLI::ValidationError("name",
                                   "no sandbox named (exec NAME -- CMD, or exec -n NAME -- CMD)");
      // After the name, CLI11 keeps a "--" as a word of the command.
      if (!o->argv.empty() && o->argv.front() == "--") o->argv.erase(o->argv.begin());
      if (o->argv.empty()) throw CLI::ValidationError("command", "no command given");
      // -e KEY passes the caller's value (as `run` does); a terminal gets TERM.
      std::vector<std::string> env;
      for (const auto& entry : o->env) {
        if (entry.find('=') != std::string::npos) {
          env.push_back(entry);
        } else if (const char* value = std::getenv(entry.c_str())) {
          env.push_back(entry + "=" + value);
        }
      }
      if (o->tty && std::none_of(env.begin(), env.end(),
                                 [](const std::string& e) { return e.rfind("TERM=", 0) == 0; })) {
        const char* term = std::getenv("TERM");
        env.push_back(std::string("TERM=") + (term && *term ? term : "xterm"));
      }
      o->env = env;
      *action = [name, o] {
        GatewayClient client;
        require_ready(client, *name, "exec");
        return exec(client.paths(), *name, *o);
      };
    });
  }

  // upload, download
  {
    auto name = std::make_shared<std::string>();
    auto local = std::make_shared<std::string>();
    auto dest = std::make_shared<std::string>("/sandbox");
    CLI::App* c =
        sandbox->add_subcommand("upload", "Copy a file or directory into a running sandbox");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("local", *local, "A file, directory or symbolic link on this machine")
        ->required();
    c->add_option("dest", *dest, "The directory in the sandbox it goes into")
        ->capture_default_str();
    c->footer(
        "Copied as the sandbox's user, under its own name, through tar in the sandbox; its policy "
        "applies (by default only /sandbox and /tmp are writable).\n"
        "Example: openshell sandbox upload demo ./src            # becomes /sandbox/src");
    c->callback([name, local, dest, action] {
      *action = [name, local, dest] {
        GatewayClient client;
        require_ready(client, *name, "upload");
        return upload(client.paths(), *name, *local, *dest);
      };
    });
  }
  {
    auto name = std::make_shared<std::string>();
    auto remote = std::make_shared<std::string>();
    auto local = std::make_shared<std::string>(".");
    CLI::App* c =
        sandbox->add_subcommand("download", "Copy a file or directory out of a running sandbox");
    c->add_option("name", *name, "The sandbox")->required();
    c->add_option("remote", *remote, "An absolute path in the sandbox")->required();
    c->add_option("local", *local,
                  "The directory here it goes into (it must not have that name yet)")
        ->capture_default_str();
    c->footer(
        "Read as the sandbox's user through tar in the sandbox; what arrives is unpacked like an "
        "untrusted archive and appears only when complete.\n"
        "Example: openshell sandbox download demo /sandbox/out ./results");
    c->callback([name, remote, local, action] {
      *action = [name, remote, local] {
        GatewayClient client;
        require_ready(client, *name, "download");
        return download(client.paths(), *name, *remote, *local);
      };
    });
  }

  // logs (also `openshell logs`)
  auto add_logs = [action](CLI::App* parent, const char* help) {
    auto name = std::make_shared<std::string>();
    auto lines = std::make_shared<std::string>("all");
    auto follow = std::make_shared<bool>(false);
    auto timestamps = std::make_shared<bool>(false);
    auto source = std::make_shared<std::string>("sandbox");
    CLI::App* c = parent->add_subcommand("logs", help);
    c->add_option(
         "--source", *source,
         "sandbox (the main process's output) or network (the egress decisions, JSON lines)")
        ->check(CLI::IsMember({"sandbox", "network"}))
        ->capture_default_str();
    c->add_option("name", *name, "The sandbox (default: the last one named)");
    c->add_option("-n,--tail", *lines, "Only the last N lines (default all)");
    c->add_flag("-f,--follow", *follow, "Keep printing as the main process writes, until it ends");
    c->add_flag("--timestamps", *timestamps, "Prefix each line with its time");
    c->callback([=] {
      *action = [=] {
        if (*lines != "all" && !text::parse_uint(*lines))
          throw Error("--tail " + *lines + ": not a number");
        GatewayClient client;
        *name = sandbox_name(client.paths(), *name);
        if (*follow) {
          follow_logs(client.paths(), *name, LogOptions{*lines, *timestamps, *source});
          return 0;
        }
        std::string path = target(*name, "logs") + "?source=" + *source;
        if (*lines != "all") path += "&tail=" + *lines;
        std::string body = client.call_text("GET", path);
        if (*source == "network") {
          std::fwrite(body.data(), 1, body.size(), stdout);
          return 0;
        }
        std::string carry;
        print_records(body, *timestamps, &carry);
        return 0;
      };
    });
  };
  add_logs(sandbox, "Print a sandbox's main process output");
  add_logs(&app, "Print a sandbox's main process output (same as 'sandbox logs')");
}

void add_gateway_commands(CLI::App& app, Action* action) {
  CLI::App* gateway =
      app.add_subcommand("gateway", "The local control plane that keeps the sandboxes");
  gateway->require_subcommand(1);
  auto ready_fd = std::make_shared<int>(-1);
  CLI::App* run = gateway->add_subcommand(
      "run", "Run the gateway in the foreground (the CLI starts one when needed)");
  run->add_option("--ready-fd", *ready_fd, "")->group("");  // for the CLI's auto-start
  run->callback([action, ready_fd] { *action = [ready_fd] { return gateway::run(*ready_fd); }; });

  auto output = std::make_shared<std::string>("table");
  CLI::App* status = gateway->add_subcommand("status", "Say whether the gateway runs, and where");
  add_output(status, output.get());
  status->callback([output, action] {
    *action = [output] {
      json info;
      try {
        GatewayClient client(false);
        info = client.call("GET", "/v1/gateway");
      } catch (const Error& e) {
        if (*output == "json")
          std::printf("%s\n", json{{"running", false}, {"error", e.what()}}.dump(2).c_str());
        else
          std::printf("gateway: not running (%s)\n", e.what());
        return 1;
      }
      info["running"] = true;
      if (*output == "json") {
        std::printf("%s\n", info.dump(2).c_str());
      } else {
        std::printf("gateway: running (pid %d, version %s)\n", info.value("pid", 0),
                    info.value("version", "").c_str());
        std::printf("socket: %s\nstate: %s\nsandboxes: %d\nsince: %s\n",
                    info.value("socket", "").c_str(), info.value("state_dir", "").c_str(),
                    info.value("sandboxes", 0), info.value("started_at", "").c_str());
      }
      return 0;
    };
  });

  gateway->add_subcommand("stop", "Stop the gateway (sandboxes keep running)")->callback([action] {
    *action = [] {
      int pid = 0;
      try {
        GatewayClient client(false);
        pid = client.call("GET", "/v1/gateway").value("pid", 0);
        client.call("POST", "/v1/gateway/stop");
      } catch (const Error& e) {
        std::printf("gateway: not running\n");
        return 0;
      }
      // Wait until it has exited (a pidfd says so even before it is reaped).
      int fd = pid > 0 ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)) : -1;
      if (fd >= 0) {
        pollfd p{fd, POLLIN, 0};
        ::poll(&p, 1, 10000);
        ::close(fd);
      }
      std::printf("gateway: stopped\n");
      return 0;
    };
  });

  // The supervisor: started by the gateway, not by people.
  auto launch = std::make_shared<std::string>();
  CLI::App* sup = app.add_subcommand("supervisor", "");
  sup->group("");  // hidden
  sup->add_option("--launch", *launch, "The launch file")->required();
  sup->callback([launch, action] { *action = [launch] { return supervisor::main(*launch); }; });
}

}  // namespace openshell::cli
