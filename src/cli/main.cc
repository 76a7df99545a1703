// One binary, several roles: the command line, and the init of a sandbox.
#include <cstring>

#include "cli/app.h"
#include "runtime/init.h"

int main(int argc, char** argv) {
  // The init must start fast and touch nothing else of the program.
  if (argc > 1 && std::strcmp(argv[1], "__init") == 0)
    return openshell::runtime::init_main(argc, argv);
  return openshell::cli::main(argc, argv);
}
