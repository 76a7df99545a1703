// What the VMM and a device agree on. A device is a 4 KiB MMIO window (see
// layout.h); the vCPU thread that took the exit calls read() or write()
// with the offset into the window. A device raises its interrupt by writing
// to an eventfd that the VMM has bound to its GSI with KVM_IRQFD, and may
// ask for doorbells: a guest write of `value` at `offset` signals an
// eventfd (KVM_IOEVENTFD) instead of exiting, and the device's own thread
// waits on it. Tests drive a device with the same calls, without KVM.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace openshell::vm {

class GuestMemory;

struct Doorbell {
  uint64_t offset = 0;  // into the device's window
  uint32_t value = 0;   // the value written (KVM_IOEVENTFD_FLAG_DATAMATCH)
  int event_fd = -1;    // the device's; the VMM registers it
};

class MmioDevice {
 public:
  virtual ~MmioDevice() = default;
  // "virtio-blk", "virtio-vsock": for messages and the guest's command line.
  virtual std::string name() const = 0;
  // len is 1, 2, 4 or 8; a read of what the device does not have gives
  // zeros, a write of it is ignored (and counted: see faults()).
  virtual void read(uint64_t offset, uint8_t* data, uint32_t len) = 0;
  virtual void write(uint64_t offset, const uint8_t* data, uint32_t len) = 0;
  virtual std::vector<Doorbell> doorbells() { return {}; }
  // The eventfd the device writes to raise its interrupt, or -1 for none;
  // the VMM binds it with KVM_IRQFD to layout::device_irq(index).
  virtual int interrupt_fd() const { return -1; }
  // Set when the guest has broken the device's contract beyond recovery
  // (a runaway queue, a loop in a descriptor chain): the VMM ends the
  // sandbox in Error with this reason. Empty while the device is healthy.
  virtual std::string fatal() const { return {}; }
};

}  // namespace openshell::vm
