// What must hold whatever a guest puts in its memory and writes to a virtio
// device's registers: the device never crashes (the fuzz target runs with
// ASan and UBSan), a blk device never grows or shrinks its disk (every
// request is checked against the capacity), a fatal device names itself and
// touches guest memory no more, and vsock keeps its connection limit.
// Shared by the fuzz target and the unit test that replays its corpus.
//
// An input: byte 0 picks the device and the setup (bit 0: vsock, else blk;
// bit 1: the usual bring-up with every queue at a fixed place; bit 2: offer
// indirect descriptors in it; bit 3: a read-only disk), byte 1 the queues'
// size (1 << (byte & 7)), byte 2 a count of operations, five bytes each (a
// register's offset / 4 and a 32-bit value, or 0xff: service the device,
// 0xfe: a host-side action), then guest memory from address 0.
#pragma once

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"
#include "vm/guest_memory.h"
#include "vm/virtio_blk.h"
#include "vm/virtio_mmio.h"
#include "vm/virtio_vsock.h"

namespace openshell::fuzz {

inline constexpr uint64_t kFuzzMemoryBytes = 2ull << 20;
inline constexpr uint64_t kFuzzDiskBytes = 64 * 512;
// Where the usual bring-up puts queue q (128 entries at most): descriptors,
// then the available ring 0x800 on, the used ring 0xa00 on.
inline constexpr uint64_t fuzz_queue_at(uint16_t q) { return q * 0x1000ull; }

namespace detail {

inline vm::GuestMemory& fuzz_memory() {
  static vm::GuestMemory memory = vm::GuestMemory::create(kFuzzMemoryBytes);
  return memory;
}

inline void set(vm::VirtioMmio& device, uint64_t offset, uint32_t value) {
  device.write(offset, reinterpret_cast<const uint8_t*>(&value), 4);
}

inline void bring_up(vm::VirtioMmio& device, size_t queues, uint16_t size, bool indirect) {
  using namespace vm::virtio_mmio;
  set(device, kStatus, kAcknowledge | kDriver);
  set(device, kDriverFeaturesSel, 0);
  set(device, kDriverFeatures, indirect ? 1u << vm::kVirtioRingIndirectDesc : 0);
  set(device, kDriverFeaturesSel, 1);
  set(device, kDriverFeatures, 1);  // VERSION_1
  set(device, kStatus, kAcknowledge | kDriver | kFeaturesOk);
  for (uint16_t q = 0; q < queues; ++q) {
    set(device, kQueueSel, q);
    set(device, kQueueNum, size);
    set(device, kQueueDescLow, static_cast<uint32_t>(fuzz_queue_at(q)));
    set(device, kQueueDriverLow, static_cast<uint32_t>(fuzz_queue_at(q) + 0x800));
    set(device, kQueueDeviceLow, static_cast<uint32_t>(fuzz_queue_at(q) + 0xa00));
    set(device, kQueueReady, 1);
  }
  set(device, kStatus, kAcknowledge | kDriver | kFeaturesOk | kDriverOk);
}

inline void notify_all(vm::VirtioMmio& device, size_t queues) {
  for (uint32_t q = 0; q < queues; ++q) set(device, vm::virtio_mmio::kQueueNotify, q);
  device.service();
}

}  // namespace detail

struct VirtqueueOutcome {
  std::string violation;  // "" when every property holds
  std::string fatal;      // the device's fatal(), if it went fatal
  uint32_t used = 0;      // chains the device returned, in the usual places
};

inline VirtqueueOutcome virtqueue_outcome(std::string_view input) {
  VirtqueueOutcome outcome;
  if (input.size() < 3) return outcome;
  auto byte = [&](size_t i) { return static_cast<uint8_t>(input[i]); };
  bool vsock = byte(0) & 1;
  bool standard = byte(0) & 2;
  bool indirect = byte(0) & 4;
  bool read_only = byte(0) & 8;
  uint16_t size = static_cast<uint16_t>(1u << (byte(1) & 7));
  size_t ops = std::min<size_t>(byte(2), 64);
  size_t at = 3;

  vm::GuestMemory& memory = detail::fuzz_memory();
  std::memset(memory.host_base(), 0, memory.size());
  size_t ops_end = std::min(input.size(), at + 5 * ops);
  std::string_view image = input.substr(ops_end);
  memory.write(0, image.data(), std::min<uint64_t>(image.size(), memory.size()));

  int disk = -1;
  std::unique_ptr<vm::VirtioMmio> device;
  vm::VirtioVsock* socks = nullptr;
  std::vector<UniqueFd> accepted;
  if (vsock) {
    auto v = std::make_unique<vm::VirtioVsock>(memory);
    v->listen(1024, [&](UniqueFd fd, uint32_t) { accepted.push_back(std::move(fd)); });
    socks = v.get();
    device = std::move(v);
  } else {
    disk = ::memfd_create("virtqueue-fuzz", MFD_CLOEXEC);
    if (disk < 0 || ::ftruncate(disk, kFuzzDiskBytes) != 0) {
      outcome.violation = "no memfd for the disk";
      return outcome;
    }
    device = std::make_unique<vm::VirtioBlk>(memory, UniqueFd(::dup(disk)), read_only, "fuzz");
  }
  size_t queues = vsock ? 3 : 1;
  if (standard) {
    detail::bring_up(*device, queues, size, indirect);
    detail::notify_all(*device, queues);
  }
  std::vector<UniqueFd> connected;
  for (; at + 5 <= ops_end; at += 5) {
    uint8_t reg = byte(at);
    uint32_t value;
    std::memcpy(&value, input.data() + at + 1, 4);
    if (reg == 0xff) {
      device->service();
    } else if (reg == 0xfe && socks) {
      // The host's side: data to every guest connection, or a connection.
      for (UniqueFd& fd : accepted)
        ::send(fd.get(), input.data(), std::min<size_t>(value & 0xfff, input.size()),
               MSG_DONTWAIT | MSG_NOSIGNAL);
      if (value & 0x80000000u) {
        try {
          connected.push_back(socks->connect(value & 0xffff));
        } catch (const Error&) {
        }
      }
      device->service();
    } else {
      detail::set(*device, static_cast<uint64_t>(reg) * 4, value);
    }
  }
  detail::notify_all(*device, queues);
  detail::notify_all(*device, queues);

  std::string& broken = outcome.violation;
  std::string fatal = device->fatal();
  outcome.fatal = fatal;
  for (uint16_t q = 0; q < queues; ++q) {
    uint16_t idx = 0;
    memory.read(fuzz_queue_at(q) + 0xa00 + 2, &idx, 2);
    outcome.used += idx;
  }
  if (!fatal.empty()) {
    if (fatal.rfind(device->name() + ": ", 0) != 0) broken = "a fatal reason without the device";
    std::string before(reinterpret_cast<const char*>(memory.host_base()), memory.size());
    if (standard) detail::bring_up(*device, queues, size, indirect);  // refused: still fatal
    detail::notify_all(*device, queues);
    if (std::memcmp(before.data(), memory.host_base(), memory.size()) != 0)
      broken = "a fatal device wrote to guest memory";
  }
  if (socks && socks->connection_count() > vm::virtio_vsock::kMaxConnections)
    broken = "more vsock connections than the limit";
  device.reset();
  if (disk >= 0) {
    struct stat st {};
    ::fstat(disk, &st);
    if (static_cast<uint64_t>(st.st_size) != kFuzzDiskBytes) broken = "the disk changed size";
    ::close(disk);
  }
  return outcome;
}

// "" when every property holds; otherwise which one broke.
inline std::string virtqueue_violation(std::string_view input) {
  return virtqueue_outcome(input).violation;
}

}  // namespace openshell::fuzz
