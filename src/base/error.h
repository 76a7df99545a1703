// Errors that travel up to the command line as one clear line and an exit code.
#pragma once

#include <stdexcept>
#include <string>

namespace openshell {

// Exit codes of openshell itself (the docker/podman convention); a command that
// ran passes its own status through, and death by signal N gives 128+N.
namespace exit_code {
inline constexpr int kFailure = 125;        // openshell itself failed (bad input too)
inline constexpr int kCannotExecute = 126;  // the command exists but cannot be executed
inline constexpr int kNotFound = 127;       // the command was not found
}  // namespace exit_code

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, int exit_code = exit_code::kFailure)
      : std::runtime_error(message), exit_code_(exit_code) {}
  int exit_code() const { return exit_code_; }

 private:
  int exit_code_;
};

// "what: strerror(err)", e.g. "mount overlay on /x: Invalid argument".
std::string errno_message(const std::string& what, int err);

// Throws Error("what: strerror(errno)").
[[noreturn]] void throw_errno(const std::string& what);
[[noreturn]] void throw_errno(const std::string& what, int err);

}  // namespace openshell
