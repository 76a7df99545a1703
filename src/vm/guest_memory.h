// A guest's RAM: one memfd, mapped once into the VMM and given to KVM as
// memory slots (below and, for large guests, above the MMIO hole; see
// layout.h). Every access through a guest-provided address goes through
// span(), which checks the whole range against the slots first: a guest
// that names memory it does not have gets nullptr, never a host pointer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace openshell::vm {

struct MemorySlot {
  uint32_t slot = 0;
  uint64_t guest_address = 0;
  uint64_t size = 0;
  uint64_t offset = 0;  // into the memfd, and into host_base()
};

class GuestMemory {
 public:
  // `bytes` of RAM (a multiple of 2 MiB, at least 2 MiB), zeroed, not
  // dumpable (MADV_DONTDUMP) and not inherited by children (MADV_DONTFORK).
  // Throws Error.
  static GuestMemory create(uint64_t bytes);

  GuestMemory(GuestMemory&&) noexcept;
  GuestMemory& operator=(GuestMemory&&) noexcept;
  GuestMemory(const GuestMemory&) = delete;
  GuestMemory& operator=(const GuestMemory&) = delete;
  ~GuestMemory();

  uint64_t size() const { return size_; }
  const std::vector<MemorySlot>& slots() const { return slots_; }
  uint8_t* host_base() const { return base_; }
  int fd() const { return fd_.get(); }

  // The host address of [address, address + length) when the whole range
  // is guest RAM in one slot (overflow-safe); nullptr otherwise. length 0
  // is a valid, empty range inside RAM.
  uint8_t* span(uint64_t address, uint64_t length) const;
  // Copies in or out; false (and nothing copied) when span() fails.
  bool read(uint64_t address, void* out, uint64_t length) const;
  bool write(uint64_t address, const void* in, uint64_t length) const;

 private:
  GuestMemory() = default;
  UniqueFd fd_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  std::vector<MemorySlot> slots_;
};

}  // namespace openshell::vm
