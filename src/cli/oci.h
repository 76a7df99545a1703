// `openshell oci ...` and `openshell-runc ...`: the runc command line
// (cli/oci_command.cc), a program of its own beside the main tree, for its
// global flags and exit statuses are runc's.
#pragma once

namespace openshell::cli {

// argv[0] is the program's name ("openshell-runc", or "oci" below
// `openshell`); returns the exit status.
int oci_main(int argc, char** argv);

}  // namespace openshell::cli
