// One binary, several roles: the command line, the gateway and supervisors
// (started under names of their own: base/process_name.h), and the init of
// a sandbox.
#include <cstring>
#include <string>
#include <vector>

#include "base/process_name.h"
#include "cli/app.h"
#include "runtime/init.h"

int main(int argc, char** argv) {
  // The init must start fast and touch nothing else of the program.
  if (argc > 1 && std::strcmp(argv[1], "__init") == 0)
    return openshell::runtime::init_main(argc, argv);
  std::vector<std::string> words = openshell::process_name::role_arguments(argc, argv);
  if (words.empty()) return openshell::cli::main(argc, argv);
  std::vector<char*> role_argv;
  for (auto& w : words) role_argv.push_back(w.data());
  role_argv.push_back(nullptr);
  return openshell::cli::main(static_cast<int>(words.size()), role_argv.data());
}
