// The supervisor: one per running sandbox generation. It owns the container
// (through src/runtime), captures the main process's output into the
// persisted log, serves exec, and keeps a session to the gateway in which it
// presents its launch file and reports what happens. It runs detached from
// the gateway, survives the gateway's restarts and reconnects; when it ends,
// so does its sandbox.
#pragma once

#include <string>

namespace openshell::supervisor {

// `openshell supervisor --launch FILE`; returns the process's exit status.
int main(const std::string& launch_file);

// `openshell supervisor --launch FILE --copy`: a copy supervisor, which the
// gateway starts for a download or an upload of a sandbox that is not
// running (Stopped, Completed, Error). It builds the sandbox's container from
// the same spec (its root, its workspace, its binds, its user and its
// confinement) but with no main process and no network, serves exactly one
// exec (the tar of the copy) on Paths::copy_socket, and ends with it. It
// reports on ready_fd: "ready", or "error WHY", then closes it. It holds
// sandboxes/<id>/copy.lock while it lives: the gateway starts no sandbox,
// and no second copy, while that lock is held. Nothing of the sandbox's own
// record changes: its log, its exit file and its phase are the run's.
int copy_main(const std::string& launch_file, int ready_fd);

}  // namespace openshell::supervisor
