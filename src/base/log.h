// Diagnostics on stderr, prefixed with the program name.
#pragma once

#include <string>

namespace openshell::log {

void set_verbose(bool on);

// "openshell: warning: ..." - always shown.
void warn(const std::string& message);
// "openshell: ..." - shown with -v only.
void debug(const std::string& message);
// "openshell: ..." - an error line, always shown.
void error(const std::string& message);

// Microseconds from a fixed start, for -v timings.
double elapsed_ms();

}  // namespace openshell::log
