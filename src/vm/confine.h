// Confining the VMM as a jailer confines its VMM. The order is fixed:
//
//   1. open /dev/kvm, create the VM, its memory and its devices (everything
//      that needs a path, a capability or a new file descriptor);
//   2. confine_process(): its own user (mapped to one id), mount, network, IPC
//      and UTS namespaces, not dumpable, an empty read-only root, no capabilities,
//      SIGKILL when its parent dies, no_new_privs (the process must still be
//      single-threaded);
//   3. Vm::start(), each vCPU thread installing the vCPU filter first
//      (VmOptions::on_vcpu_thread = vcpu_thread_hook()), each device thread
//      the device filter;
//   4. the main thread installs the main filter and waits.
//
// A thread's filter holds only what that thread needs (seccomp_rules.h); a
// forbidden call kills the VMM process, which ends only its own sandbox.
#pragma once

#include <functional>
#include <string>

#include "vm/seccomp_rules.h"

namespace openshell::vm::confine {

using seccomp_rules::Thread;

// Step 2. Throws Error naming the step that failed.
void confine_process();

// Sets no_new_privs and installs `thread`'s filter on the calling thread
// only. Returns "" or why not ("seccomp: Invalid argument").
std::string install_filter(Thread thread);

// For VmOptions::on_vcpu_thread.
std::function<std::string(uint32_t)> vcpu_thread_hook();

}  // namespace openshell::vm::confine
