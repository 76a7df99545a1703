// `openshell run` options and their translation into a sandbox spec and the
// one-shot extras, for the builder every sandbox goes through
// (spec/container_spec.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "runtime/spec.h"
#include "spec/container_spec.h"
#include "spec/sandbox_spec.h"

namespace openshell::cli {

struct RunOptions {
  std::string rootfs = "host";
  std::string image;      // an image in the store (run pulls it first when missing)
  bool insecure = false;  // pull --image over plain HTTP
  bool read_only = false;
  std::vector<std::string> binds;      // SRC:DST[:ro|rw]
  std::vector<std::string> env;        // KEY=VALUE, or KEY to pass the caller's value
  std::vector<std::string> env_files;  // --env-file, before env (cli/env_file.h)
  std::string workdir;                 // default "/"
  std::string user;                    // UID[:GID] or NAME[:GROUP]; default 1000:1000
  std::string hostname = "sandbox";
  bool tty = false;
  std::string memory;                // "64M"
  std::string pids;                  // "100"; default kDefaultPids, "0" no limit
  std::string tmp_size;              // /tmp's size, "256M"; default: see base/sandbox_limits.h
  std::string shm_size;              // /dev/shm's size
  std::string cpus;                  // "1.5"
  std::vector<std::string> rlimits;  // NAME=SOFT[:HARD]
  std::vector<std::string> cap_add;
  std::string seccomp = "default";    // or "unconfined"
  std::string policy;                 // TOML file
  std::string network_log;            // where the egress decisions go (JSON lines)
  std::string network_log_max;        // "16M": its size before it rotates into FILE.1
  std::vector<std::string> ca_certs;  // --ca-cert: PEM files the sandbox trusts too
  bool vm = false;                    // a micro-VM: --memory and --cpus size the guest
  std::string vm_kernel;              // --vm-kernel
  std::string gpu;                    // --gpu: "all" (a bare --gpu) or N; "": none
  std::vector<std::string> command;
};

// What `openshell run` asks the builder for.
struct RunPlan {
  SandboxSpec sandbox;
  spec::Placement placement;  // with its one_shot part
};

// Validates and translates; throws Error with a one-line message naming the
// option at fault. With --image, the image must be in the store already.
RunPlan plan_run(const RunOptions& options);
// spec::container_spec_for of plan_run.
runtime::ContainerSpec build_spec(const RunOptions& options);

// Pieces, exposed for tests.
// --tmp-size/--shm-size: bytes, or nullopt when not given; throws Error.
std::optional<uint64_t> parse_tmpfs_size(const std::string& option, const std::string& value);
// --pids (run and sandbox create): the limit, or nullopt when not given;
// throws Error. (--cpus/--cpu and --memory: limits::parse_cpus, parse_memory.)
std::optional<uint64_t> parse_pids(const std::string& value);
namespaces::BindSpec parse_bind(const std::string& text);
runtime::Rlimit parse_rlimit(const std::string& text);
// --env entries as KEY=VALUE: "K" alone takes the caller's value (and is
// dropped when the caller has none). Throws Error on a bad key.
std::vector<std::string> env_entries(const std::vector<std::string>& entries);

// --vm (run and sandbox create): the guest's vCPUs from `cpu` (the value
// of `cpu_option`, rounded up) and its RAM from --memory (rounded up to
// whole MiB), each else the policy's [vm] (policy_text, the file's text),
// else 1 vCPU and 512 MiB. The kernel: vm_host::resolve_kernel(kernel_flag,
// $OPENSHELL_VM_KERNEL) when `resolve_kernel`, else kernel_flag as given
// (a remote gateway's host has its own kernel). Throws Error, one line.
SandboxVm plan_vm(const std::string& cpu_option, const std::string& cpu, const std::string& memory,
                  const std::string& policy_text, const std::string& policy_source,
                  const std::string& kernel_flag, bool resolve_kernel);

}  // namespace openshell::cli
