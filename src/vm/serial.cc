#include "vm/serial.h"

#include <unistd.h>

#include <utility>

namespace openshell::vm {

namespace {

// Register offsets.
constexpr uint16_t kData = 0;  // RBR/THR, DLL with DLAB
constexpr uint16_t kIer = 1;   // DLM with DLAB
constexpr uint16_t kIir = 2;   // FCR on write
constexpr uint16_t kLcr = 3;
constexpr uint16_t kMcr = 4;
constexpr uint16_t kLsr = 5;
constexpr uint16_t kMsr = 6;
constexpr uint16_t kScr = 7;

constexpr uint8_t kLcrDlab = 0x80;
constexpr uint8_t kIerReceived = 0x01;
constexpr uint8_t kIerTransmitEmpty = 0x02;
constexpr uint8_t kIirNone = 0x01;
constexpr uint8_t kIirTransmitEmpty = 0x02;
constexpr uint8_t kIirReceived = 0x04;
constexpr uint8_t kIirFifos = 0xc0;
constexpr uint8_t kFcrEnable = 0x01;
constexpr uint8_t kFcrClearReceive = 0x02;
constexpr uint8_t kLsrDataReady = 0x01;
constexpr uint8_t kLsrTransmitEmpty = 0x20 | 0x40;  // THRE and TEMT
constexpr uint8_t kMcrLoop = 0x10;
// Not looped: carrier, data set ready and clear to send, as a wired port.
constexpr uint8_t kMsrConnected = 0x80 | 0x20 | 0x10;
constexpr size_t kReceiveCapacity = 4096;

}  // namespace

Serial::Serial(SerialSink sink, int irq_fd) : sink_(std::move(sink)), irq_fd_(irq_fd) {}

bool Serial::interrupt_pending_locked() const {
  if ((ier_ & kIerReceived) && !receive_.empty()) return true;
  return (ier_ & kIerTransmitEmpty) && thr_empty_interrupt_;
}

void Serial::update_interrupt_locked(bool was_pending) {
  if (!was_pending && interrupt_pending_locked() && irq_fd_ >= 0) {
    const uint64_t one = 1;
    // An eventfd write fails only when its counter would overflow: the
    // guest has an interrupt pending then anyway.
    [[maybe_unused]] ssize_t n = ::write(irq_fd_, &one, sizeof one);
  }
}

uint8_t Serial::read(uint16_t offset) {
  std::lock_guard lock(mutex_);
  const bool was = interrupt_pending_locked();
  uint8_t value = 0xff;
  switch (offset) {
    case kData:
      if (lcr_ & kLcrDlab) {
        value = dll_;
      } else if (!receive_.empty()) {
        value = receive_.front();
        receive_.pop_front();
      } else {
        value = 0;
      }
      break;
    case kIer:
      value = (lcr_ & kLcrDlab) ? dlm_ : ier_;
      break;
    case kIir:
      if ((ier_ & kIerReceived) && !receive_.empty()) {
        value = kIirReceived;
      } else if ((ier_ & kIerTransmitEmpty) && thr_empty_interrupt_) {
        value = kIirTransmitEmpty;
        thr_empty_interrupt_ = false;  // reading IIR acknowledges it
      } else {
        value = kIirNone;
      }
      if (fcr_ & kFcrEnable) value |= kIirFifos;
      break;
    case kLcr:
      value = lcr_;
      break;
    case kMcr:
      value = mcr_;
      break;
    case kLsr:
      value = kLsrTransmitEmpty | (receive_.empty() ? 0 : kLsrDataReady);
      break;
    case kMsr:
      if (mcr_ & kMcrLoop) {
        // Loopback: RTS->CTS, DTR->DSR, OUT1->RI, OUT2->DCD (the driver's probe).
        value = static_cast<uint8_t>(((mcr_ & 0x02) << 3) | ((mcr_ & 0x01) << 5) |
                                     ((mcr_ & 0x04) << 4) | ((mcr_ & 0x08) << 4));
      } else {
        value = kMsrConnected;
      }
      break;
    case kScr:
      value = scr_;
      break;
    default:
      break;
  }
  update_interrupt_locked(was);
  return value;
}

void Serial::write(uint16_t offset, uint8_t value) {
  std::unique_lock lock(mutex_);
  const bool was = interrupt_pending_locked();
  switch (offset) {
    case kData:
      if (lcr_ & kLcrDlab) {
        dll_ = value;
      } else if (mcr_ & kMcrLoop) {
        if (receive_.size() < kReceiveCapacity) receive_.push_back(value);
      } else {
        ++transmitted_;
        thr_empty_interrupt_ = true;  // sent at once: the holding register is empty again
        if (sink_) {
          const char byte = static_cast<char>(value);
          sink_(&byte, 1);
        }
      }
      break;
    case kIer:
      if (lcr_ & kLcrDlab) {
        dlm_ = value;
      } else {
        // Enabling the empty-transmitter interrupt while it is empty raises it.
        if ((value & kIerTransmitEmpty) && !(ier_ & kIerTransmitEmpty)) thr_empty_interrupt_ = true;
        ier_ = value & 0x0f;
      }
      break;
    case kIir:
      fcr_ = value;
      if (value & kFcrClearReceive) receive_.clear();
      break;
    case kLcr:
      lcr_ = value;
      break;
    case kMcr:
      mcr_ = value & 0x1f;
      break;
    case kScr:
      scr_ = value;
      break;
    default:  // LSR and MSR are read-only
      break;
  }
  update_interrupt_locked(was);
}

void Serial::input(std::string_view bytes) {
  std::lock_guard lock(mutex_);
  const bool was = interrupt_pending_locked();
  for (char c : bytes) {
    if (receive_.size() >= kReceiveCapacity) {
      ++dropped_;
      continue;
    }
    receive_.push_back(static_cast<uint8_t>(c));
  }
  update_interrupt_locked(was);
}

uint64_t Serial::transmitted() const {
  std::lock_guard lock(mutex_);
  return transmitted_;
}

uint64_t Serial::dropped() const {
  std::lock_guard lock(mutex_);
  return dropped_;
}

}  // namespace openshell::vm
