// One confined VMM run, start to end, in the calling process: what
// `openshell __vmm` does, and what the supervisor will call for a --vm
// sandbox. Reads the kernel (or a flat test guest), opens /dev/kvm, builds
// the VM and its devices (the disks, the vsock device when there is a
// channel), confines the process (confine.h: this is irreversible, so the
// caller is a process of its own), runs the guest with its serial port on
// `serial_fd`, serves the channel to the supervisor (host_channel.h) on the
// main thread, and returns how the VM ended.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "vm/vm.h"

namespace openshell::vm {

struct RunSpec {
  // Linux: a bzImage or a PVH vmlinux, its initramfs (none, or several
  // archives concatenated in order, each padded to 4 bytes: the kernel
  // reads a series of cpio archives), its command line.
  std::string kernel;
  std::vector<std::string> initramfs;
  std::string cmdline;
  // Or a flat guest: real mode at 0x10000 (CS = 0x1000, IP = 0), or long
  // mode at 1 MiB entered by the boot code.
  std::string flat;
  CpuEntry::Mode flat_mode = CpuEntry::Mode::kLong;

  uint64_t memory_mib = 256;
  uint32_t vcpus = 1;
  int serial_fd = 1;

  // virtio-blk disks over these files, in windows 0, 1, ... (/dev/vda,
  // /dev/vdb, ... in a Linux guest, whose command line gets each device's
  // virtio_mmio.device= entry). A read-only one is opened O_RDONLY and
  // offers VIRTIO_BLK_F_RO.
  struct Disk {
    std::string path;
    bool read_only = false;
  };
  std::vector<Disk> disks;
  // The supervisor's end of the channel (a SOCK_SEQPACKET socket), or -1.
  // With one, a virtio-vsock device follows the disks; guest connections to
  // `host_ports` come up the channel as `accepted`, `connect` goes down it.
  // When the peer closes the channel the VM is stopped (kStopped).
  int channel_fd = -1;
  std::vector<uint32_t> host_ports;
  // Set (by a signal handler) to stop the VM; polled every 20 ms.
  const std::atomic<bool>* stop = nullptr;
};

inline constexpr uint64_t kFlatRealModeLoad = 0x10000;

// Throws Error, one line, for anything before the guest runs (a file that
// cannot be read, a bad kernel, no KVM); every end after that is a VmEnd.
VmEnd run_confined(const RunSpec& spec);

}  // namespace openshell::vm
