// One confined VMM run, start to end, in the calling process: what
// `openshell __vmm` does, and what the supervisor will call for a --vm
// sandbox. Reads the kernel (or a flat test guest), opens /dev/kvm, builds
// the VM, confines the process (confine.h: this is irreversible, so the
// caller is a process of its own), runs the guest with its serial port on
// `serial_fd`, and returns how the VM ended.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "vm/vm.h"

namespace openshell::vm {

struct RunSpec {
  // Linux: a bzImage or a PVH vmlinux, an optional initramfs, its command line.
  std::string kernel;
  std::string initramfs;
  std::string cmdline;
  // Or a flat guest: real mode at 0x10000 (CS = 0x1000, IP = 0), or long
  // mode at 1 MiB entered by the boot code.
  std::string flat;
  CpuEntry::Mode flat_mode = CpuEntry::Mode::kLong;

  uint64_t memory_mib = 256;
  uint32_t vcpus = 1;
  int serial_fd = 1;
  // Set (by a signal handler) to stop the VM; polled every 20 ms.
  const std::atomic<bool>* stop = nullptr;
};

inline constexpr uint64_t kFlatRealModeLoad = 0x10000;

// Throws Error, one line, for anything before the guest runs (a file that
// cannot be read, a bad kernel, no KVM); every end after that is a VmEnd.
VmEnd run_confined(const RunSpec& spec);

}  // namespace openshell::vm
