// The command tree: `openshell <command> ...`.
#pragma once

namespace openshell::cli {

// Parses the command line, runs the command, and returns the exit status.
// Errors print one line on stderr and return 125 (see base/error.h).
int main(int argc, char** argv);

}  // namespace openshell::cli
