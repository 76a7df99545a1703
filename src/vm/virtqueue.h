// A split virtqueue (virtio 1.x, 2.6): the descriptor table, the available
// ring the driver fills and the used ring the device fills, all in guest
// memory. Everything the guest wrote is checked before use: the queue size
// (a power of two, at most the device's maximum), the rings' addresses and
// alignment (inside guest RAM, through GuestMemory::span), every descriptor
// index, address and length, the length of a chain (at most the queue's
// size in links, indirect tables included, so a loop ends) and its total
// bytes. A check that fails is the guest breaking the device's contract: the
// queue answers with a reason, which the transport makes the device's
// fatal().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace openshell::vm {

class GuestMemory;

// The ring's own feature bits (virtio 1.x, 6).
inline constexpr uint32_t kVirtioRingIndirectDesc = 28;

// One guest buffer, as a host pointer that span() checked.
struct GuestBuffer {
  uint8_t* data = nullptr;
  uint32_t length = 0;
};

// A descriptor chain as the device sees it: what it may read (the driver's
// request), then what it may write (its answer).
struct Chain {
  uint16_t head = 0;
  std::vector<GuestBuffer> readable;
  std::vector<GuestBuffer> writable;
  uint64_t readable_bytes = 0;
  uint64_t writable_bytes = 0;
};

// The most a chain may carry, both directions together: the used ring's
// length is 32 bits.
inline constexpr uint64_t kMaxChainBytes = 0xffffffffull;

class Virtqueue {
 public:
  explicit Virtqueue(uint16_t max_size) : max_size_(max_size) {}

  // What the driver writes through the transport before it sets ready.
  uint16_t max_size() const { return max_size_; }
  uint16_t size = 0;
  uint64_t desc_address = 0;
  uint64_t driver_address = 0;  // the available ring
  uint64_t device_address = 0;  // the used ring

  bool ready() const { return ready_; }
  // Checks the size and the rings against guest memory and starts the
  // queue; returns what is wrong (and stays not ready), or "".
  std::string activate(const GuestMemory& memory, bool indirect);
  // Back to the state after a device reset.
  void reset();

  // The next chain the driver made available. false with `broken` empty:
  // nothing new. false with `broken` set: the guest broke the queue (a
  // runaway index, a loop, an address outside RAM); the queue is then
  // unusable until reset.
  bool pop(Chain& chain, std::string& broken);
  // Whether the driver has made chains available that pop() has not taken.
  bool has_available() const;
  // Gives the chain back to the driver with `written` bytes written.
  void push(uint16_t head, uint32_t written);
  // Whether the driver wants an interrupt for what push() returned
  // (VRING_AVAIL_F_NO_INTERRUPT not set).
  bool wants_interrupt() const;

 private:
  bool walk(uint16_t head, Chain& chain, std::string& broken) const;
  bool add_buffer(uint64_t address, uint32_t length, bool writable, Chain& chain,
                  std::string& broken) const;
  bool walk_indirect(uint64_t address, uint32_t length, Chain& chain, uint32_t& links,
                     std::string& broken) const;

  uint16_t max_size_;
  bool ready_ = false;
  bool indirect_ = false;
  const GuestMemory* memory_ = nullptr;
  uint8_t* desc_ = nullptr;
  uint8_t* avail_ = nullptr;
  uint8_t* used_ = nullptr;
  uint16_t last_avail_ = 0;
  uint16_t used_idx_ = 0;
};

}  // namespace openshell::vm
