// `openshell run --vm`: one micro-VM in the calling process, attached to the
// terminal as a container run is. The guest's serial console is our
// standard output, the VMM's own lines our standard error; what the policy's
// network part allows is reached through an egress proxy served here.
#pragma once

#include <string>

#include "runtime/spec.h"
#include "spec/sandbox_spec.h"

namespace openshell::supervisor {

// Returns the main process's exit status (128+N for signal N), or
// exit_code::kFailure when the VM ended before its init said how the main
// process did (with the reason on standard error). The disks are the
// image's (cached in images_dir) and a writable layer that is thrown away
// with the run. SIGINT and SIGTERM stop the guest, with grace_ms for its
// main process.
int run_vm(const SandboxSpec& spec, const runtime::ContainerSpec& container,
           const std::string& images_dir, int grace_ms);

}  // namespace openshell::supervisor
