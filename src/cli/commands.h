// Each command adds itself to the tree and runs when chosen.
#pragma once

#include <functional>
#include <string_view>

namespace CLI {
class App;
}

namespace openshell::cli {

// The chosen command's action; returns the exit status.
using Action = std::function<int()>;

// `openshell run`: a one-shot sandbox, no daemon.
void add_run_command(CLI::App& app, Action* action);

// `openshell sandbox ...` and `openshell logs`. With `only` (a sandbox
// subcommand's name or alias), that subcommand alone: see app.cc.
void add_sandbox_commands(CLI::App& app, Action* action, std::string_view only = {});

// `openshell policy ...`.
void add_policy_commands(CLI::App& app, Action* action);

// `openshell provider ...`.
void add_provider_commands(CLI::App& app, Action* action);

// `openshell forward ...`.
void add_forward_commands(CLI::App& app, Action* action);

// `openshell image ...`.
void add_image_commands(CLI::App& app, Action* action);
// `openshell image push`, below `image`.
void add_image_push_command(CLI::App* images, Action* action);

// `openshell image build`, below `image`.
void add_image_build_command(CLI::App* images, Action* action);

// `openshell gateway ...` (and the supervisor's hidden entry).
void add_gateway_commands(CLI::App& app, Action* action);

// `openshell gateway add|list|select|info|remove`, below `gateway`.
void add_gateway_registry_commands(CLI::App* gateway, Action* action);

// `openshell doctor check`.
void add_doctor_command(CLI::App& app, Action* action);

// `openshell completions bash|zsh|fish` (and the scripts' hidden
// `__complete`).
void add_completion_commands(CLI::App& app, Action* action);

// `openshell status`.
void add_status_command(CLI::App& app, Action* action);

// The hidden `openshell __vmm`: one confined micro-VM.
void add_vmm_command(CLI::App& app, Action* action);

// The hidden `openshell __guest-initramfs`: a micro-VM's initramfs.
void add_guest_commands(CLI::App& app, Action* action);

}  // namespace openshell::cli
