// The virtio-mmio transport, version 2 (virtio 1.x, 4.2): the registers a
// driver reads and writes in the device's 4 KiB window, the status state
// machine, feature negotiation, the queues' setup, QueueNotify and the
// interrupt. A device (virtio_blk.h, virtio_vsock.h) derives from it and
// adds its config space (at 0x100) and what it does with its queues.
//
// Threads: the vCPU thread calls read() and write(); the device's work runs
// on its own thread (start()), which waits on the queues' doorbells (one
// eventfd per queue: a KVM_IOEVENTFD, or a plain write to QueueNotify) and on
// the device's own events. service() does that work once on the caller's
// thread, for tests and the fuzzer. One mutex covers the registers, the
// queues and the device's state.
//
// The interrupt is an eventfd (interrupt_fd()) that the VMM binds to the
// device's GSI with KVM_IRQFD; InterruptStatus says why it fired.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.h"
#include "vm/device.h"
#include "vm/virtqueue.h"

namespace openshell::vm {

namespace virtio_mmio {
inline constexpr uint32_t kMagic = 0x74726976;  // "virt"
inline constexpr uint32_t kVersion = 2;
inline constexpr uint32_t kVendorId = 0x4c48534f;  // "OSHL"

inline constexpr uint64_t kMagicValue = 0x000;
inline constexpr uint64_t kVersionReg = 0x004;
inline constexpr uint64_t kDeviceId = 0x008;
inline constexpr uint64_t kVendorIdReg = 0x00c;
inline constexpr uint64_t kDeviceFeatures = 0x010;
inline constexpr uint64_t kDeviceFeaturesSel = 0x014;
inline constexpr uint64_t kDriverFeatures = 0x020;
inline constexpr uint64_t kDriverFeaturesSel = 0x024;
inline constexpr uint64_t kQueueSel = 0x030;
inline constexpr uint64_t kQueueNumMax = 0x034;
inline constexpr uint64_t kQueueNum = 0x038;
inline constexpr uint64_t kQueueReady = 0x044;
inline constexpr uint64_t kQueueNotify = 0x050;
inline constexpr uint64_t kInterruptStatus = 0x060;
inline constexpr uint64_t kInterruptAck = 0x064;
inline constexpr uint64_t kStatus = 0x070;
inline constexpr uint64_t kQueueDescLow = 0x080;
inline constexpr uint64_t kQueueDescHigh = 0x084;
inline constexpr uint64_t kQueueDriverLow = 0x090;
inline constexpr uint64_t kQueueDriverHigh = 0x094;
inline constexpr uint64_t kQueueDeviceLow = 0x0a0;
inline constexpr uint64_t kQueueDeviceHigh = 0x0a4;
inline constexpr uint64_t kConfigGeneration = 0x0fc;
inline constexpr uint64_t kConfig = 0x100;

// Device status bits (virtio 1.x, 2.1).
inline constexpr uint32_t kAcknowledge = 1;
inline constexpr uint32_t kDriver = 2;
inline constexpr uint32_t kDriverOk = 4;
inline constexpr uint32_t kFeaturesOk = 8;
inline constexpr uint32_t kDeviceNeedsReset = 64;
inline constexpr uint32_t kFailed = 128;

// InterruptStatus bits.
inline constexpr uint32_t kUsedBuffer = 1;
inline constexpr uint32_t kConfigChange = 2;

inline constexpr uint32_t kFeatureVersion1 = 32;  // VIRTIO_F_VERSION_1
}  // namespace virtio_mmio

// "virtio_mmio.device=4K@0xd0000000:5": the kernel command line's
// declaration of the device at window `index` (layout::mmio_window,
// layout::device_irq).
std::string virtio_mmio_cmdline(uint32_t index);

class VirtioMmio : public MmioDevice {
 public:
  // A derived device's destructor calls stop() first, so that the thread
  // never runs a hook of a half-destroyed device.
  ~VirtioMmio() override;

  void read(uint64_t offset, uint8_t* data, uint32_t len) override;
  void write(uint64_t offset, const uint8_t* data, uint32_t len) override;
  std::vector<Doorbell> doorbells() override;
  std::string fatal() const override;

  int interrupt_fd() const override { return interrupt_.get(); }
  // Accesses that did not fit the contract and were ignored: a register the
  // transport lacks, a width other than 32 bits, a queue change while ready.
  uint64_t faults() const { return faults_.load(); }
  uint32_t status() const;

  // The device's thread, until stop() (or the destructor). `on_thread`
  // runs on it first (the VMM installs the device thread's seccomp filter
  // there); what it returns, if not empty, makes the device fatal.
  void start(std::function<std::string()> on_thread = {});
  void stop();
  // Handles every pending doorbell and device event now, on this thread.
  void service();

 protected:
  VirtioMmio(const GuestMemory& memory, uint32_t device_id, uint64_t device_features,
             const std::vector<uint16_t>& queue_max_sizes);

  // Hooks, each called with mutex_ held.
  virtual void read_config(uint64_t offset, uint8_t* data, uint32_t len) = 0;
  virtual void write_config(uint64_t offset, const uint8_t* data, uint32_t len);
  // The driver notified `queue` (DRIVER_OK set, the device healthy).
  virtual void queue_notified(uint16_t queue) = 0;
  // The device's own events fired (see event_fd()).
  virtual void device_event() {}
  // The driver reset the device: forget every request and connection.
  virtual void device_reset() {}
  // A pollable fd of the device's own (an epoll of its sockets), or -1.
  virtual int event_fd() const { return -1; }

  Virtqueue& queue(uint16_t index) { return queues_[index]; }
  size_t queue_count() const { return queues_.size(); }
  const GuestMemory& memory() const { return memory_; }
  uint64_t driver_features() const { return driver_features_; }
  bool running() const;  // DRIVER_OK, not FAILED, not fatal
  // Returns `head` to the driver and raises the interrupt if it wants one.
  void complete(uint16_t queue, uint16_t head, uint32_t written);
  // The guest broke the contract: the device stops, fatal() says why.
  void set_fatal(const std::string& reason);
  // Pops the next chain of `queue`; a broken queue makes the device fatal.
  bool next_chain(uint16_t queue, Chain& chain);
  // Wakes the device's thread to run device_event() (from any thread).
  void kick();
  void count_fault() { ++faults_; }

  mutable std::mutex mutex_;

 private:
  uint32_t read_register(uint64_t offset);
  void write_register(uint64_t offset, uint32_t value);
  void write_status(uint32_t value);
  void reset();
  void raise(uint32_t why);
  void run(const std::function<std::string()>& on_thread);

  const GuestMemory& memory_;
  uint32_t device_id_;
  uint64_t device_features_;
  std::vector<Virtqueue> queues_;
  std::vector<UniqueFd> doorbells_;
  UniqueFd interrupt_;
  UniqueFd kick_;
  UniqueFd stop_;
  UniqueFd loop_;  // the thread's epoll, made before the thread
  std::thread thread_;
  std::atomic<uint64_t> faults_{0};

  uint32_t status_ = 0;
  uint32_t device_features_sel_ = 0;
  uint32_t driver_features_sel_ = 0;
  uint64_t driver_features_ = 0;
  uint32_t queue_sel_ = 0;
  uint32_t interrupt_status_ = 0;
  uint32_t config_generation_ = 0;
  std::string fatal_;
};

}  // namespace openshell::vm
