// What a host needs to run micro-VM sandboxes (`--vm`; docs/vm.md): a
// guest kernel, and /dev/kvm. Shared by the command line (which picks the
// kernel at create), the gateway (which refuses a VM it cannot run) and
// `openshell doctor`.
#pragma once

#include <string>

namespace openshell::vm_host {

// Where the packages install the guest kernel (rootfs-tools/build-guest-kernel).
inline constexpr const char* kPackagedKernel = "/usr/lib/openshell/vmlinux";
inline constexpr const char* kKernelVariable = "OPENSHELL_VM_KERNEL";
inline constexpr const char* kNoKernel =
    "--vm: no guest kernel (give --vm-kernel PATH or set OPENSHELL_VM_KERNEL; "
    "rootfs-tools/build-guest-kernel builds one)";

struct KernelChoice {
  std::string path;    // as given (may be relative)
  std::string source;  // "--vm-kernel", "OPENSHELL_VM_KERNEL" or "the default"
};

// --vm-kernel when given, else $OPENSHELL_VM_KERNEL when set and not empty,
// else the packaged kernel. `env` is the variable's value (nullptr: unset).
KernelChoice choose_kernel(const std::string& flag, const char* env);

// The chosen kernel as an absolute canonical path, checked to be a regular
// file this process can read. Throws Error, one line: kNoKernel when
// neither was given and the packaged one is missing; else naming the
// source and the path ("--vm-kernel ./k: No such file or directory").
std::string resolve_kernel(const std::string& flag, const char* env);

// "" when `path` is a regular file this process can open for reading;
// else why not ("No such file or directory", "not a regular file").
std::string kernel_problem(const std::string& path);

// "" when this process can open /dev/kvm (or `path`) read-write, as the
// VMM does; else one line saying what is wrong, with the errno text.
std::string kvm_problem(const std::string& path = "/dev/kvm");

}  // namespace openshell::vm_host
