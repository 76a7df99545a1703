// Diagnostics on stderr, prefixed with the program name.
#pragma once

#include <string>

namespace openshell::log {

void set_verbose(bool on);
bool verbose();  // -v: debug() lines are shown

// Also write each line to fd (runc's --log), as text or as runc's JSON
// lines ({"level","msg","time"}) that engines read back; -1: no file.
// to_stderr false: the file only (a monitor whose stderr is a container's).
void set_file(int fd, bool json, bool to_stderr = true);

// "openshell: warning: ..." - always shown.
void warn(const std::string& message);
// "openshell: ..." - shown with -v only.
void debug(const std::string& message);
// "openshell: ..." - an error line, always shown.
void error(const std::string& message);

// Microseconds from a fixed start, for -v timings.
double elapsed_ms();

}  // namespace openshell::log
