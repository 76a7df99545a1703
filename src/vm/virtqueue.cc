#include "vm/virtqueue.h"

#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "vm/guest_memory.h"

namespace openshell::vm {
namespace {

// The layout of the rings (virtio 1.x, 2.6); x86 is little-endian like
// virtio 1.x, so fields are read as they lie.
constexpr uint64_t kDescSize = 16;
constexpr uint16_t kDescNext = 1;
constexpr uint16_t kDescWrite = 2;
constexpr uint16_t kDescIndirect = 4;
constexpr uint16_t kAvailNoInterrupt = 1;

struct Descriptor {
  uint64_t address;
  uint32_t length;
  uint16_t flags;
  uint16_t next;
};
static_assert(sizeof(Descriptor) == kDescSize);

// The guest writes these while the device reads them: each is read once,
// into a copy, so that a check and the use that follows see the same value.
Descriptor load_descriptor(const uint8_t* at) {
  Descriptor d;
  std::memcpy(&d, at, sizeof d);
  return d;
}

uint16_t load_u16(const uint8_t* at) {
  return __atomic_load_n(reinterpret_cast<const uint16_t*>(at), __ATOMIC_ACQUIRE);
}

void store_u16(uint8_t* at, uint16_t value) {
  __atomic_store_n(reinterpret_cast<uint16_t*>(at), value, __ATOMIC_RELEASE);
}

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%" PRIx64, value);
  return text;
}

// A ring of `bytes` at `address`, aligned to `align`, inside guest RAM.
uint8_t* ring(const GuestMemory& memory, const char* what, uint64_t address, uint64_t bytes,
              uint64_t align, std::string& wrong) {
  if (address % align != 0) {
    wrong = std::string(what) + " at " + hex(address) + " is not aligned to " +
            std::to_string(align) + " bytes";
    return nullptr;
  }
  uint8_t* at = memory.span(address, bytes);
  if (at == nullptr)
    wrong = std::string(what) + " at " + hex(address) + " (" + std::to_string(bytes) +
            " bytes) is outside guest RAM";
  return at;
}

}  // namespace

std::string Virtqueue::activate(const GuestMemory& memory, bool indirect) {
  if (size == 0 || size > max_size_ || (size & (size - 1)) != 0)
    return "queue size " + std::to_string(size) + " is not a power of two up to " +
           std::to_string(max_size_);
  std::string wrong;
  uint8_t* desc = ring(memory, "the descriptor table", desc_address, kDescSize * size, 16, wrong);
  if (desc == nullptr) return wrong;
  uint8_t* avail = ring(memory, "the available ring", driver_address, 6 + 2ull * size, 2, wrong);
  if (avail == nullptr) return wrong;
  uint8_t* used = ring(memory, "the used ring", device_address, 6 + 8ull * size, 4, wrong);
  if (used == nullptr) return wrong;
  memory_ = &memory;
  desc_ = desc;
  avail_ = avail;
  used_ = used;
  indirect_ = indirect;
  last_avail_ = 0;
  used_idx_ = 0;
  ready_ = true;
  return "";
}

void Virtqueue::reset() {
  size = 0;
  desc_address = driver_address = device_address = 0;
  ready_ = false;
  indirect_ = false;
  memory_ = nullptr;
  desc_ = avail_ = used_ = nullptr;
  last_avail_ = used_idx_ = 0;
}

bool Virtqueue::has_available() const { return ready_ && load_u16(avail_ + 2) != last_avail_; }

bool Virtqueue::pop(Chain& chain, std::string& broken) {
  broken.clear();
  if (!ready_) return false;
  uint16_t avail_idx = load_u16(avail_ + 2);
  uint16_t pending = static_cast<uint16_t>(avail_idx - last_avail_);
  if (pending == 0) return false;
  if (pending > size) {
    broken = "runaway queue: the available index moved " + std::to_string(pending) +
             " entries ahead of the device, more than the queue's size " + std::to_string(size);
    ready_ = false;
    return false;
  }
  uint16_t head = load_u16(avail_ + 4 + 2ull * (last_avail_ % size));
  ++last_avail_;
  chain = Chain{};
  chain.head = head;
  if (!walk(head, chain, broken)) {
    ready_ = false;
    return false;
  }
  return true;
}

bool Virtqueue::walk(uint16_t head, Chain& chain, std::string& broken) const {
  uint32_t links = 0;
  uint16_t index = head;
  for (;;) {
    if (index >= size) {
      broken = "descriptor index " + std::to_string(index) + " is outside the queue of size " +
               std::to_string(size);
      return false;
    }
    if (++links > size) {
      broken = "the descriptor chain from head " + std::to_string(head) +
               " is longer than the queue's size " + std::to_string(size) + " (a loop)";
      return false;
    }
    Descriptor d = load_descriptor(desc_ + kDescSize * index);
    if (d.flags & kDescIndirect) {
      if (!indirect_) {
        broken = "an indirect descriptor, but VIRTIO_F_INDIRECT_DESC was not negotiated";
        return false;
      }
      if (d.flags & kDescNext) {
        broken = "an indirect descriptor that has a next descriptor";
        return false;
      }
      return walk_indirect(d.address, d.length, chain, links, broken);
    }
    if (!add_buffer(d.address, d.length, d.flags & kDescWrite, chain, broken)) return false;
    if (!(d.flags & kDescNext)) return true;
    index = d.next;
  }
}

bool Virtqueue::walk_indirect(uint64_t address, uint32_t length, Chain& chain, uint32_t& links,
                              std::string& broken) const {
  if (length == 0 || length % kDescSize != 0 || length / kDescSize > max_size_) {
    broken = "an indirect table of " + std::to_string(length) + " bytes (not 1 to " +
             std::to_string(max_size_) + " descriptors of 16 bytes)";
    return false;
  }
  const uint8_t* table = memory_->span(address, length);
  if (table == nullptr) {
    broken = "the indirect table at " + hex(address) + " (" + std::to_string(length) +
             " bytes) is outside guest RAM";
    return false;
  }
  uint32_t entries = length / kDescSize;
  uint32_t index = 0;
  for (uint32_t seen = 0;; ++seen) {
    if (seen >= entries) {
      broken = "the indirect chain at " + hex(address) + " is longer than its table (a loop)";
      return false;
    }
    ++links;
    Descriptor d = load_descriptor(table + kDescSize * index);
    if (d.flags & kDescIndirect) {
      broken = "an indirect descriptor inside an indirect table";
      return false;
    }
    if (!add_buffer(d.address, d.length, d.flags & kDescWrite, chain, broken)) return false;
    if (!(d.flags & kDescNext)) return true;
    if (d.next >= entries) {
      broken = "indirect descriptor index " + std::to_string(d.next) + " is outside its table of " +
               std::to_string(entries);
      return false;
    }
    index = d.next;
  }
}

bool Virtqueue::add_buffer(uint64_t address, uint32_t length, bool writable, Chain& chain,
                           std::string& broken) const {
  if (!writable && !chain.writable.empty()) {
    broken = "a device-readable descriptor after a device-writable one";
    return false;
  }
  if (chain.readable_bytes + chain.writable_bytes + length > kMaxChainBytes) {
    broken = "a descriptor chain of more than 4 GiB";
    return false;
  }
  uint8_t* data = memory_->span(address, length);
  if (data == nullptr) {
    broken = "a buffer at " + hex(address) + " (" + std::to_string(length) +
             " bytes) is outside guest RAM";
    return false;
  }
  if (writable) {
    chain.writable.push_back({data, length});
    chain.writable_bytes += length;
  } else {
    chain.readable.push_back({data, length});
    chain.readable_bytes += length;
  }
  return true;
}

void Virtqueue::push(uint16_t head, uint32_t written) {
  if (!ready_) return;
  uint8_t* element = used_ + 4 + 8ull * (used_idx_ % size);
  uint32_t id = head;
  std::memcpy(element, &id, 4);
  std::memcpy(element + 4, &written, 4);
  ++used_idx_;
  store_u16(used_ + 2, used_idx_);
}

bool Virtqueue::wants_interrupt() const {
  return ready_ && (load_u16(avail_) & kAvailNoInterrupt) == 0;
}

}  // namespace openshell::vm
