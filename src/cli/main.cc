// One binary, several roles: the command line, the gateway and supervisors
// (started under names of their own: base/process_name.h), and the init of
// a sandbox.
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include "base/process_name.h"
#include "cli/app.h"
#include "cli/oci.h"
#include "runtime/guest_init.h"
#include "runtime/init.h"
#include "supervisor/supervisor.h"
#include "vm/initramfs.h"

int main(int argc, char** argv) {
  // The init must start fast and touch nothing else of the program.
  if (argc > 1 && std::strcmp(argv[1], "__init") == 0)
    return openshell::runtime::init_main(argc, argv);
  // The micro-VM's guest init: the kernel runs /init (this binary, from the
  // initramfs) as PID 1, with no arguments but the command line's words
  // that are no kernel parameter; `__guest-init [CONFIG]` names it too.
  const bool kernel_init = getpid() == 1 && (argc == 1 || std::strcmp(argv[0], "/init") == 0);
  if (kernel_init || (argc > 1 && std::strcmp(argv[1], "__guest-init") == 0)) {
    std::string config = "/" + std::string(openshell::vm::initramfs::kConfigPath);
    if (!kernel_init && argc > 2) config = argv[2];
    return openshell::runtime::guest::run_as_pid1(config);
  }
  // Engines run the OCI runtime as runc, under a name of its own.
  const char* base = std::strrchr(argv[0], '/');
  base = base ? base + 1 : argv[0];
  if (std::strcmp(base, "openshell-runc") == 0) return openshell::cli::oci_main(argc, argv);
  if (argc > 1 && std::strcmp(argv[1], "oci") == 0)
    return openshell::cli::oci_main(argc - 1, argv + 1);
  // A supervisor, as the gateway starts one (`openshell-supervisor NAME
  // --launch FILE [--copy]`): straight in, past the parser of every
  // command, which is built for each process (0.7 ms of a create).
  if (base == openshell::process_name::kSupervisor && argc >= 4 && argc <= 5 &&
      std::strcmp(argv[2], "--launch") == 0) {
    if (argc == 4) return openshell::supervisor::main(argv[3]);
    if (std::strcmp(argv[4], "--copy") == 0) return openshell::supervisor::copy_main(argv[3], 3);
  }
  std::vector<std::string> words = openshell::process_name::role_arguments(argc, argv);
  if (words.empty()) return openshell::cli::main(argc, argv);
  std::vector<char*> role_argv;
  for (auto& w : words) role_argv.push_back(w.data());
  role_argv.push_back(nullptr);
  return openshell::cli::main(static_cast<int>(words.size()), role_argv.data());
}
