// openshell __vmm: one confined VMM (src/vm/runner.h), for the supervisor of
// a --vm sandbox and for testing the VMM from the command line. Hidden: it
// is no command of the user's.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "base/error.h"
#include "cli/commands.h"
#include "vm/runner.h"

namespace openshell::cli {

namespace {

std::atomic<bool> stop_requested{false};
std::atomic<int> stop_signal{0};

void on_stop(int signal) {
  stop_signal = signal;
  stop_requested = true;
}

// 0: the guest reset, powered off or halted; 2: a triple fault or an
// error of the guest or of KVM (the reason on stderr); 128 + N: stopped by
// signal N. openshell's own failures (bad input, no KVM) are 125.
int exit_status(const vm::VmEnd& end) {
  switch (end.reason) {
    case vm::EndReason::kGuestReset:
    case vm::EndReason::kPoweredOff:
    case vm::EndReason::kHalted:
      return 0;
    case vm::EndReason::kStopped:
      return 128 + stop_signal.load();
    case vm::EndReason::kTripleFault:
    case vm::EndReason::kError:
    case vm::EndReason::kRunning:
      break;
  }
  std::fprintf(stderr, "openshell: the VM ended: %s\n", end.detail.c_str());
  return 2;
}

}  // namespace

void add_vmm_command(CLI::App& app, Action* action) {
  auto spec = std::make_shared<vm::RunSpec>();
  auto entry = std::make_shared<std::string>("long");
  spec->cmdline = "console=ttyS0 reboot=k panic=-1";
  CLI::App* c = app.add_subcommand(
      "__vmm", "Run one micro-VM in this process, confined, its serial port on stdout");
  c->group("");
  c->add_option("--kernel", spec->kernel,
                "A bzImage or an uncompressed vmlinux with a PVH entry note");
  c->add_option("--initramfs", spec->initramfs, "The initramfs for the kernel");
  c->add_option("--cmdline", spec->cmdline, "The kernel's command line")->capture_default_str();
  c->add_option("--flat", spec->flat, "Instead of a kernel: a flat guest binary (the VMM's tests)");
  c->add_option("--entry", *entry, "How a flat guest starts: real (at 0x10000) or long (at 1 MiB)")
      ->check(CLI::IsMember({"real", "long"}));
  c->add_option("--memory", spec->memory_mib, "Guest memory in MiB (even)")->default_val(256);
  c->add_option("--vcpus", spec->vcpus, "vCPUs")->default_val(1)->check(CLI::Range(1, 64));
  c->footer(
      "Opens /dev/kvm, builds the VM, then confines itself for good: its own namespaces, an empty "
      "root, no capabilities, no_new_privs, a seccomp filter per thread. Exits 0 when the guest "
      "resets or powers off, 2 when it ends in a triple fault or an error (the reason on stderr), "
      "128+N when stopped by signal N (SIGTERM, SIGINT), 125 when it cannot start. See "
      "docs/vm.md.");
  c->callback([spec, entry, action] {
    *action = [spec, entry] {
      spec->flat_mode = *entry == "real" ? vm::CpuEntry::Mode::kReal : vm::CpuEntry::Mode::kLong;
      spec->serial_fd = 1;
      spec->stop = &stop_requested;
      struct sigaction act {};
      act.sa_handler = on_stop;
      sigemptyset(&act.sa_mask);
      ::sigaction(SIGTERM, &act, nullptr);
      ::sigaction(SIGINT, &act, nullptr);
      std::fflush(stdout);
      return exit_status(vm::run_confined(*spec));
    };
  });
}

}  // namespace openshell::cli
