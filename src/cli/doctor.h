// `openshell doctor check`: whether this host can run sandboxes, one check
// at a time. Each verdict is a pure function of what the probe read (file
// text, a mode, a number), so tests judge each one on faked conditions; the
// probes read under roots that OPENSHELL_DOCTOR_PROC, _SYS, _ETC and _DEV
// move (a fake /sys/fs/cgroup tree, a fake /etc/subuid), and find programs
// on PATH.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/vm_host.h"

namespace openshell::cli::doctor {

struct Check {
  std::string name;  // "kernel", "user namespaces", ...
  bool ok = false;
  bool required = true;  // sandbox create needs it: a failure makes doctor exit non-zero
  std::string detail;    // what was found
  std::string fix;       // when not ok: what to do, one line
};

// Where the probes read.
struct Roots {
  std::string proc = "/proc", sys = "/sys", etc = "/etc", dev = "/dev";
  std::string path;  // PATH
  uid_t uid = 0;
  std::string user;  // the caller's name, for /etc/subuid
  // From the environment (OPENSHELL_DOCTOR_PROC, ..., PATH) and this process.
  static Roots from_environment();
};

// The verdicts.
Check kernel_check(std::string_view release);
// max_user_namespaces, and the optional knobs: Debian's
// unprivileged_userns_clone, Ubuntu's apparmor_restrict_unprivileged_userns.
Check userns_check(std::optional<std::string> max_user_namespaces,
                   std::optional<std::string> unprivileged_clone,
                   std::optional<std::string> apparmor_restrict, uid_t uid);
Check subid_check(std::string_view file, std::optional<std::string> text, const std::string& user,
                  uid_t uid);
// mode: st_mode of the program found on PATH (nullopt: none); has_caps: it
// carries file capabilities instead of the setuid bit.
Check idmap_helper_check(const std::string& program, const std::string& found,
                         std::optional<unsigned> mode, bool has_caps, uid_t uid);
// The cgroup layout under sys_fs_cgroup and the controllers this process
// may use there (proc_self_cgroup names its cgroups).
Check cgroup_check(const std::string& sys_fs_cgroup, std::string_view proc_self_cgroup, uid_t uid);
Check landlock_check(int abi);
Check seccomp_check(std::optional<std::string> proc_self_status);
Check overlay_check(const std::string& problem);
// Whether `--vm` sandboxes can run: kvm_problem is vm_host::kvm_problem()
// of the device ("" when it opens read-write), kernel the guest kernel
// chosen as `sandbox create --vm` chooses it and kernel_problem why it
// cannot be read ("" when it can), cpuinfo /proc/cpuinfo's text: without
// vmx or svm, KVM is paravirtualised (PVM), where Linux guests do not boot.
Check micro_vm_check(const std::string& kvm_problem, const vm_host::KernelChoice& kernel,
                     const std::string& kernel_problem, std::optional<std::string> cpuinfo);
Check directory_check(const std::string& what, const std::string& dir);

// Every check on this host, in order (gateway and image last).
std::vector<Check> run_all(const Roots& roots);

// The text forms: one line per check ("✓ kernel: Linux 6.18 ..." or
// "✗ ...: ... — fix: ..."), and JSON.
std::string format_line(const Check& check);
std::string to_json(const std::vector<Check>& checks);
// Whether sandbox create has what it needs (no required check failed).
bool all_required_ok(const std::vector<Check>& checks);

}  // namespace openshell::cli::doctor
