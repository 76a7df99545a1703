// openshell __vmm: one confined VMM (src/vm/runner.h), for the supervisor of
// a --vm sandbox and for testing the VMM from the command line. Hidden: it
// is no command of the user's.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

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
      // No signal: the supervisor closed the channel, which stops the VM as SIGTERM does.
      return 128 + (stop_signal.load() != 0 ? stop_signal.load() : SIGTERM);
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
  c->add_option("--initramfs", spec->initramfs,
                "The initramfs for the kernel (repeatable: the archives are concatenated in order)")
      ->type_name("FILE")
      ->allow_extra_args(false);
  c->add_option("--cmdline", spec->cmdline, "The kernel's command line")->capture_default_str();
  c->add_option("--flat", spec->flat, "Instead of a kernel: a flat guest binary (the VMM's tests)");
  c->add_option("--entry", *entry, "How a flat guest starts: real (at 0x10000) or long (at 1 MiB)")
      ->check(CLI::IsMember({"real", "long"}));
  c->add_option("--memory", spec->memory_mib, "Guest memory in MiB (even)")->default_val(256);
  c->add_option("--vcpus", spec->vcpus, "vCPUs")->default_val(1)->check(CLI::Range(1, 64));
  auto disks = std::make_shared<std::vector<std::string>>();
  auto read_only_disks = std::make_shared<std::vector<std::string>>();
  CLI::Option* disk_option =
      c->add_option("--disk", *disks,
                    "A virtio-blk disk over FILE, read and written (repeatable: /dev/vda, "
                    "/dev/vdb, ... in the order given with --disk-ro)")
          ->type_name("FILE")
          ->allow_extra_args(false);
  CLI::Option* read_only_option =
      c->add_option("--disk-ro", *read_only_disks,
                    "A read-only virtio-blk disk over FILE (VIRTIO_BLK_F_RO; repeatable)")
          ->type_name("FILE")
          ->allow_extra_args(false);
  c->add_option("--channel-fd", spec->channel_fd,
                "The VMM's end of the supervisor's SOCK_SEQPACKET channel: adds a virtio-vsock "
                "device (guest CID 3); the VM stops when the other end closes")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--host-port", spec->host_ports,
                "A vsock port the host listens on: each guest connection to it is passed up the "
                "channel (repeatable; needs --channel-fd)")
      ->allow_extra_args(false);
  c->footer(
      "Opens the disks and /dev/kvm, builds the VM, then confines itself for good: its own "
      "namespaces, an empty root, no capabilities, no_new_privs, a seccomp filter per thread, "
      "SIGKILL when its parent dies. Exits 0 when the guest resets or powers off, 2 when it ends "
      "in a triple fault or an error (the reason on stderr), 128+N when stopped by signal N "
      "(SIGTERM, SIGINT), 143 when the channel's other end closes, 125 when it cannot start. See "
      "docs/vm.md.");
  c->callback([spec, entry, action, c, disk_option, read_only_option, disks, read_only_disks] {
    // The disks in the order given, whichever of the two options named each.
    spec->disks.clear();
    size_t next_disk = 0;
    size_t next_read_only = 0;
    for (const CLI::Option* option : c->parse_order()) {
      if (option == disk_option && next_disk < disks->size())
        spec->disks.push_back({(*disks)[next_disk++], false});
      else if (option == read_only_option && next_read_only < read_only_disks->size())
        spec->disks.push_back({(*read_only_disks)[next_read_only++], true});
    }
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
