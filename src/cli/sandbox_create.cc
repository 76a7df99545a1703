// openshell sandbox create: a sandbox from an image, a directory or the host,
// and its main process.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "cli/connect.h"
#include "cli/copy.h"
#include "cli/env_file.h"
#include "cli/forwards.h"
#include "cli/gateway_client.h"
#include "cli/images.h"
#include "cli/run_options.h"
#include "cli/sandbox_common.h"
#include "cli/sandbox_lifecycle.h"
#include "cli/streams.h"
#include "spec/ca_certs.h"
#include "spec/sandbox_spec.h"

namespace openshell::cli {

using nlohmann::json;

namespace {

void check_name(const std::string& name) {
  if (!text::is_dns_label(name))
    throw Error("sandbox name '" + name +
                "': must be a DNS label (a-z, 0-9 and '-', at most 63, not starting or ending "
                "with '-')");
}

// Ctrl-C while create shows the main process's output ends only this
// command: the sandbox runs on. Say so, and how to end it (written from
// the signal handler: prepared beforehand, one write, _exit).
std::string g_interrupt_hint;

void on_interrupt(int) {
  (void)!::write(STDERR_FILENO, g_interrupt_hint.data(), g_interrupt_hint.size());
  ::_exit(128 + SIGINT);
}

void hint_on_interrupt(const std::string& name) {
  g_interrupt_hint = "\nopenshell: sandbox '" + name +
                     "' keeps running; stop it with 'openshell sandbox stop " + name +
                     "', or remove it with 'openshell sandbox delete " + name + "'\n";
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  ::sigemptyset(&action.sa_mask);
  ::sigaction(SIGINT, &action, nullptr);
}

struct CreateOptions {
  std::string name, from = "base", policy, cpu, memory, pids, tmp_size, shm_size, user,
                    output = "table", restart, vm_kernel;
  std::vector<std::string> env, env_files, binds, labels, command, ca_certs, providers, uploads,
      forwards;
  bool git_ignore = true;
  bool no_keep = false, detach = false, insecure = false, vm = false;
  bool name_given = false;  // --name, even an empty one
  std::optional<bool> tty;  // --tty / --no-tty; unset: whether stdin is a terminal
  std::string detach_keys = kDefaultDetachKeys;
  std::string gpu;  // --gpu: "all" or N; "": none
};

// --upload LOCAL[:DEST]: DEST is a directory of the sandbox (absolute), the
// default /sandbox; a LOCAL with a colon of its own is given with :DEST.
std::pair<std::string, std::string> parse_upload(const std::string& text) {
  std::string local = text, dest = "/sandbox";
  if (auto colon = text.rfind(':');
      colon != std::string::npos && colon + 1 < text.size() && text[colon + 1] == '/') {
    local = text.substr(0, colon);
    dest = text.substr(colon + 1);
  } else if (!text.empty() && text.back() == ':') {
    throw Error("--upload " + text + ": an empty destination (LOCAL[:DEST], DEST absolute)");
  }
  struct stat st;
  if (local.empty() || ::lstat(local.c_str(), &st) != 0)
    throw Error("--upload " + text + ": " + (local.empty() ? "empty" : local) +
                ": no such file or directory");
  return {local, dest};
}

// The files of --upload, into a sandbox made without a start; then its
// start. A failed copy deletes the sandbox: the create did not happen.
json upload_then_start(GatewayClient& client, const std::string& name, const CreateOptions& o) {
  UploadOptions options;
  options.git_ignore = o.git_ignore;
  options.summary_fd = STDERR_FILENO;  // stdout is the sandbox's name, for scripts
  for (const auto& text : o.uploads) {
    const auto [local, dest] = parse_upload(text);
    try {
      upload(client, name, local, dest, options);
    } catch (const Error& e) {
      try {
        client.call("DELETE", target(name));
      } catch (const Error&) {
        log::warn("sandbox '" + name + "' could not be removed after the failed upload");
      }
      std::string why = e.what();
      if (why.rfind("upload: ", 0) == 0) why.erase(0, 8);
      throw Error("--upload " + text + ": " + why + " (sandbox '" + name + "' was not created)");
    }
  }
  return launch_call(client, "start", target(name, "start"));
}

int create(const CreateOptions& o) {
  // A remote gateway cannot read this machine's files: what only names
  // them (a directory, a bind's source) is refused before anything starts.
  // A gateway on loopback, TLS or not, is on this host and reads them.
  GatewayChoice gateway = chosen_gateway();
  const bool remote = gateway.remote();
  if (remote && o.from != "host" && (looks_like_path(o.from) || files::is_directory(o.from)))
    throw Error("--from " + o.from +
                ": a remote gateway cannot read this machine's directories; push an image to a "
                "registry instead");
  if (remote && !o.binds.empty())
    throw Error("--bind " + o.binds.front() +
                ": a remote gateway cannot bind this machine's paths (its sandboxes see only "
                "its own host's)");
  SandboxSpec spec;
  // A directory, else an image (pulled now when the store lacks it).
  spec.from = o.from;
  const bool directory = o.from != "host" && files::is_directory(o.from);
  if (directory) spec.from = files::canonical(o.from, "--from");
  if (!directory && looks_like_path(o.from)) {
    struct stat st;
    throw Error("--from " + o.from +
                (::stat(o.from.c_str(), &st) == 0
                     ? ": not a directory (an image archive is imported with 'openshell image "
                       "import FILE NAME')"
                     : ": no such directory"));
  }
  spec.command = o.command;
  spec.env = environment_entries(o.env_files, o.env);
  // A terminal by default when there is one to attach; never for a VM's
  // main process, which runs on the guest's console.
  spec.tty = o.tty.value_or(!o.vm && ::isatty(STDIN_FILENO));
  if (spec.tty && std::none_of(spec.env.begin(), spec.env.end(),
                               [](const std::string& e) { return e.rfind("TERM=", 0) == 0; })) {
    const char* term = std::getenv("TERM");
    spec.env.push_back(std::string("TERM=") + (term && *term ? term : "xterm"));
  }
  spec.user = o.user;
  // Each bind's source as it is now: a missing one is refused here.
  for (const auto& text : o.binds) {
    const namespaces::BindSpec b = parse_bind(text);
    if (!files::exists(b.source))
      throw Error("--bind " + text + ": " + b.source + ": no such file or directory");
    spec.binds.push_back({files::canonical(b.source, "--bind " + text), b.target, b.read_only});
  }
  if (!o.vm) {
    if (!o.cpu.empty()) spec.cpus = limits::parse_cpus("--cpu", o.cpu);
    if (!o.memory.empty()) spec.memory_bytes = limits::parse_memory("--memory", o.memory);
  }
  spec.pids = parse_pids(o.pids);
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
  // A VM's --cpu and --memory are its guest's; its kernel is a file of the
  // gateway's host: found here when that is this one, else by the gateway.
  if (!o.vm_kernel.empty() && !o.vm) throw Error("--vm-kernel: only with --vm");
  // What a micro-VM cannot honour yet is refused, never dropped.
  if (o.vm && !o.binds.empty())
    throw Error("--bind " + o.binds.front() + ": not with --vm (a micro-VM sees only its disks)");
  if (o.vm && !o.ca_certs.empty())
    throw Error("--ca-cert " + o.ca_certs.front() + ": not with --vm yet");
  if (o.vm)
    spec.vm =
        plan_vm("--cpu", o.cpu, o.memory, spec.policy, spec.policy_source, o.vm_kernel, !remote);
  spec.gpu = o.gpu;  // validate() refuses a bad value, and one with --vm
  spec.no_keep = o.no_keep;
  spec.restart = o.restart;
  if (o.name_given) check_name(o.name);
  for (const auto& text : o.uploads) parse_upload(text);
  spec.validate();  // bad input stops here, before the gateway
  // The image goes into the store of the gateway's host when that is this
  // one; a remote gateway's store is its own (the gateway says what it lacks).
  if (o.from != "host" && !directory && !remote) {
    if (gateway.local_default())
      ensure_image(o.from, o.insecure, "--from");
    else
      ensure_image_in(chosen_images_dir(), o.from, o.insecure, "--from");
  }

  GatewayClient client(gateway, true);
  json body = {{"spec", json::parse(spec.to_json())}};
  if (!o.name.empty()) body["name"] = o.name;
  if (!o.providers.empty()) body["providers"] = o.providers;
  // With files to copy in, it starts once they are there.
  if (!o.uploads.empty()) body["start"] = false;
  for (const auto& f : o.forwards) body["forwards"].push_back(parse_forward(f, "--forward " + f));
  json sandbox;
  try {
    sandbox = launch_call(client, "create", "/v1/sandboxes?wait=ready", body.dump());
  } catch (const GatewayError& e) {
    if (!remote || e.code() != "image_not_found") throw;
    throw Error("--from " + o.from + ": " + gateway.describe() +
                " has no such image, and a remote gateway cannot use this machine's images: "
                "pull it on the gateway's host, or push it to a registry and pull it there");
  }
  const std::string name = sandbox.value("name", "");
  if (!o.uploads.empty()) sandbox = upload_then_start(client, name, o);
  const auto ready_at = std::chrono::steady_clock::now();
  if (!o.no_keep) remember(client.paths(), name);

  if (sandbox.contains("storage_note")) log::warn(sandbox.value("storage_note", ""));
  if (launch_failed(sandbox)) {
    log::error("sandbox '" + name + "' failed to start: " + why(sandbox));
    return exit_status_of(sandbox);
  }
  if (!o.forwards.empty()) warn_about_forwards(client, name);
  // With a terminal, this one is attached to it (Ctrl-P Ctrl-Q detaches).
  if (spec.tty && !o.detach) {
    ConnectOptions connect;
    connect.detach_keys = o.detach_keys;
    try {
      return connect_console(client, name, connect);
    } catch (const Error&) {
      // A main process that ended before the attach (and its supervisor
      // with it): its output is all in the log.
      const std::string phase = client.call("GET", target(name)).value("phase", "");
      if (phase != "Completed" && phase != "Error") throw;
      LogEnd end = follow_logs(client, name, LogOptions{});
      if (end.exit_code) return *end.exit_code;
      return exit_code::kFailure;
    }
  }
  // With a main process (the caller's, or the image's), show its output.
  if (!sandbox.value("command", json::array()).empty() && !o.detach) {
    // Show the main process's output and end with its status.
    hint_on_interrupt(name);
    LogEnd end = follow_logs(client, name, LogOptions{});
    if (o.command.empty()) warn_if_it_exited_at_once(sandbox, end, ready_at);
    if (end.exit_code) return *end.exit_code;
    if (end.phase == "Stopped") return 128 + 15;
    return exit_code::kFailure;
  }
  if (o.command.empty() && !sandbox.value("command", json::array()).empty())
    warn_if_it_exits_at_once(client, sandbox);
  if (o.output == "json")
    print_sandbox(sandbox, "json");
  else
    std::printf("%s\n", name.c_str());
  return 0;
}

}  // namespace

void add_sandbox_create(CLI::App* sandbox, Action* action) {
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
  c->add_option("-u,--user", o->user, kUserHelp);
  repeatable(
      c->add_option("-e,--env", o->env,
                    "KEY=VALUE for its processes, or KEY for the caller's value (repeatable)"));
  repeatable(c->add_option("--env-file", o->env_files,
                           "A file of KEY=VALUE lines, as docker reads it (repeatable; -e wins)"));
  repeatable(c->add_option("-v,--bind", o->binds,
                           "Bind-mount a host path at every start: SRC:DST[:ro] (repeatable)"));
  c->add_option("--cpu,--cpus", o->cpu,
                "CPU limit, in CPUs: 1.5 = one and a half, 500m = half of one");
  add_size_limit_options(c, &o->memory, &o->pids, &o->tmp_size, &o->shm_size);
  repeatable(c->add_option("--label", o->labels, "A label KEY=VALUE (repeatable)"));
  repeatable(c->add_option("--provider", o->providers,
                           "A provider (see 'openshell provider'): its credentials' placeholders "
                           "in the environment, KEY=openshell:resolve:env:KEY (repeatable)"));
  repeatable(c->add_option("--ca-cert", o->ca_certs,
                           "A PEM file of CA certificates its programs trust, added to its "
                           "system bundle and named by SSL_CERT_FILE and the like (repeatable)"));
  repeatable(c->add_option("--upload", o->uploads,
                           "Copy LOCAL (a file or directory) into DEST (default /sandbox) before "
                           "the main process starts: LOCAL[:DEST] (repeatable)"));
  c->add_flag("!--no-git-ignore", o->git_ignore,
              "With --upload, copy everything, also what .gitignore leaves out");
  repeatable(c->add_option("--forward", o->forwards,
                           "Forward the host's [BIND:]PORT (BIND default 127.0.0.1) to its "
                           "127.0.0.1:PORT, as 'openshell forward start' does (repeatable)"));
  c->add_flag("--no-keep", o->no_keep, "Delete the sandbox once its main process exits");
  c->add_option("--restart", o->restart,
                "Start it again when the gateway starts and finds it gone (the host came back): "
                "no, on-failure or unless-stopped (default)")
      ->check(CLI::IsMember({"no", "on-failure", "unless-stopped"}));
  c->add_flag("--vm", o->vm,
              "Run it in a micro-VM booting its image's root (needs /dev/kvm and a guest "
              "kernel): --memory is the guest's RAM, --cpu its vCPUs (rounded up; default: the "
              "policy's [vm], else 1 vCPU and 512M)");
  c->add_option("--vm-kernel", o->vm_kernel,
                "The guest kernel for --vm (default: $OPENSHELL_VM_KERNEL, else "
                "/usr/lib/openshell/vmlinux)");
  add_gpu_option(c, &o->gpu);
  c->add_flag("-d,--detach", o->detach,
              "Return once it runs, without showing its output or attaching to its terminal");
  c->add_flag_function(
      "-t,--tty,!--no-tty", [o](int64_t count) { o->tty = count > 0; },
      "Give the main process a pseudo-terminal, which this command (unless --detach) and "
      "'sandbox connect' attach to; without a command it is a login shell (default: when stdin "
      "is a terminal)");
  c->add_option("--detach-keys", o->detach_keys,
                "The keys that detach from its terminal (see 'sandbox connect')")
      ->capture_default_str();
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
    try {
      parse_detach_keys(o->detach_keys);  // bad keys stop here, before the gateway
    } catch (const Error& e) {
      throw CLI::ValidationError(e.what());
    }
    *action = [o] { return create(*o); };
  });
}

}  // namespace openshell::cli
