#include "vm/virtio_mmio.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "vm/layout.h"

namespace openshell::vm {

using namespace virtio_mmio;

namespace {

UniqueFd make_eventfd(const char* what) {
  int fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (fd < 0) throw_errno(std::string("eventfd for ") + what);
  return UniqueFd(fd);
}

void signal(int fd) {
  uint64_t one = 1;
  // A full counter (2^64 - 2 signals unread) already wakes the reader.
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

bool drain(int fd) {
  uint64_t count = 0;
  return ::read(fd, &count, sizeof count) == static_cast<ssize_t>(sizeof count);
}

}  // namespace

std::string virtio_mmio_cmdline(uint32_t index) {
  char text[64];
  std::snprintf(text, sizeof text, "virtio_mmio.device=4K@0x%" PRIx64 ":%u",
                layout::mmio_window(index), layout::device_irq(index));
  return text;
}

VirtioMmio::VirtioMmio(const GuestMemory& memory, uint32_t device_id, uint64_t device_features,
                       const std::vector<uint16_t>& queue_max_sizes)
    : memory_(memory),
      device_id_(device_id),
      device_features_(device_features | (1ull << kFeatureVersion1) |
                       (1ull << kVirtioRingIndirectDesc)),
      interrupt_(make_eventfd("a virtio interrupt")),
      kick_(make_eventfd("a virtio device's wake-up")),
      stop_(make_eventfd("a virtio device's stop")) {
  for (uint16_t max : queue_max_sizes) {
    queues_.emplace_back(max);
    doorbells_.push_back(make_eventfd("a virtqueue doorbell"));
  }
}

VirtioMmio::~VirtioMmio() { stop(); }

std::vector<Doorbell> VirtioMmio::doorbells() {
  std::vector<Doorbell> bells;
  for (size_t i = 0; i < doorbells_.size(); ++i)
    bells.push_back({kQueueNotify, static_cast<uint32_t>(i), doorbells_[i].get()});
  return bells;
}

std::string VirtioMmio::fatal() const {
  std::lock_guard lock(mutex_);
  return fatal_;
}

uint32_t VirtioMmio::status() const {
  std::lock_guard lock(mutex_);
  return status_;
}

bool VirtioMmio::running() const {
  return (status_ & kDriverOk) && !(status_ & kFailed) && fatal_.empty();
}

void VirtioMmio::read(uint64_t offset, uint8_t* data, uint32_t len) {
  std::memset(data, 0, len);
  std::lock_guard lock(mutex_);
  if (offset >= kConfig && offset + len <= layout::kMmioWindow) {
    read_config(offset - kConfig, data, len);
    return;
  }
  if (len != 4 || offset % 4 != 0 || offset >= kConfig) {
    ++faults_;
    return;
  }
  uint32_t value = read_register(offset);
  std::memcpy(data, &value, 4);
}

void VirtioMmio::write(uint64_t offset, const uint8_t* data, uint32_t len) {
  std::lock_guard lock(mutex_);
  if (offset >= kConfig && offset + len <= layout::kMmioWindow) {
    write_config(offset - kConfig, data, len);
    return;
  }
  if (len != 4 || offset % 4 != 0 || offset >= kConfig) {
    ++faults_;
    return;
  }
  uint32_t value;
  std::memcpy(&value, data, 4);
  write_register(offset, value);
}

void VirtioMmio::write_config(uint64_t, const uint8_t*, uint32_t) { ++faults_; }

uint32_t VirtioMmio::read_register(uint64_t offset) {
  Virtqueue* q = queue_sel_ < queues_.size() ? &queues_[queue_sel_] : nullptr;
  switch (offset) {
    case kMagicValue:
      return kMagic;
    case kVersionReg:
      return kVersion;
    case kDeviceId:
      return device_id_;
    case kVendorIdReg:
      return kVendorId;
    case kDeviceFeatures:
      return device_features_sel_ < 2
                 ? static_cast<uint32_t>(device_features_ >> (32 * device_features_sel_))
                 : 0;
    case kQueueNumMax:
      return q ? q->max_size() : 0;
    case kQueueReady:
      return q && q->ready() ? 1 : 0;
    case kInterruptStatus:
      return interrupt_status_;
    case kStatus:
      return status_;
    case kConfigGeneration:
      return config_generation_;
    default:
      ++faults_;
      return 0;
  }
}

void VirtioMmio::write_register(uint64_t offset, uint32_t value) {
  Virtqueue* q = queue_sel_ < queues_.size() ? &queues_[queue_sel_] : nullptr;
  // A queue's setup is fixed while it is ready, and needs FEATURES_OK first.
  bool queue_setup = offset == kQueueNum || (offset >= kQueueDescLow && offset <= kQueueDeviceHigh);
  if (queue_setup && (q == nullptr || q->ready() || !(status_ & kFeaturesOk))) {
    ++faults_;
    return;
  }
  auto set_low = [](uint64_t& field, uint32_t v) { field = (field & ~0xffffffffull) | v; };
  auto set_high = [](uint64_t& field, uint32_t v) {
    field = (field & 0xffffffffull) | (static_cast<uint64_t>(v) << 32);
  };
  switch (offset) {
    case kDeviceFeaturesSel:
      device_features_sel_ = value;
      return;
    case kDriverFeaturesSel:
      driver_features_sel_ = value;
      return;
    case kDriverFeatures:
      if (driver_features_sel_ >= 2 || (status_ & kFeaturesOk)) {
        ++faults_;
        return;
      }
      if (driver_features_sel_ == 0)
        set_low(driver_features_, value);
      else
        set_high(driver_features_, value);
      return;
    case kQueueSel:
      queue_sel_ = value;
      return;
    case kQueueNum:
      q->size = value > 0xffff ? 0 : static_cast<uint16_t>(value);
      return;
    case kQueueDescLow:
      return set_low(q->desc_address, value);
    case kQueueDescHigh:
      return set_high(q->desc_address, value);
    case kQueueDriverLow:
      return set_low(q->driver_address, value);
    case kQueueDriverHigh:
      return set_high(q->driver_address, value);
    case kQueueDeviceLow:
      return set_low(q->device_address, value);
    case kQueueDeviceHigh:
      return set_high(q->device_address, value);
    case kQueueReady:
      if (q == nullptr || !(status_ & kFeaturesOk)) {
        ++faults_;
      } else if (value == 0) {
        q->reset();
      } else if (!q->ready()) {
        bool indirect = driver_features_ & (1ull << kVirtioRingIndirectDesc);
        std::string wrong = q->activate(memory_, indirect);
        if (!wrong.empty()) set_fatal("queue " + std::to_string(queue_sel_) + ": " + wrong);
      }
      return;
    case kQueueNotify:
      if (value < doorbells_.size())
        signal(doorbells_[value].get());
      else
        ++faults_;
      return;
    case kInterruptAck:
      interrupt_status_ &= ~value;
      return;
    case kStatus:
      return write_status(value);
    default:
      ++faults_;
  }
}

void VirtioMmio::write_status(uint32_t value) {
  if (value == 0) return reset();
  // Bits only accumulate until a reset (2.1.1), and the device's own bit is
  // not the driver's to set.
  if ((value & status_ & ~kDeviceNeedsReset) != (status_ & ~kDeviceNeedsReset)) {
    ++faults_;
    return;
  }
  value = (value & ~kDeviceNeedsReset) | (status_ & kDeviceNeedsReset);
  if ((value & kFeaturesOk) && !(status_ & kFeaturesOk)) {
    bool only_offered = (driver_features_ & ~device_features_) == 0;
    bool modern = driver_features_ & (1ull << kFeatureVersion1);
    if (!only_offered || !modern) value &= ~kFeaturesOk;  // the driver reads it back
  }
  if ((value & kDriverOk) && !(value & kFeaturesOk)) {
    ++faults_;
    value &= ~kDriverOk;
  }
  bool now_ok = (value & kDriverOk) && !(status_ & kDriverOk);
  bool now_failed = (value & kFailed) && !(status_ & kFailed);
  status_ = value;
  if (now_failed) device_reset();
  if (now_ok) signal(kick_.get());
}

void VirtioMmio::reset() {
  for (Virtqueue& q : queues_) q.reset();
  for (UniqueFd& bell : doorbells_) drain(bell.get());
  status_ = (status_ & kDeviceNeedsReset);
  device_features_sel_ = driver_features_sel_ = 0;
  driver_features_ = 0;
  queue_sel_ = 0;
  interrupt_status_ = 0;
  device_reset();
}

void VirtioMmio::raise(uint32_t why) {
  interrupt_status_ |= why;
  signal(interrupt_.get());
}

void VirtioMmio::complete(uint16_t queue_index, uint16_t head, uint32_t written) {
  Virtqueue& q = queues_[queue_index];
  q.push(head, written);
  if (q.wants_interrupt()) raise(kUsedBuffer);
}

void VirtioMmio::set_fatal(const std::string& reason) {
  if (!fatal_.empty()) return;
  fatal_ = name() + ": " + reason;
  status_ |= kDeviceNeedsReset;
  device_reset();
  raise(kConfigChange);
}

bool VirtioMmio::next_chain(uint16_t queue_index, Chain& chain) {
  if (!running()) return false;
  std::string broken;
  if (queues_[queue_index].pop(chain, broken)) return true;
  if (!broken.empty()) set_fatal("queue " + std::to_string(queue_index) + ": " + broken);
  return false;
}

void VirtioMmio::kick() { signal(kick_.get()); }

void VirtioMmio::service() {
  for (size_t i = 0; i < doorbells_.size(); ++i) {
    if (!drain(doorbells_[i].get())) continue;
    std::lock_guard lock(mutex_);
    if (running() && queues_[i].ready()) queue_notified(static_cast<uint16_t>(i));
  }
  drain(kick_.get());
  std::lock_guard lock(mutex_);
  if (running()) device_event();
}

void VirtioMmio::start(std::function<std::string()> on_thread) {
  if (thread_.joinable()) return;
  // Everything that makes a file descriptor happens here, before the
  // thread's filter is in place.
  if (!loop_) {
    loop_.reset(::epoll_create1(EPOLL_CLOEXEC));
    if (!loop_) throw_errno("epoll_create1 for " + name());
    std::vector<int> fds{stop_.get(), kick_.get()};
    for (const UniqueFd& bell : doorbells_) fds.push_back(bell.get());
    if (event_fd() >= 0) fds.push_back(event_fd());
    for (int fd : fds) {
      epoll_event event{};
      event.events = EPOLLIN;
      event.data.fd = fd;
      if (::epoll_ctl(loop_.get(), EPOLL_CTL_ADD, fd, &event) != 0)
        throw_errno("epoll_ctl for " + name());
    }
  }
  thread_ = std::thread([this, on_thread = std::move(on_thread)] { run(on_thread); });
}

void VirtioMmio::stop() {
  if (!thread_.joinable()) return;
  signal(stop_.get());
  thread_.join();
  drain(stop_.get());
}

void VirtioMmio::run(const std::function<std::string()>& on_thread) {
  if (on_thread) {
    if (std::string why = on_thread(); !why.empty()) {
      std::lock_guard lock(mutex_);
      set_fatal("its thread cannot run: " + why);
      return;
    }
  }
  for (;;) {
    epoll_event events[8];
    int n = ::epoll_wait(loop_.get(), events, 8, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      std::lock_guard lock(mutex_);
      set_fatal(errno_message("epoll_wait", errno));
      return;
    }
    for (int i = 0; i < n; ++i)
      if (events[i].data.fd == stop_.get()) return;
    service();
  }
}

}  // namespace openshell::vm
