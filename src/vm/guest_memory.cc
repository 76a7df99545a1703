#include "vm/guest_memory.h"

#include <sys/mman.h>

#include <cstring>
#include <utility>

#include "base/error.h"
#include "vm/layout.h"

namespace openshell::vm {

namespace {

constexpr uint64_t kTwoMiB = 2ull << 20;

// RAM fills the space below the MMIO hole first; what does not fit goes
// above 4 GiB, so the guest's view is [0, hole) and [4 GiB, ...).
std::vector<MemorySlot> slots_for(uint64_t bytes) {
  std::vector<MemorySlot> slots;
  const uint64_t low = bytes < layout::kMmioStart ? bytes : layout::kMmioStart;
  slots.push_back({0, 0, low, 0});
  if (bytes > low) slots.push_back({1, layout::kMmioEnd, bytes - low, low});
  return slots;
}

}  // namespace

GuestMemory GuestMemory::create(uint64_t bytes) {
  if (bytes < kTwoMiB || bytes % kTwoMiB != 0)
    throw Error("guest memory of " + std::to_string(bytes) +
                " bytes: it must be a multiple of 2 MiB, at least 2 MiB");
  // The address space above the hole must stay below what 4-level paging
  // and KVM's slots reach; 1 TiB is far more than a sandbox is given.
  if (bytes > (1ull << 40))
    throw Error("guest memory of " + std::to_string(bytes) + " bytes: more than 1 TiB");
  GuestMemory memory;
  memory.fd_ = UniqueFd(::memfd_create("openshell-guest-ram", MFD_CLOEXEC));
  if (!memory.fd_) throw_errno("memfd_create for guest memory");
  if (::ftruncate(memory.fd_.get(), static_cast<off_t>(bytes)) != 0)
    throw_errno("ftruncate guest memory to " + std::to_string(bytes) + " bytes");
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE,
                      memory.fd_.get(), 0);
  if (base == MAP_FAILED) throw_errno("mmap guest memory of " + std::to_string(bytes) + " bytes");
  memory.base_ = static_cast<uint8_t*>(base);
  memory.size_ = bytes;
  // A core dump of the VMM must not hold the guest's secrets, and a child
  // the VMM forks must not get its RAM.
  if (::madvise(base, bytes, MADV_DONTDUMP) != 0)
    throw_errno("madvise(MADV_DONTDUMP) on guest memory");
  if (::madvise(base, bytes, MADV_DONTFORK) != 0)
    throw_errno("madvise(MADV_DONTFORK) on guest memory");
  memory.slots_ = slots_for(bytes);
  return memory;
}

GuestMemory::GuestMemory(GuestMemory&& other) noexcept
    : fd_(std::move(other.fd_)),
      base_(std::exchange(other.base_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      slots_(std::move(other.slots_)) {}

GuestMemory& GuestMemory::operator=(GuestMemory&& other) noexcept {
  if (this != &other) {
    if (base_) ::munmap(base_, size_);
    fd_ = std::move(other.fd_);
    base_ = std::exchange(other.base_, nullptr);
    size_ = std::exchange(other.size_, 0);
    slots_ = std::move(other.slots_);
  }
  return *this;
}

GuestMemory::~GuestMemory() {
  if (base_) ::munmap(base_, size_);
}

uint8_t* GuestMemory::span(uint64_t address, uint64_t length) const {
  for (const MemorySlot& slot : slots_) {
    if (address < slot.guest_address) continue;
    const uint64_t into = address - slot.guest_address;
    // into <= size and length <= size - into: no sum that can wrap.
    if (into > slot.size || length > slot.size - into) continue;
    if (into == slot.size && length != 0) continue;
    return base_ + slot.offset + into;
  }
  return nullptr;
}

bool GuestMemory::read(uint64_t address, void* out, uint64_t length) const {
  const uint8_t* from = span(address, length);
  if (!from) return false;
  if (length) std::memcpy(out, from, length);
  return true;
}

bool GuestMemory::write(uint64_t address, const void* in, uint64_t length) const {
  uint8_t* to = span(address, length);
  if (!to) return false;
  if (length) std::memcpy(to, in, length);
  return true;
}

}  // namespace openshell::vm
