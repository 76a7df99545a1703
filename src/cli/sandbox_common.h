// Shared by the `openshell sandbox` subcommands (one file each, see
// sandbox_commands.cc): options, the remembered sandbox name, API paths and
// how a sandbox is printed. Private to src/cli.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

#include "base/paths.h"
#include "cli/commands.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace openshell::cli {

// --user's help, the same on create and exec.
inline constexpr const char* kUserHelp =
    "Run as UID[:GID] or NAME[:GROUP] of the sandbox (default: the policy's run_as_user, the "
    "image's User, else 1000); root (0) only where the policy has process.allow_root = true";

class GatewayClient;

// A repeatable option takes one value per occurrence (defined with run's
// options, in run_command.cc: one definition for every command).
CLI::Option* repeatable(CLI::Option* option);

// --memory, --pids, --tmp-size and --shm-size, with one help text for run
// and sandbox create (also defined in run_command.cc).
void add_size_limit_options(CLI::App* app, std::string* memory, std::string* pids,
                            std::string* tmp_size, std::string* shm_size);

// --gpu [N|all] (a bare --gpu is all), the same on run and sandbox create
// (defined in run_command.cc).
void add_gpu_option(CLI::App* app, std::string* gpu);

// -o/--output table|json.
CLI::Option* add_output(CLI::App* app, std::string* output);

// The last sandbox a command named, for the commands that may leave the
// name out (get, start, stop, logs), as OpenShell's do. Best effort: a
// state directory that cannot be written only loses the convenience.
void remember(const Paths& paths, const std::string& name);

// `given`, remembered; else the one remembered. Throws Error when neither.
std::string sandbox_name(const Paths& paths, const std::string& given);

// The API path of a sandbox, or of one of its actions.
std::string target(const std::string& name, const std::string& action = "");

// For the commands that run something in the sandbox (exec, upload,
// download): it must be Ready; it becomes the last one named.
void require_ready(GatewayClient& client, const std::string& name, const std::string& verb);
// The same for a download or an upload, which also reach a sandbox that is
// Stopped, Completed or Error (its files as its run left them).
void require_copyable(GatewayClient& client, const std::string& name, const std::string& verb);

// Whether `word` can only be a path, never an image reference: "/x",
// "./x", "../x", "~/x", "." or "..".
bool looks_like_path(const std::string& word);

void print_sandboxes(const nlohmann::json& list, const std::string& output, bool owners = false);
// For GatewayClient::call's keep: of each sandbox in a list's answer
// ({"sandboxes": [...]}), only the fields print_sandboxes' table shows. A
// list of a thousand is about 640 KB of JSON, most of which a table never
// reads.
bool only_table_fields(int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed);
void print_sandbox(const nlohmann::json& sandbox, const std::string& output);

// The reason shown for a sandbox in Error.
std::string why(const nlohmann::json& sandbox);

// Whether the sandbox could not be launched at all (not: its main process
// ended, which is a result like any other).
bool launch_failed(const nlohmann::json& sandbox);
// POST of a launch (create, start): with -v the gateway is asked for its
// timings ("timings=1"), and one line says where the time went and what
// the round trip was; the answer is returned without them.
nlohmann::json launch_call(GatewayClient& client, const char* verb, const std::string& path,
                           const std::string& body = "");

// A finished sandbox's main process status as this command's exit status.
int exit_status_of(const nlohmann::json& sandbox);

// One subcommand each (sandbox_<name>.cc), added to `openshell sandbox`.
void add_sandbox_create(CLI::App* sandbox, Action* action);
void add_sandbox_get(CLI::App* sandbox, Action* action);
void add_sandbox_list(CLI::App* sandbox, Action* action);
void add_sandbox_start_stop(CLI::App* sandbox, Action* action);
void add_sandbox_delete(CLI::App* sandbox, Action* action);
void add_sandbox_exec(CLI::App* sandbox, Action* action);
void add_sandbox_connect(CLI::App* sandbox, Action* action);
void add_sandbox_upload(CLI::App* sandbox, Action* action);
void add_sandbox_download(CLI::App* sandbox, Action* action);
void add_sandbox_wait(CLI::App* sandbox, Action* action);
void add_sandbox_commit(CLI::App* sandbox, Action* action);
// `logs` below parent: `openshell sandbox logs` and `openshell logs`.
void add_logs_command(CLI::App* parent, const char* help, Action* action);

}  // namespace openshell::cli
