// A small virtio driver for the device tests: it does what a guest's driver
// does, through MmioDevice::read/write and rings laid out in a GuestMemory,
// so that a test sees the device exactly as a guest would.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "vm/guest_memory.h"
#include "vm/virtio_mmio.h"

namespace openshell::vm::testing {

inline constexpr uint64_t kRingsAt = 0x10000;     // queue i: + i * kRingStride
inline constexpr uint64_t kRingStride = 0x4000;   // desc, then avail at +0x1000, used at +0x2000
inline constexpr uint64_t kBuffersAt = 0x100000;  // buffers the tests allocate
inline constexpr uint64_t kMemoryBytes = 4ull << 20;

struct Segment {
  uint64_t address = 0;
  uint32_t length = 0;
  bool writable = false;
};

struct Used {
  uint32_t id = 0;
  uint32_t length = 0;
};

class Driver {
 public:
  Driver(VirtioMmio& device, GuestMemory& memory) : device_(device), memory_(memory) {}

  uint32_t get(uint64_t offset) {
    uint32_t value = 0;
    device_.read(offset, reinterpret_cast<uint8_t*>(&value), 4);
    return value;
  }
  void set(uint64_t offset, uint32_t value) {
    device_.write(offset, reinterpret_cast<const uint8_t*>(&value), 4);
  }
  uint64_t config64(uint64_t offset) {
    uint64_t value = 0;
    device_.read(virtio_mmio::kConfig + offset, reinterpret_cast<uint8_t*>(&value), 8);
    return value;
  }
  uint32_t config32(uint64_t offset) {
    uint32_t value = 0;
    device_.read(virtio_mmio::kConfig + offset, reinterpret_cast<uint8_t*>(&value), 4);
    return value;
  }

  uint64_t device_features() {
    set(virtio_mmio::kDeviceFeaturesSel, 0);
    uint64_t low = get(virtio_mmio::kDeviceFeatures);
    set(virtio_mmio::kDeviceFeaturesSel, 1);
    return low | (static_cast<uint64_t>(get(virtio_mmio::kDeviceFeatures)) << 32);
  }

  // Reset, ACKNOWLEDGE, DRIVER, the features, FEATURES_OK; true when the
  // device kept FEATURES_OK.
  bool negotiate(uint64_t features) {
    set(virtio_mmio::kStatus, 0);
    sizes_.clear(), next_desc_.clear(), avail_idx_.clear(), used_seen_.clear();
    set(virtio_mmio::kStatus, virtio_mmio::kAcknowledge);
    set(virtio_mmio::kStatus, virtio_mmio::kAcknowledge | virtio_mmio::kDriver);
    set(virtio_mmio::kDriverFeaturesSel, 0);
    set(virtio_mmio::kDriverFeatures, static_cast<uint32_t>(features));
    set(virtio_mmio::kDriverFeaturesSel, 1);
    set(virtio_mmio::kDriverFeatures, static_cast<uint32_t>(features >> 32));
    uint32_t status = virtio_mmio::kAcknowledge | virtio_mmio::kDriver | virtio_mmio::kFeaturesOk;
    set(virtio_mmio::kStatus, status);
    return get(virtio_mmio::kStatus) & virtio_mmio::kFeaturesOk;
  }

  static uint64_t desc_at(uint16_t q) { return kRingsAt + q * kRingStride; }
  static uint64_t avail_at(uint16_t q) { return desc_at(q) + 0x1000; }
  static uint64_t used_at(uint16_t q) { return desc_at(q) + 0x2000; }

  void setup_queue(uint16_t q, uint16_t size) {
    set(virtio_mmio::kQueueSel, q);
    set(virtio_mmio::kQueueNum, size);
    set(virtio_mmio::kQueueDescLow, static_cast<uint32_t>(desc_at(q)));
    set(virtio_mmio::kQueueDescHigh, 0);
    set(virtio_mmio::kQueueDriverLow, static_cast<uint32_t>(avail_at(q)));
    set(virtio_mmio::kQueueDriverHigh, 0);
    set(virtio_mmio::kQueueDeviceLow, static_cast<uint32_t>(used_at(q)));
    set(virtio_mmio::kQueueDeviceHigh, 0);
    set(virtio_mmio::kQueueReady, 1);
    if (sizes_.size() <= q)
      sizes_.resize(q + 1, 0), next_desc_.resize(q + 1, 0), avail_idx_.resize(q + 1, 0),
          used_seen_.resize(q + 1, 0);
    sizes_[q] = size;
  }

  // Everything a driver does before it may use the device.
  bool bring_up(uint64_t features, uint16_t queues, uint16_t size) {
    if (!negotiate(features)) return false;
    for (uint16_t q = 0; q < queues; ++q) setup_queue(q, size);
    set(virtio_mmio::kStatus, get(virtio_mmio::kStatus) | virtio_mmio::kDriverOk);
    return get(virtio_mmio::kStatus) & virtio_mmio::kDriverOk;
  }

  // Fresh guest memory of `bytes` (zeroed), for buffers.
  uint64_t alloc(uint64_t bytes) {
    uint64_t at = next_buffer_;
    next_buffer_ += (bytes + 15) & ~15ull;
    std::memset(memory_.span(at, bytes), 0, bytes);
    return at;
  }
  uint8_t* host(uint64_t address, uint64_t bytes) { return memory_.span(address, bytes); }

  // Writes a descriptor as a driver would, at index `index` of queue q.
  void write_descriptor(uint16_t q, uint16_t index, uint64_t address, uint32_t length,
                        uint16_t flags, uint16_t next) {
    uint8_t d[16];
    std::memcpy(d, &address, 8);
    std::memcpy(d + 8, &length, 4);
    std::memcpy(d + 12, &flags, 2);
    std::memcpy(d + 14, &next, 2);
    memory_.write(desc_at(q) + 16ull * index, d, 16);
  }

  // Makes `head` available in queue q (does not notify).
  void make_available(uint16_t q, uint16_t head) {
    uint16_t slot = avail_idx_[q] % sizes_[q];
    memory_.write(avail_at(q) + 4 + 2ull * slot, &head, 2);
    ++avail_idx_[q];
    set_avail_idx(q, avail_idx_[q]);
  }
  void set_avail_idx(uint16_t q, uint16_t idx) {
    __atomic_store_n(reinterpret_cast<uint16_t*>(host(avail_at(q) + 2, 2)), idx, __ATOMIC_RELEASE);
  }

  // Lays the chain out in fresh descriptors and makes it available.
  uint16_t post(uint16_t q, const std::vector<Segment>& chain) {
    uint16_t head = next_desc_[q];
    for (size_t i = 0; i < chain.size(); ++i) {
      uint16_t index = (head + i) % sizes_[q];
      uint16_t next = (head + i + 1) % sizes_[q];
      uint16_t flags = (chain[i].writable ? 2 : 0) | (i + 1 < chain.size() ? 1 : 0);
      write_descriptor(q, index, chain[i].address, chain[i].length, flags, next);
    }
    next_desc_[q] = (head + chain.size()) % sizes_[q];
    make_available(q, head);
    return head;
  }

  void notify(uint16_t q) { set(virtio_mmio::kQueueNotify, q); }

  uint16_t used_idx(uint16_t q) {
    return __atomic_load_n(reinterpret_cast<uint16_t*>(host(used_at(q) + 2, 2)), __ATOMIC_ACQUIRE);
  }

  // Waits (on the interrupt eventfd, 30 s at most) for the next used
  // element of queue q; false when none came or the device went fatal.
  bool wait_used(uint16_t q, Used& used) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (used_idx(q) == used_seen_[q]) {
      if (!device_.fatal().empty() || std::chrono::steady_clock::now() > deadline) return false;
      pollfd p{device_.interrupt_fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) {
        uint64_t count;
        [[maybe_unused]] ssize_t n = ::read(device_.interrupt_fd(), &count, sizeof count);
        ++interrupts_;
        set(virtio_mmio::kInterruptAck, get(virtio_mmio::kInterruptStatus));
      }
    }
    uint16_t slot = used_seen_[q] % sizes_[q];
    memory_.read(used_at(q) + 4 + 8ull * slot, &used.id, 4);
    memory_.read(used_at(q) + 8 + 8ull * slot, &used.length, 4);
    ++used_seen_[q];
    return true;
  }

  // Waits until the device is fatal (30 s at most); its reason.
  std::string wait_fatal() {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (device_.fatal().empty() && std::chrono::steady_clock::now() < deadline) {
      pollfd p{device_.interrupt_fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) == 1) {
        uint64_t count;
        [[maybe_unused]] ssize_t n = ::read(device_.interrupt_fd(), &count, sizeof count);
      }
    }
    return device_.fatal();
  }

  int interrupts() const { return interrupts_; }
  // The used ring can be seen before the interrupt that follows it: waits
  // (up to 5 s) for one to have been raised, counted or still pending.
  bool wait_interrupt() {
    if (interrupts_ > 0) return true;
    pollfd p{device_.interrupt_fd(), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) return false;
    uint64_t count;
    [[maybe_unused]] ssize_t n = ::read(device_.interrupt_fd(), &count, sizeof count);
    ++interrupts_;
    set(virtio_mmio::kInterruptAck, get(virtio_mmio::kInterruptStatus));
    return true;
  }

 private:
  VirtioMmio& device_;
  GuestMemory& memory_;
  uint64_t next_buffer_ = kBuffersAt;
  std::vector<uint16_t> sizes_, next_desc_, avail_idx_, used_seen_;
  int interrupts_ = 0;
};

}  // namespace openshell::vm::testing
