// An 8250/16550A UART at COM1 (layout::kSerialPort): enough for Linux's
// 8250 driver (its probe through the scratch and loopback registers, the
// divisor latch, interrupt-driven output) and earlyprintk's polled output.
// What the guest transmits goes to a sink; what the VMM puts in with
// input() the guest receives. Its interrupt (IRQ 4) is an eventfd that the
// VM binds with KVM_IRQFD: one write per rising edge of the interrupt line.
// Thread-safe: every vCPU may touch it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string_view>

namespace openshell::vm {

using SerialSink = std::function<void(const char* data, size_t length)>;

class Serial {
 public:
  static constexpr uint16_t kRegisters = 8;

  // irq_fd: an eventfd, or -1 for none (tests).
  Serial(SerialSink sink, int irq_fd);

  // `offset` is the port minus the base, 0..7; others read 0xff.
  uint8_t read(uint16_t offset);
  void write(uint16_t offset, uint8_t value);
  // Bytes for the guest to receive (the receive buffer holds 4 KiB; beyond
  // that, bytes are dropped and counted, as a real UART overruns).
  void input(std::string_view bytes);

  uint64_t transmitted() const;
  uint64_t dropped() const;

 private:
  bool interrupt_pending_locked() const;
  void update_interrupt_locked(bool was_pending);

  SerialSink sink_;
  int irq_fd_;
  mutable std::mutex mutex_;
  uint8_t ier_ = 0, lcr_ = 0, mcr_ = 0, scr_ = 0, fcr_ = 0;
  uint8_t dll_ = 0x0c, dlm_ = 0;  // 9600 baud
  bool thr_empty_interrupt_ = false;
  std::deque<uint8_t> receive_;
  uint64_t transmitted_ = 0;
  uint64_t dropped_ = 0;
};

}  // namespace openshell::vm
