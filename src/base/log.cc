#include "base/log.h"

#include <time.h>
#include <unistd.h>

namespace openshell::log {

namespace {
bool g_verbose = false;

double now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
}

const double g_start = now_ms();

void emit(const std::string& line) {
  // One write per line so that concurrent writers do not interleave mid-line.
  std::string out = line + "\n";
  ssize_t ignored = ::write(STDERR_FILENO, out.data(), out.size());
  (void)ignored;
}
}  // namespace

void set_verbose(bool on) { g_verbose = on; }

void warn(const std::string& message) { emit("openshell: warning: " + message); }

void debug(const std::string& message) {
  if (g_verbose) emit("openshell: " + message);
}

void error(const std::string& message) { emit("openshell: " + message); }

double elapsed_ms() { return now_ms() - g_start; }

}  // namespace openshell::log
