// Helpers of the `openshell sandbox` subcommands (see sandbox_common.h).
#include "cli/sandbox_common.h"

#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <set>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "base/time.h"
#include "base/unique_fd.h"
#include "cli/gateway_client.h"
#include "cli/gateway_registry.h"
#include "cli/table.h"
#include "net/http.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

// One a gateway: the last sandbox named on one gateway names nothing on
// another. The local gateway's keeps the name it always had.
std::string last_used_file(const Paths& paths) {
  std::string file = paths.state_dir + "/last-sandbox";
  GatewayChoice gateway;
  try {
    gateway = chosen_gateway();
  } catch (const Error&) {
    return file;  // the command itself says what is wrong with the choice
  }
  if (gateway.local_default()) return file;
  std::string key = gateway.name.empty() ? "url-" + gateway.endpoint.url() : "gw-" + gateway.name;
  for (char& c : key)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_') c = '_';
  return file + "." + key;
}

std::string sandbox_age(const std::string& rfc3339) {
  auto then = time::parse(rfc3339);
  return then ? time::short_age((time::now_ns() - *then) / 1000000000) : "?";
}

std::string command_text(const json& sandbox) {
  std::vector<std::string> words = sandbox.value("command", std::vector<std::string>{});
  return words.empty() ? "-" : text::join(words, " ");
}

std::string exit_text(const json& sandbox) {
  return sandbox.contains("exit_code") ? std::to_string(sandbox["exit_code"].get<int>()) : "-";
}

// "team=x,tier=web" (in key order), or "-".
std::string labels_text(const json& sandbox) {
  std::string labels;
  const json label_map = sandbox.value("labels", json::object());
  for (const auto& [k, v] : label_map.items())
    labels += (labels.empty() ? "" : ",") + k + "=" + v.get<std::string>();
  return labels.empty() ? "-" : labels;
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

}  // namespace

CLI::Option* add_output(CLI::App* app, std::string* output) {
  return app->add_option("-o,--output", *output, "Output format: table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
}

void remember(const Paths& paths, const std::string& name) {
  const std::string file = last_used_file(paths);
  // Most commands name the sandbox the last one did: nothing to write.
  if (files::try_read(file).value_or("") == name + "\n") return;
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

std::string target(const std::string& name, const std::string& action) {
  return "/v1/sandboxes/" + net::percent_encode(name) + (action.empty() ? "" : "/" + action);
}

// For the commands that run something in the sandbox (exec, upload,
// download): it must be Ready; it becomes the last one named.
namespace {

// The sandbox's phase is one of `phases`, else Error: "sandbox 'x' is
// Starting (VERB needs NEEDS)".
void require_phase(GatewayClient& client, const std::string& name,
                   const std::vector<std::string>& phases, const std::string& needs) {
  json s = client.call("GET", target(name));
  const std::string phase = s.value("phase", "");
  if (std::find(phases.begin(), phases.end(), phase) == phases.end())
    throw Error("sandbox '" + name + "' is " + phase + " (" + needs + ")");
  remember(client.paths(), name);
}

}  // namespace

void require_ready(GatewayClient& client, const std::string& name, const std::string& verb) {
  require_phase(client, name, {"Ready"},
                verb + " needs a Ready sandbox; see 'openshell sandbox start'");
}

void require_copyable(GatewayClient& client, const std::string& name, const std::string& verb) {
  require_phase(client, name, {"Ready", "Stopped", "Completed", "Error"},
                verb + " needs a Ready, Stopped, Completed or Error sandbox");
}

bool looks_like_path(const std::string& word) {
  return word == "." || word == ".." || word.rfind("/", 0) == 0 || word.rfind("./", 0) == 0 ||
         word.rfind("../", 0) == 0 || word.rfind("~", 0) == 0;
}

bool only_table_fields(int depth, json::parse_event_t event, json& parsed) {
  // A sandbox's own keys are at depth 3: inside the answer's object, its
  // "sandboxes" array and the sandbox's object.
  if (event != json::parse_event_t::key || depth != 3) return true;
  static const std::set<std::string, std::less<>> kShown = {"name",       "owner",     "phase",
                                                            "generation", "exit_code", "created_at",
                                                            "from",       "labels",    "command"};
  return kShown.count(parsed.get_ref<const std::string&>()) != 0;
}

void print_sandboxes(const json& list, const std::string& output, bool owners) {
  if (output == "json") {
    std::printf("%s\n", list.dump(2).c_str());
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "PHASE", "GEN", "EXIT", "AGE", "FROM", "LABELS", "COMMAND"}};
  if (owners) rows[0].insert(rows[0].begin() + 1, "OWNER");
  for (const auto& s : list) {
    rows.push_back({s.value("name", ""), s.value("phase", ""),
                    std::to_string(s.value("generation", 0)), exit_text(s),
                    sandbox_age(s.value("created_at", "")), s.value("from", ""), labels_text(s),
                    command_text(s)});
    if (owners) rows.back().insert(rows.back().begin() + 1, s.value("owner", ""));
  }
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

void print_sandbox(const json& s, const std::string& output) {
  if (output == "json") {
    std::printf("%s\n", s.dump(2).c_str());
    return;
  }
  std::vector<std::vector<std::string>> rows = {
      {"Name:", s.value("name", "")},
      {"Id:", s.value("id", "")},
      {"Owner:", s.value("owner", "")},
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
      {"Restart:", s.value("restart", "unless-stopped")},
      {"Created:", s.value("created_at", "")}};
  if (const std::string labels = labels_text(s); labels != "-") rows.push_back({"Labels:", labels});
  if (s.contains("user")) rows.push_back({"User:", s.value("user", "")});
  for (const auto& b : s.value("binds", json::array()))
    rows.push_back({"Bind:", b.value("source", "") + ":" + b.value("target", "") +
                                 (b.value("read_only", false) ? ":ro" : "")});
  if (s.contains("vm") && s["vm"].is_object()) {
    const json& vm = s["vm"];
    const uint64_t vcpus = vm.value("vcpus", uint64_t{0});
    rows.push_back({"VM:", std::to_string(vcpus) + (vcpus == 1 ? " vCPU, " : " vCPUs, ") +
                               std::to_string(vm.value("memory_mib", uint64_t{0})) +
                               " MiB, kernel " + vm.value("kernel", "")});
  }
  if (s.contains("ca_certs"))
    rows.push_back({"CA certificates:", std::to_string(s.value("ca_certs", 0)) + " added"});
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

json launch_call(GatewayClient& client, const char* verb, const std::string& path,
                 const std::string& body) {
  if (!log::verbose()) return client.call("POST", path, body);
  const double sent_ms = log::elapsed_ms();
  json sandbox = client.call(
      "POST", path + (path.find('?') == std::string::npos ? "?" : "&") + "timings=1", body);
  std::string line =
      std::string(verb) + ": round trip " + text::format_ms(log::elapsed_ms() - sent_ms) + " ms";
  if (auto it = sandbox.find("timings"); it != sandbox.end() && it->is_array()) {
    line += "; in the gateway, ms since the request:";
    for (const auto& step : *it)
      line += " " + step.value("step", "?") + " " + text::format_ms(step.value("ms", 0.0)) + ",";
    line.pop_back();
    sandbox.erase(it);
  }
  log::debug(line);
  return sandbox;
}

}  // namespace openshell::cli
