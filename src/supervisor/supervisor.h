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

}  // namespace openshell::supervisor
