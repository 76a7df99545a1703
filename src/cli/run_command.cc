#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include <CLI/CLI.hpp>
#include <boost/asio.hpp>

#include "base/directory.h"
#include "base/error.h"
#include "base/event_loop.h"
#include "base/files.h"
#include "base/log.h"
#include "base/logfile.h"
#include "base/paths.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "base/vm_host.h"
#include "cli/commands.h"
#include "cli/egress_thread.h"
#include "cli/env_file.h"
#include "cli/images.h"
#include "cli/run_options.h"
#include "cli/sandbox_common.h"
#include "cli/stdio_relay.h"
#include "cli/terminal.h"
#include "egress/identity.h"
#include "egress/proxy.h"
#include "egress/tls.h"
#include "image/store.h"
#include "namespaces/id_pool.h"
#include "policy/policy.h"
#include "runtime/cgroup_reaper.h"
#include "runtime/container.h"
#include "runtime/gpu.h"
#include "runtime/init_image.h"
#include "runtime/private_paths.h"
#include "spec/ca_certs.h"
#include "spec/container_spec.h"
#include "supervisor/network_rules.h"
#include "supervisor/run_vm.h"

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

// The directory of a run's CA bundle (OneShot::ca_dir): of its own, in
// $TMPDIR (else /tmp), never in the root the bundle is mounted over (a
// directory of the user's, the host's). Removed once the sandbox has
// started, its mounts holding the file, or when the run fails before
// that. It holds certificates only, never a key.
class CaDir {
 public:
  CaDir() {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp && *tmp ? tmp : "/tmp") + "/openshell-ca.XXXXXX";
    if (!::mkdtemp(pattern.data())) throw_errno("create a directory like " + pattern);
    path_ = pattern;
  }
  ~CaDir() { remove(); }
  CaDir(const CaDir&) = delete;
  CaDir& operator=(const CaDir&) = delete;
  const std::string& path() const { return path_; }
  void remove() {
    if (path_.empty()) return;
    try {
      files::remove_tree(path_);
    } catch (const Error& e) {
      log::warn(e.what());
    }
    path_.clear();
  }

 private:
  std::string path_;
};

}  // namespace

std::optional<uint64_t> parse_tmpfs_size(const std::string& option, const std::string& value) {
  if (value.empty()) return std::nullopt;
  auto bytes = text::parse_size(value);
  if (!bytes) throw Error(option + " " + value + ": not a size (like 256M or 1G)");
  if (*bytes < limits::kMinTmpfsSize)
    throw Error(option + " " + value + ": below the minimum of 1M");
  return bytes;
}

std::optional<uint64_t> parse_pids(const std::string& value) {
  if (value.empty()) return std::nullopt;
  auto pids = text::parse_uint(value, 4194304);
  if (!pids) throw Error("--pids " + value + ": not a number of processes (0: no limit)");
  return pids;
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

// Run as root, a writable bind of a directory of root's is a plain bind
// (mounts.cc: only an ordinary user's ids are mapped to the sandbox's
// user, so that nothing there is created as the host's root): the
// sandbox's user can write there only what the modes let anyone write.
// Said before the command fails on it, where it is bound to be written:
// when it holds the working directory (the README's --bind "$PWD:/work"
// --workdir /work -- make test).
void warn_unwritable_bind(const namespaces::BindSpec& bind, const std::string& workdir) {
  struct stat st;
  const std::string target = text::normalize_path(bind.target);
  const std::string below = target == "/" ? "/" : target + "/";
  if (::geteuid() != 0 || bind.read_only || (workdir != target && workdir.rfind(below, 0) != 0) ||
      ::stat(bind.source.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      (st.st_uid != 0 && st.st_gid != 0) || (st.st_mode & S_IWOTH))
    return;
  log::warn("--bind " + bind.source + ": owned by root, so the sandbox cannot write there (a " +
            "directory of an ordinary user's is mapped to the sandbox's user; see " +
            "openshell-run(1), Users and groups)");
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

std::vector<std::string> env_entries(const std::vector<std::string>& entries) {
  std::vector<std::string> out;
  for (const auto& entry : entries) {
    auto eq = entry.find('=');
    std::string key = entry.substr(0, eq);
    if (key.empty() || key.find_first_of(" \t\n") != std::string::npos)
      throw Error("--env " + entry + ": expected KEY=VALUE or KEY");
    if (eq != std::string::npos)
      out.push_back(entry);
    else if (const char* value = std::getenv(key.c_str()))
      out.push_back(key + "=" + value);
  }
  return out;
}

SandboxVm plan_vm(const std::string& cpu_option, const std::string& cpu, const std::string& memory,
                  const std::string& policy_text, const std::string& policy_source,
                  const std::string& kernel_flag, bool resolve_kernel) {
  SandboxVm vm;
  policy::VmPolicy defaults;
  if (!policy_text.empty())
    defaults = policy::parse(policy_text, policy_source.empty() ? "policy" : policy_source).vm;
  if (!cpu.empty()) {
    const double cpus = limits::parse_cpus(cpu_option, cpu);
    if (cpus > limits::kMaxVcpus)
      throw Error(cpu_option + " " + cpu + ": a VM has at most " +
                  std::to_string(limits::kMaxVcpus) + " vCPUs");
    vm.vcpus = static_cast<uint32_t>(std::ceil(cpus));
  } else if (defaults.vcpus) {
    vm.vcpus = *defaults.vcpus;
  }
  if (!memory.empty()) {
    const uint64_t bytes = limits::parse_memory("--memory", memory);
    const uint64_t mib = bytes / (1u << 20) + (bytes % (1u << 20) ? 1 : 0);
    if (mib < limits::kMinGuestMib || mib > limits::kMaxGuestMib)
      throw Error("--memory " + memory + ": a VM's memory is between " +
                  std::to_string(limits::kMinGuestMib) + "M and " +
                  std::to_string(limits::kMaxGuestMib / 1024) + "G");
    vm.memory_mib = mib;
  } else if (defaults.memory_mib) {
    vm.memory_mib = *defaults.memory_mib;
  }
  if (resolve_kernel) {
    vm.kernel = vm_host::resolve_kernel(kernel_flag, std::getenv(vm_host::kKernelVariable));
  } else {
    if (!kernel_flag.empty() && kernel_flag[0] != '/')
      throw Error("--vm-kernel " + kernel_flag +
                  ": a remote gateway's kernel is named by its absolute path there");
    vm.kernel = kernel_flag;
  }
  return vm;
}

RunPlan plan_run(const RunOptions& o) {
  RunPlan plan;
  SandboxSpec& sandbox = plan.sandbox;
  spec::Placement& where = plan.placement;
  spec::OneShot& one_shot = where.one_shot.emplace();

  // The root: the host's, a directory, or an image (whose config gives
  // defaults: its Env, WorkingDir, User, Entrypoint and Cmd).
  sandbox.from = o.rootfs;
  sandbox.command = o.command;
  sandbox.env = environment_entries(o.env_files, o.env);
  if (!o.image.empty()) {
    if (o.rootfs != "host") throw Error("--image and --rootfs: give one root, not both");
    where.images_dir = Paths::resolve().images();
    auto img = image::Store(where.images_dir).find(o.image);
    if (!img)
      throw Error("--image " + o.image + ": not in the image store (openshell image pull " +
                  o.image + ")");
    sandbox.from = o.image;
    spec::resolve_image(&sandbox, *img);
  }
  if (sandbox.command.empty())
    throw Error("run: no command given (openshell run [OPTIONS] -- COMMAND [ARGS...])");
  one_shot.read_only = o.read_only;
  where.hidden = runtime::openshell_private_paths();
  if (!o.workdir.empty() && o.workdir[0] != '/')
    throw Error("--workdir " + o.workdir + ": must be an absolute path");
  if (!o.workdir.empty()) one_shot.workdir = text::normalize_path(o.workdir);
  for (const auto& file : o.ca_certs) sandbox.ca_certs.push_back(spec::read_ca_cert(file));
  for (const auto& b : o.binds) {
    one_shot.binds.push_back(parse_bind(b));
    if (!o.workdir.empty())
      warn_unwritable_bind(one_shot.binds.back(), text::normalize_path(o.workdir));
  }

  // The policy: its filesystem part becomes Landlock rules; with network
  // policies, the sandbox's way out is an egress proxy that this process
  // serves; without, it has no network at all.
  if (!o.policy.empty()) {
    if (int err = files::read_into(o.policy, &sandbox.policy))
      throw_errno("policy " + o.policy, err);
    sandbox.policy_source = o.policy;
  }
  one_shot.user = o.user;

  if (!text::is_dns_label(o.hostname))
    throw Error("--hostname " + o.hostname + ": must be a DNS label (a-z, 0-9, '-', at most 63)");
  where.hostname = o.hostname;
  one_shot.tty = o.tty;
  if (o.tty) {
    const char* term = std::getenv("TERM");
    one_shot.term = term ? term : "";
  }

  // Limits. A VM's --memory and --cpus are its guest's RAM and vCPUs.
  if (!o.vm_kernel.empty() && !o.vm) throw Error("--vm-kernel: only with --vm");
  // What a micro-VM cannot honour yet is refused, never dropped.
  if (o.vm) {
    auto refuse = [](const std::string& option, const std::string& why) {
      throw Error(option + ": not with --vm (" + why + ")");
    };
    if (!o.binds.empty()) refuse("--bind " + o.binds.front(), "a micro-VM sees only its disks");
    if (o.tty)
      refuse("--tty", "the main process runs on the guest's console; exec -t has a terminal");
    if (o.read_only) refuse("--read-only", "a micro-VM's root is its own disk");
    if (!o.cap_add.empty()) refuse("--cap-add", "the guest's processes keep no capabilities");
    if (o.seccomp != "default") refuse("--seccomp " + o.seccomp, "the guest's filter is fixed");
    if (!o.rlimits.empty()) refuse("--rlimit", "not in the guest yet");
    if (!o.network_log.empty()) refuse("--network-log", "not for a micro-VM yet");
    if (!o.ca_certs.empty()) refuse("--ca-cert " + o.ca_certs.front(), "not for a micro-VM yet");
    if (!o.gpu.empty()) refuse("--gpu", "a micro-VM has no device passthrough");
  }
  runtime::gpu::parse_request(o.gpu);  // a bad value stops here, with its reason
  sandbox.gpu = o.gpu;
  if (o.vm) {
    sandbox.vm = plan_vm("--cpus", o.cpus, o.memory, sandbox.policy, sandbox.policy_source,
                         o.vm_kernel, true);
  } else {
    if (!o.memory.empty()) sandbox.memory_bytes = limits::parse_memory("--memory", o.memory);
    if (!o.cpus.empty()) sandbox.cpus = limits::parse_cpus("--cpus", o.cpus);
  }
  sandbox.pids = parse_pids(o.pids);
  sandbox.tmp_size_bytes = parse_tmpfs_size("--tmp-size", o.tmp_size);
  sandbox.shm_size_bytes = parse_tmpfs_size("--shm-size", o.shm_size);
  for (const auto& r : o.rlimits) one_shot.rlimits.push_back(parse_rlimit(r));

  // Privilege.
  one_shot.cap_add = runtime::caps::parse(o.cap_add);
  if (o.seccomp == "unconfined")
    one_shot.seccomp = false;
  else if (o.seccomp != "default")
    throw Error("--seccomp " + o.seccomp + ": expected 'default' or 'unconfined'");
  where.cgroup_name = "openshell-run-" + std::to_string(::getpid());
  return plan;
}

runtime::ContainerSpec build_spec(const RunOptions& options) {
  RunPlan plan = plan_run(options);
  return spec::container_spec_for(plan.sandbox, plan.placement);
}

// A repeatable option takes one value per occurrence, so that
// `run -e A=1 env` runs env.
CLI::Option* repeatable(CLI::Option* option) {
  return option->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
}

void add_size_limit_options(CLI::App* app, std::string* memory, std::string* pids,
                            std::string* tmp_size, std::string* shm_size) {
  app->add_option("-m,--memory", *memory,
                  "Memory limit: bytes, or with a unit, like 512Mi, 4Gi, 1G or 100M (binary)");
  app->add_option("--pids", *pids,
                  "Most processes and threads at once (default 4096; 0: no limit)");
  app->add_option("--tmp-size", *tmp_size,
                  "Size of /tmp, a memory file system (default: the --memory limit, else a tenth "
                  "of the RAM)");
  app->add_option("--shm-size", *shm_size, "Size of /dev/shm (default: half of /tmp's default)");
}

void add_gpu_option(CLI::App* app, std::string* gpu) {
  app->add_option("--gpu", *gpu,
                  "Give it the host's NVIDIA GPUs: all (a bare --gpu), or the first N; from the "
                  "CDI specs in /etc/cdi and /var/run/cdi, else /dev/nvidia* (docs/gpu.md)")
      ->expected(0, 1)
      ->default_str("all")
      ->option_text("[N|all]");
}

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
  repeatable(
      run->add_option("--env-file", o->env_files,
                      "A file of KEY=VALUE lines, as docker reads it (repeatable; -e wins)"));
  run->add_option("-u,--user", o->user,
                  "UID[:GID] or NAME[:GROUP] inside the sandbox (default 1000:1000, never the "
                  "caller's)");
  run->add_option("--hostname", o->hostname, "Host name inside")->capture_default_str();
  run->add_flag("-t,--tty", o->tty, "Give the command a pseudo-terminal");
  add_size_limit_options(run, &o->memory, &o->pids, &o->tmp_size, &o->shm_size);
  run->add_option("--cpus,--cpu", o->cpus,
                  "CPU time, in CPUs: 1.5 = one and a half, 500m = half of one");
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
  repeatable(run->add_option(
      "--ca-cert", o->ca_certs,
      "Trust the CA certificates of this PEM file too (repeatable): added to the sandbox's CA "
      "bundle, mounted over the root's"));
  run->add_option("--network-log", o->network_log,
                  "Append the egress proxy's decisions to this file (JSON lines; never through "
                  "a symbolic link; rotated into FILE.1 at --network-log-max)");
  run->add_option(
      "--network-log-max", o->network_log_max,
      "Size at which --network-log starts afresh, keeping one older part (default 16M)");
  run->add_flag("--vm", o->vm,
                "Run it in a micro-VM booting the --image's root (needs /dev/kvm and a guest "
                "kernel): --memory is the guest's RAM, --cpus its vCPUs (rounded up)");
  run->add_option("--vm-kernel", o->vm_kernel,
                  "The guest kernel for --vm (default: $OPENSHELL_VM_KERNEL, else "
                  "/usr/lib/openshell/vmlinux)");
  add_gpu_option(run, &o->gpu);
  run->add_option("command", o->command, "The command and its arguments")->required(false);

  run->callback([options, action]() {
    *action = [options]() {
      const double t_parsed = log::elapsed_ms();
      if (!options->image.empty()) {
        if (options->rootfs != "host") throw Error("--image and --rootfs: give one root, not both");
        ensure_image(options->image, options->insecure, "--image");
      }
      RunPlan plan = plan_run(*options);
      if (plan.sandbox.vm) {
        plan.sandbox.validate();  // the spec is complete here: root, policy, command, vm
        const runtime::ContainerSpec guest = spec::container_spec_for(plan.sandbox, plan.placement);
        return supervisor::run_vm(plan.sandbox, guest, plan.placement.images_dir,
                                  static_cast<int>(stop_grace().count()));
      }
      const policy::Policy policy = spec::effective_policy(plan.sandbox, plan.placement);
      // A CA of the sandbox's own, as a gateway's sandbox has (its key in
      // this process's memory only), for the proxy to sign the leaves of
      // what it inspects. Only for a policy with an endpoint it inspects:
      // the key, the certificate and the bundle cost milliseconds, and a
      // run without them starts in a few.
      std::unique_ptr<egress::tls::SandboxCa> ca;
      if (spec::inspects_traffic(policy))
        ca = std::make_unique<egress::tls::SandboxCa>(plan.placement.hostname);
      std::optional<CaDir> ca_dir;
      if (ca || !plan.sandbox.ca_certs.empty())
        plan.placement.one_shot->ca_dir = ca_dir.emplace().path();
      runtime::ContainerSpec spec = spec::container_spec_for(plan.sandbox, plan.placement);
      if (spec.tty) terminal_size(&spec.tty_rows, &spec.tty_cols);
      auto network_log = spec.egress ? open_network_log(*options) : nullptr;
      const double t_planned = log::elapsed_ms();
      const auto grace = stop_grace();
      StdioRelay relay(&spec);
      // As root, host ids of this run's own, held until it ends.
      namespaces::RangeClaim ids;
      if (::geteuid() == 0) {
        ids = namespaces::claim_host_range("", true);
        spec.host_range = ids.range();
        plan.sandbox.host_uid_start = spec.host_range->uid_start;
        plan.sandbox.host_gid_start = spec.host_range->gid_start;
      }
      const double t_ids = log::elapsed_ms();
      // After the claim: as root, the bundle is the sandbox's range's.
      if (ca_dir) spec::write_ca_bundle(plan.sandbox, ca_dir->path(), ca ? ca->cert_pem() : "");
      block_forwarded_signals();
      // Should this process be killed outright, its cgroups still go.
      std::optional<namespaces::RunRelease> release_ids;
      if (spec.host_range)
        release_ids = namespaces::run_release(namespaces::kRegistryDir, spec.host_range->uid_start,
                                              ::getpid());
      runtime::CgroupReaper reaper(spec.cgroup_name,
                                   std::move(release_ids));  // outlives the container
      // The init's own small program: it starts in half the time of this one.
      const UniqueFd init_image = runtime::make_init_image();
      spec.init_image_fd = init_image.get();
      const double t_helpers = log::elapsed_ms();
      log::debug("run: parsed at " + text::format_ms(t_parsed) + " ms; plan " +
                 text::format_ms(t_planned - t_parsed) + " ms, host ids " +
                 text::format_ms(t_ids - t_planned) + " ms, cleanup helper and init " +
                 text::format_ms(t_helpers - t_ids) + " ms");
      auto container = runtime::Container::start(spec);
      if (ca_dir) ca_dir->remove();  // mounted: the sandbox's mounts hold the bundle now
      relay.start();
      std::unique_ptr<EgressThread> egress;  // goes before `ca`, which its proxy uses
      if (spec.egress)
        egress = std::make_unique<EgressThread>(*container, spec, policy, std::move(network_log),
                                                ca.get());
      int status = attach(*container, grace);
      relay.finish();
      return status;
    };
  });
}

}  // namespace openshell::cli
