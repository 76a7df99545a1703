// PID 1 of a sandbox (runtime/init.cc): what the binary's entry calls when
// the runtime has exec'd it as the sandbox's init.
#pragma once

namespace openshell::runtime {

// The init's entry point, for `openshell __init REPORT LIFE TTY CONTROL CAPS FLAGS --
// [ARGV...]` as the runtime execs it (the fds by number, -1 for none).
// Returns the main process's status, as the init's own exit status.
int init_main(int argc, char** argv);

}  // namespace openshell::runtime
