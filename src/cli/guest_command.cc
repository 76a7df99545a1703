// openshell __guest-initramfs: the micro-VM's initramfs (src/vm/initramfs.h)
// with this binary as /init and a guest configuration
// (src/runtime/guest_init.h). Hidden: the supervisor of a --vm sandbox and
// the tests make one; `__guest-init` itself is run by main() as PID 1.
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "base/files.h"
#include "cli/commands.h"
#include "runtime/guest_init.h"
#include "vm/initramfs.h"

namespace openshell::cli {

void add_guest_commands(CLI::App& app, Action* action) {
  struct Options {
    std::string config;
    std::string output;
    std::string init = "/proc/self/exe";
    bool no_gzip = false;
  };
  auto o = std::make_shared<Options>();
  CLI::App* c = app.add_subcommand(
      "__guest-initramfs", "Write a micro-VM initramfs: this binary as /init, a guest config");
  c->group("");
  c->add_option("--config", o->config, "The guest configuration (JSON), checked before use")
      ->required();
  c->add_option("-o,--output", o->output, "The initramfs file to write")->required();
  c->add_option("--init", o->init, "The static binary to put at /init")->capture_default_str();
  c->add_flag("--no-gzip", o->no_gzip, "Write the cpio archive uncompressed");
  c->footer(
      "The configuration's keys: disk, layer (block devices in the guest), argv, env, workdir, "
      "uid, gid, port (the vsock port the guest init serves). See docs/vm.md.");
  c->callback([o, action] {
    *action = [o] {
      std::string text = files::read(o->config);
      runtime::guest::decode_config(text);  // one clear line for a bad one
      files::write_atomically(o->output, vm::initramfs::for_guest(o->init, text, !o->no_gzip),
                              0644);
      return 0;
    };
  });
}

}  // namespace openshell::cli
