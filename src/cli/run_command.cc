#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>

#include "base/error.h"
#include "base/event_loop.h"
#include "base/log.h"
#include "base/logfile.h"
#include "base/paths.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "cli/commands.h"
#include "cli/images.h"
#include "cli/run_options.h"
#include "cli/stdio_relay.h"
#include "cli/terminal.h"
#include "egress/identity.h"
#include "egress/proxy.h"
#include "image/store.h"
#include "namespaces/id_pool.h"
#include "policy/policy.h"
#include "runtime/cgroup_reaper.h"
#include "runtime/container.h"
#include "runtime/landlock.h"
#include "runtime/private_paths.h"
#include "runtime/users.h"
#include "supervisor/network_rules.h"

namespace openshell::cli {

namespace asio = boost::asio;

namespace {

struct RlimitName {
  const char* name;
  int resource;
};

const RlimitName kRlimits[] = {
    {"as", RLIMIT_AS},           {"core", RLIMIT_CORE},         {"cpu", RLIMIT_CPU},
    {"data", RLIMIT_DATA},       {"fsize", RLIMIT_FSIZE},       {"locks", RLIMIT_LOCKS},
    {"memlock", RLIMIT_MEMLOCK}, {"msgqueue", RLIMIT_MSGQUEUE}, {"nice", RLIMIT_NICE},
    {"nofile", RLIMIT_NOFILE},   {"nproc", RLIMIT_NPROC},       {"rss", RLIMIT_RSS},
    {"rtprio", RLIMIT_RTPRIO},   {"rttime", RLIMIT_RTTIME},     {"sigpending", RLIMIT_SIGPENDING},
    {"stack", RLIMIT_STACK},
};

rlim_t parse_rlimit_value(const std::string& value, const std::string& option) {
  if (value == "unlimited") return RLIM_INFINITY;
  auto number = text::parse_uint(value);
  if (!number)
    throw Error("--rlimit " + option + ": '" + value + "' is not a number or 'unlimited'");
  return static_cast<rlim_t>(*number);
}

}  // namespace

std::optional<uint64_t> parse_tmpfs_size(const std::string& option, const std::string& value) {
  if (value.empty()) return std::nullopt;
  auto bytes = text::parse_size(value);
  if (!bytes) throw Error(option + " " + value + ": not a size (like 256M or 1G)");
  if (*bytes < limits::kMinTmpfsSize)
    throw Error(option + " " + value + ": below the minimum of 1M");
  return bytes;
}

namespaces::BindSpec parse_bind(const std::string& text) {
  auto parts = text::split(text, ':');
  namespaces::BindSpec bind;
  if (parts.size() == 3) {
    if (parts[2] == "ro")
      bind.read_only = true;
    else if (parts[2] != "rw")
      throw Error("--bind " + text + ": the third part must be 'ro' or 'rw'");
  } else if (parts.size() != 2) {
    throw Error("--bind " + text + ": expected SRC:DST or SRC:DST:ro");
  }
  if (parts[0].empty() || parts[1].empty()) throw Error("--bind " + text + ": empty path");
  if (parts[1][0] != '/') throw Error("--bind " + text + ": the destination must be absolute");
  bind.source = parts[0];
  bind.target = parts[1];
  return bind;
}

runtime::Rlimit parse_rlimit(const std::string& text) {
  auto eq = text.find('=');
  if (eq == std::string::npos) throw Error("--rlimit " + text + ": expected NAME=SOFT[:HARD]");
  std::string name = text.substr(0, eq), value = text.substr(eq + 1);
  int resource = -1;
  const char* canonical = "";
  for (const auto& r : kRlimits)
    if (name == r.name) {
      resource = r.resource;
      canonical = r.name;
    }
  if (resource < 0) {
    std::string known;
    for (const auto& r : kRlimits) known += (known.empty() ? "" : ", ") + std::string(r.name);
    throw Error("--rlimit " + text + ": unknown limit '" + name + "' (one of: " + known + ")");
  }
  auto colon = value.find(':');
  rlim_t soft = parse_rlimit_value(value.substr(0, colon), text);
  rlim_t hard =
      colon == std::string::npos ? soft : parse_rlimit_value(value.substr(colon + 1), text);
  if (hard != RLIM_INFINITY && (soft == RLIM_INFINITY || soft > hard))
    throw Error("--rlimit " + text + ": the soft limit is above the hard one");
  return runtime::Rlimit{resource, soft, hard, canonical};
}

std::vector<std::string> merge_env(std::vector<std::string> base,
                                   const std::vector<std::string>& entries) {
  auto set = [&](const std::string& key, const std::string& entry) {
    for (auto& existing : base)
      if (existing.compare(0, key.size() + 1, key + "=") == 0) {
        existing = entry;
        return;
      }
    base.push_back(entry);
  };
  for (const auto& entry : entries) {
    auto eq = entry.find('=');
    std::string key = entry.substr(0, eq);
    if (key.empty() || key.find_first_of(" \t\n\0") != std::string::npos)
      throw Error("--env " + entry + ": expected KEY=VALUE or KEY");
    if (eq != std::string::npos) {
      set(key, entry);
    } else if (const char* value = std::getenv(key.c_str())) {
      set(key, key + "=" + value);
    }
  }
  return base;
}

runtime::ContainerSpec build_spec(const RunOptions& o) {
  runtime::ContainerSpec spec;
  // An image: its layers are the root; its config gives defaults.
  std::optional<image::ImageRecord> img;
  if (!o.image.empty()) {
    if (o.rootfs != "host") throw Error("--image and --rootfs: give one root, not both");
    img = image::Store(Paths::resolve().images()).find(o.image);
    if (!img)
      throw Error("--image " + o.image + ": not in the image store (openshell image pull " +
                  o.image + ")");
  }
  spec.argv = img ? img->config.entrypoint : std::vector<std::string>{};
  const auto& rest = o.command.empty() && img ? img->config.cmd : o.command;
  spec.argv.insert(spec.argv.end(), rest.begin(), rest.end());
  if (spec.argv.empty())
    throw Error("run: no command given (openshell run [OPTIONS] -- COMMAND [ARGS...])");

  // The root.
  std::string root_dir = "/";
  if (img) {
    spec.fs.root = namespaces::RootKind::kDirectory;
    image::Store store(Paths::resolve().images());
    for (auto it = img->diff_ids.rbegin(); it != img->diff_ids.rend(); ++it)
      spec.fs.layers.push_back(store.layer_root(*it));
    spec.fs.read_only = o.read_only;
  } else if (o.rootfs == "host") {
    spec.fs.root = namespaces::RootKind::kHost;
    if (o.read_only) log::debug("--read-only: the host root is always read-only");
  } else {
    spec.fs.root = namespaces::RootKind::kDirectory;
    spec.fs.rootfs = o.rootfs;
    spec.fs.read_only = o.read_only;
    root_dir = o.rootfs;
  }
  for (const auto& b : o.binds) spec.fs.binds.push_back(parse_bind(b));
  spec.fs.hidden = runtime::openshell_private_paths();
  spec.fs.workdir = !o.workdir.empty()                        ? text::normalize_path(o.workdir)
                    : img && !img->config.working_dir.empty() ? img->config.working_dir
                                                              : "/";
  if (!o.workdir.empty() && o.workdir[0] != '/')
    throw Error("--workdir " + o.workdir + ": must be an absolute path");

  // The policy: its filesystem part becomes Landlock rules; run_as_user
  // applies unless --user says otherwise.
  policy::Policy policy;
  if (!o.policy.empty()) policy = policy::load(o.policy);
  // With network policies, the sandbox's way out is an egress proxy that
  // this process serves; without, it has no network at all.
  spec.egress = !policy.network.empty();
  spec.fs.dns_stub = spec.egress;
  spec.network_policy = policy;
  // Without a filesystem policy no Landlock rule covers /proc, where a
  // process could write another's memory (/proc/PID/mem: ptrace is refused,
  // that file is not) and so act as a binary the network policy names. A
  // gateway sandbox's default policy makes /proc read-only; so does this.
  spec.fs.proc_read_only = !policy.has_filesystem_policy;

  // The user.
  std::string user = o.user;
  // The image's user, unless it is root (a sandbox's process never is by
  // default) or the policy names one.
  if (user.empty() && img && !img->config.user.empty() && !policy.process.run_as_user) {
    const std::string name = img->config.user.substr(0, img->config.user.find(':'));
    if (!runtime::names_root(name, image::read_from_layers(spec.fs.layers, "etc/passwd")))
      user = img->config.user;
    // The policy's group, when it names one, wins over the image's.
    if (!user.empty() && policy.process.run_as_group)
      user = name + ":" + *policy.process.run_as_group;
  }
  if (user.empty()) {
    user = policy.process.run_as_user.value_or(std::to_string(runtime::kDefaultUid));
    user += ":" + policy.process.run_as_group.value_or(
                      policy.process.run_as_user ? "" : std::to_string(runtime::kDefaultGid));
    if (user.back() == ':') user.pop_back();
  }
  // The home directory comes from the root's /etc/passwd when it lists the user.
  runtime::ResolvedUser resolved =
      spec.fs.layers.empty()
          ? runtime::resolve_user_in_root(user, root_dir)
          : runtime::resolve_user(user, image::read_from_layers(spec.fs.layers, "etc/passwd"),
                                  image::read_from_layers(spec.fs.layers, "etc/group"), o.image);
  if (o.user.empty() && policy.process.run_as_user && resolved.uid == 0)
    throw Error(o.policy + ": process.run_as_user: " + *policy.process.run_as_user +
                " is root in the sandbox's /etc/passwd");
  if (o.user.empty() && policy.process.run_as_group && resolved.gid == 0)
    throw Error(o.policy + ": process.run_as_group: " + *policy.process.run_as_group +
                " is root's group in the sandbox's /etc/group");
  spec.uid = resolved.uid;
  spec.gid = resolved.gid;

  if (!text::is_dns_label(o.hostname))
    throw Error("--hostname " + o.hostname + ": must be a DNS label (a-z, 0-9, '-', at most 63)");
  spec.hostname = o.hostname;
  spec.tty = o.tty;

  // The environment: a clean one, never the caller's.
  std::vector<std::string> env = {
      "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
      "HOME=" + resolved.home,
      "HOSTNAME=" + o.hostname,
  };
  if (o.tty) {
    const char* term = std::getenv("TERM");
    env.push_back(std::string("TERM=") + (term && *term ? term : "xterm"));
  }
  if (spec.egress) {
    for (const char* var :
         {"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"})
      env.push_back(std::string(var) + "=http://127.0.0.1:3128");
    env.push_back("NO_PROXY=localhost,127.0.0.1");
    env.push_back("no_proxy=localhost,127.0.0.1");
  }
  // The image's environment, then --env on top.
  if (img) env = merge_env(env, img->config.env);
  spec.env = merge_env(env, o.env);

  // Limits.
  if (!o.memory.empty()) {
    auto bytes = text::parse_size(o.memory);
    if (!bytes) throw Error("--memory " + o.memory + ": not a size (like 512M or 2G)");
    if (*bytes < 4 * 1024 * 1024) throw Error("--memory " + o.memory + ": below the minimum of 4M");
    spec.limits.memory_bytes = bytes;
  }
  if (!o.pids.empty()) {
    auto pids = text::parse_uint(o.pids, 4194304);
    if (!pids) throw Error("--pids " + o.pids + ": not a number of processes (0: no limit)");
    if (*pids > 0) spec.limits.pids = pids;
  } else {
    spec.limits.pids = limits::kDefaultPids;
  }
  spec.fs.tmp_size =
      parse_tmpfs_size("--tmp-size", o.tmp_size)
          .value_or(limits::default_tmp_size(spec.limits.memory_bytes, limits::memory_total()));
  spec.fs.shm_size =
      parse_tmpfs_size("--shm-size", o.shm_size)
          .value_or(limits::default_shm_size(spec.limits.memory_bytes, limits::memory_total()));
  if (!o.cpus.empty()) {
    auto cpus = text::parse_positive_decimal(o.cpus);
    if (!cpus || *cpus > 4096) throw Error("--cpus " + o.cpus + ": not a positive number of CPUs");
    spec.limits.cpus = cpus;
  }
  bool core_given = false;
  for (const auto& r : o.rlimits) {
    spec.rlimits.push_back(parse_rlimit(r));
    core_given = core_given || spec.rlimits.back().resource == RLIMIT_CORE;
  }
  if (!core_given)
    spec.rlimits.insert(spec.rlimits.begin(), runtime::Rlimit{RLIMIT_CORE, 0, 0, "core"});

  // Privilege.
  spec.cap_add = runtime::caps::parse(o.cap_add);
  if (o.seccomp == "unconfined")
    spec.seccomp = false;
  else if (o.seccomp != "default")
    throw Error("--seccomp " + o.seccomp + ": expected 'default' or 'unconfined'");
  spec.landlock =
      runtime::landlock::plan(policy, spec.fs.workdir, runtime::landlock::abi_version());
  spec.cgroup_name = "openshell-run-" + std::to_string(::getpid());
  return spec;
}

// A repeatable option takes one value per occurrence, so that
// `run -e A=1 env` runs env.
CLI::Option* repeatable(CLI::Option* option) {
  return option->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

// The egress proxy and DNS stub of a one-shot sandbox, served on a thread of
// this process for as long as the sandbox runs.
class EgressThread {
 public:
  // network_log: open already (see open_network_log), or null.
  EgressThread(runtime::Container& container, const runtime::ContainerSpec& spec,
               std::unique_ptr<logfile::RotatingFile> network_log)
      : log_(std::move(network_log)) {
    egress::Proxy::Options options;
    options.sandbox = spec.hostname;
    options.init_pid = container.pid();
    options.audit = [this](const std::string& line) {
      if (log_)
        log_->append(line + "\n");
      else
        log::debug(line);
    };
    proxy_ = std::make_unique<egress::Proxy>(io_, options);
    const pid_t init = container.pid();
    proxy_->set_rules(std::make_shared<egress::NetworkRules>(supervisor::network_rules(
        spec.network_policy,
        [init](const std::string& path) { return egress::resolve_in_sandbox(init, path); })));
    proxy_->serve(container.take_proxy_listener(), container.take_dns_socket(),
                  container.take_diag_socket(), container.take_connect_listener());
    work_.emplace(io_.get_executor());
    // The thread takes no signals: they are the terminal loop's to read.
    sigset_t all, saved;
    sigfillset(&all);
    ::pthread_sigmask(SIG_BLOCK, &all, &saved);
    // What the sandbox sends is served here: nothing it sends may end this
    // process (and with it the run) from this thread.
    thread_ = std::thread([this] { run_handling_exceptions(io_, "egress proxy"); });
    ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  }
  ~EgressThread() {
    asio::post(io_, [this] {
      proxy_->close();
      work_.reset();
      io_.stop();
    });
    thread_.join();
  }

 private:
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<egress::Proxy> proxy_;
  std::unique_ptr<logfile::RotatingFile> log_;
  std::thread thread_;
};

// --network-log FILE, rotated at --network-log-max into FILE.1 as the
// gateway's logs are; refused when FILE is a symbolic link or not a regular
// file. Opened before the sandbox starts, so that a refusal runs nothing.
std::unique_ptr<logfile::RotatingFile> open_network_log(const RunOptions& o) {
  uint64_t max_bytes = logfile::RotatingFile::kDefaultMaxBytes;
  if (!o.network_log_max.empty()) {
    auto bytes = text::parse_size(o.network_log_max);
    if (!bytes || *bytes < 4096)
      throw Error("--network-log-max " + o.network_log_max +
                  ": not a size of at least 4K (like 16M)");
    max_bytes = *bytes;
  }
  if (o.network_log.empty()) return nullptr;
  auto file = std::make_unique<logfile::RotatingFile>(o.network_log, max_bytes);
  if (!file->is_open()) throw Error("--network-log " + o.network_log + ": " + file->error());
  return file;
}

void add_run_command(CLI::App& app, Action* action) {
  auto options = std::make_shared<RunOptions>();
  CLI::App* run = app.add_subcommand(
      "run", "Run a command in a one-shot sandbox and exit with its status (no daemon needed)");
  run->positionals_at_end();
  run->footer(
      "Examples:\n"
      "  openshell run -- id\n"
      "  openshell run --image busybox -- sh -c 'echo hi'\n"
      "  openshell run --rootfs ./rootfs --memory 256M --pids 64 -- sh -c 'echo hi'\n"
      "  openshell run --rootfs ./rootfs --bind $PWD:/work --workdir /work -t -- sh\n"
      "See openshell-run(1).");
  auto* o = options.get();
  run->add_option("--rootfs", o->rootfs,
                  "Root file system: a directory (overlaid with a throw-away writable layer) or "
                  "'host' for the host's / read-only")
      ->capture_default_str();
  run->add_option("--image", o->image,
                  "Root file system: an image (pulled when missing), with a throw-away writable "
                  "layer; its Env, WorkingDir, User, Entrypoint and Cmd apply");
  run->add_flag("--insecure", o->insecure,
                "Pull a missing --image over plain HTTP (localhost registries use it anyway)");
  run->add_flag("--read-only", o->read_only, "Make the root read-only (/tmp stays writable)");
  repeatable(
      run->add_option("--bind", o->binds, "Bind-mount a host path: SRC:DST[:ro] (repeatable)"));
  run->add_option("-w,--workdir", o->workdir, "Working directory inside (created if missing)");
  repeatable(
      run->add_option("-e,--env", o->env,
                      "Set KEY=VALUE, or pass the caller's KEY (repeatable); nothing else of the "
                      "caller's environment goes in"));
  run->add_option("-u,--user", o->user,
                  "UID[:GID] or NAME[:GROUP] inside the sandbox (default 1000:1000, never the "
                  "caller's)");
  run->add_option("--hostname", o->hostname, "Host name inside")->capture_default_str();
  run->add_flag("-t,--tty", o->tty, "Give the command a pseudo-terminal");
  run->add_option("-m,--memory", o->memory, "Memory limit, like 512M or 2G");
  run->add_option("--pids", o->pids,
                  "Most processes and threads at once (default 4096; 0: no limit)");
  run->add_option("--tmp-size", o->tmp_size,
                  "Size of /tmp, a memory file system (default: the --memory limit, else a tenth "
                  "of the RAM)");
  run->add_option("--shm-size", o->shm_size, "Size of /dev/shm (default: half of /tmp's default)");
  run->add_option("--cpus", o->cpus, "CPU time, in CPUs (1.5 = one and a half)");
  repeatable(run->add_option(
      "--rlimit", o->rlimits,
      "Resource limit NAME=SOFT[:HARD], e.g. nofile=1024 (repeatable; core=0 unless "
      "given)"));
  repeatable(
      run->add_option("--cap-add", o->cap_add, "Keep a capability, e.g. NET_ADMIN (repeatable)"));
  run->add_option("--seccomp", o->seccomp, "System call filter: default or unconfined")
      ->capture_default_str();
  run->add_option("--policy", o->policy,
                  "Policy file (TOML): its filesystem_policy is enforced with Landlock; with "
                  "network_policies the sandbox reaches what they allow through an egress proxy");
  run->add_option("--network-log", o->network_log,
                  "Append the egress proxy's decisions to this file (JSON lines; never through "
                  "a symbolic link; rotated into FILE.1 at --network-log-max)");
  run->add_option(
      "--network-log-max", o->network_log_max,
      "Size at which --network-log starts afresh, keeping one older part (default 16M)");
  run->add_option("command", o->command, "The command and its arguments")->required(false);

  run->callback([options, action]() {
    *action = [options]() {
      if (!options->image.empty()) {
        if (options->rootfs != "host") throw Error("--image and --rootfs: give one root, not both");
        ensure_image(options->image, options->insecure, "--image");
      }
      runtime::ContainerSpec spec = build_spec(*options);
      if (spec.tty) terminal_size(&spec.tty_rows, &spec.tty_cols);
      auto network_log = spec.egress ? open_network_log(*options) : nullptr;
      const auto grace = stop_grace();
      StdioRelay relay(&spec);
      // As root, host ids of this run's own, held until it ends.
      namespaces::RangeClaim ids;
      if (::geteuid() == 0) {
        ids = namespaces::claim_host_range("", true);
        spec.host_range = ids.range();
      }
      block_forwarded_signals();
      // Should this process be killed outright, its cgroups still go.
      std::function<void()> release_ids;
      if (spec.host_range)
        release_ids = [start = spec.host_range->uid_start, pid = ::getpid()] {
          namespaces::release_run_range(namespaces::kRegistryDir, start, pid);
        };
      runtime::CgroupReaper reaper(spec.cgroup_name, release_ids);  // outlives the container
      auto container = runtime::Container::start(spec);
      relay.start();
      std::unique_ptr<EgressThread> egress;
      if (spec.egress)
        egress = std::make_unique<EgressThread>(*container, spec, std::move(network_log));
      int status = attach(*container, grace);
      relay.finish();
      return status;
    };
  });
}

}  // namespace openshell::cli
