// Without --tty, the caller's terminal never reaches the sandbox: each of
// stdin, stdout and stderr that is a terminal is replaced by a pipe that
// this process relays (as docker does without -t). Holding a terminal fd,
// the sandbox could change the caller's terminal settings (tcsetattr) or
// its window size, whatever it is otherwise allowed; a pipe gives it
// nothing but the bytes.
#pragma once

#include <string>
#include <thread>

#include "base/unique_fd.h"

namespace openshell::runtime {
struct ContainerSpec;
}

namespace openshell::cli {

class StdioRelay {
 public:
  // Points spec's stdio at pipes where the caller's are terminals (nothing
  // with spec->tty: the sandbox has a pseudo-terminal of its own then).
  explicit StdioRelay(runtime::ContainerSpec* spec);
  ~StdioRelay();
  StdioRelay(const StdioRelay&) = delete;
  StdioRelay& operator=(const StdioRelay&) = delete;

  // Once the sandbox runs: closes its ends here and starts relaying, on a
  // thread that takes no signals.
  void start();
  // Once the sandbox has ended: relays what is left of its output and
  // stops. Idempotent.
  void finish();

 private:
  void run();

  UniqueFd sandbox_in_, sandbox_out_, sandbox_err_;  // the sandbox's ends
  UniqueFd to_stdin_;                                // our end of its stdin
  UniqueFd from_stdout_, from_stderr_;               // our ends of its output
  UniqueFd stop_read_, stop_write_;
  std::thread thread_;
};

}  // namespace openshell::cli
