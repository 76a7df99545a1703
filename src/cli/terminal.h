// The caller's terminal while a sandbox runs: signals forwarded to it, and
// with --tty the pseudo-terminal's bytes relayed both ways in raw mode.
#pragma once

#include <chrono>

namespace openshell::runtime {
class Container;
}

#include <termios.h>

namespace openshell::cli {

// Puts a terminal in raw mode (if fd is one) and restores it on destruction.
// keys_only: each key is read as it is typed, unechoed, but the terminal
// still turns ^C into SIGINT and output newlines into CR LF.
class RawMode {
 public:
  explicit RawMode(int fd, bool keys_only = false);
  ~RawMode();
  RawMode(const RawMode&) = delete;
  RawMode& operator=(const RawMode&) = delete;

 private:
  int fd_;
  termios saved_{};
  bool active_ = false;
};

// The caller's terminal size, from whichever of its stdio is a terminal;
// 24x80 when none is.
void terminal_size(unsigned short* rows, unsigned short* cols);

// How long a sandbox has to end after a SIGTERM before it is killed:
// OPENSHELL_STOP_GRACE_MS, else 10 s. Throws Error for a value that is not
// a number of milliseconds: read before the sandbox starts, so that bad
// input never starts one.
std::chrono::milliseconds stop_grace();

// Relays until the container ends; returns its exit status. A SIGTERM the
// sandbox has not ended within `grace` of is followed by SIGKILL.
int attach(runtime::Container& container, std::chrono::milliseconds grace);

// Blocks the signals attach() forwards, for the rest of the process's life:
// called before the sandbox starts, so that a signal sent once its command
// runs (which may be before attach() is reached) is forwarded, not fatal to
// this process. The sandbox's init unblocks them for its own processes.
void block_forwarded_signals();

}  // namespace openshell::cli
