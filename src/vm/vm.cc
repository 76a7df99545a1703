// The VM's life: creation (slots, irqchip, PIT, vCPUs), devices, start, and
// its one end. The vCPU loop and its exits are in vcpu.cc.
#include "vm/vm.h"

#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "base/error.h"
#include "vm/boot.h"
#include "vm/layout.h"

namespace openshell::vm {

namespace {

void vm_ioctl(int fd, unsigned long request, const void* arg, const char* what) {
  if (::ioctl(fd, request, arg) != 0) throw_errno(what);
}

}  // namespace

const char* end_reason_name(EndReason reason) {
  switch (reason) {
    case EndReason::kRunning:
      return "running";
    case EndReason::kStopped:
      return "stopped";
    case EndReason::kGuestReset:
      return "guest reset";
    case EndReason::kPoweredOff:
      return "guest powered off";
    case EndReason::kTripleFault:
      return "triple fault";
    case EndReason::kHalted:
      return "halted";
    case EndReason::kError:
      return "error";
  }
  return "unknown";
}

Vm::Vm(GuestMemory memory, VmOptions options)
    : memory_(std::move(memory)), options_(std::move(options)) {}

std::unique_ptr<Vm> Vm::create(const Kvm& kvm, GuestMemory memory, VmOptions options) {
  if (options.vcpus == 0 || options.vcpus > kvm.max_vcpus())
    throw Error(std::to_string(options.vcpus) + " vCPUs: this host's KVM runs 1 to " +
                std::to_string(kvm.max_vcpus()) + " per VM");
  std::unique_ptr<Vm> vm(new Vm(std::move(memory), std::move(options)));
  const int fd = ::ioctl(kvm.fd(), KVM_CREATE_VM, 0);
  if (fd < 0) throw_errno("KVM_CREATE_VM");
  vm->vm_fd_ = UniqueFd(fd);
  const int vmfd = vm->vm_fd_.get();

  if (::ioctl(vmfd, KVM_SET_TSS_ADDR, static_cast<unsigned long>(layout::kTssAddress)) != 0)
    throw_errno("KVM_SET_TSS_ADDR");
  const uint64_t identity = layout::kIdentityMapAddress;
  vm_ioctl(vmfd, KVM_SET_IDENTITY_MAP_ADDR, &identity, "KVM_SET_IDENTITY_MAP_ADDR");
  for (const MemorySlot& slot : vm->memory_.slots()) {
    kvm_userspace_memory_region region{};
    region.slot = slot.slot;
    region.guest_phys_addr = slot.guest_address;
    region.memory_size = slot.size;
    region.userspace_addr = reinterpret_cast<uint64_t>(vm->memory_.host_base() + slot.offset);
    vm_ioctl(vmfd, KVM_SET_USER_MEMORY_REGION, &region, "KVM_SET_USER_MEMORY_REGION");
  }

  // After the slots: with the irqchip in place, each slot change waits for
  // KVM's SRCU readers (about 7 ms a slot here, against 0.4 ms before it).
  if (::ioctl(vmfd, KVM_CREATE_IRQCHIP, 0) != 0) throw_errno("KVM_CREATE_IRQCHIP");
  kvm_pit_config pit{};
  pit.flags = KVM_PIT_SPEAKER_DUMMY;
  vm_ioctl(vmfd, KVM_CREATE_PIT2, &pit, "KVM_CREATE_PIT2");

  // The serial port's interrupt: an eventfd on IRQ 4.
  vm->serial_irq_fd_ = UniqueFd(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!vm->serial_irq_fd_) throw_errno("eventfd for the serial port's interrupt");
  kvm_irqfd irqfd{};
  irqfd.fd = static_cast<uint32_t>(vm->serial_irq_fd_.get());
  irqfd.gsi = layout::kSerialIrq;
  vm_ioctl(vmfd, KVM_IRQFD, &irqfd, "KVM_IRQFD for the serial port");
  Vm* self = vm.get();
  SerialSink sink = [self](const char* data, size_t length) {
    if (self->first_serial_ns_.load(std::memory_order_relaxed) == 0) {
      timespec now{};
      ::clock_gettime(CLOCK_MONOTONIC, &now);
      uint64_t expected = 0;
      self->first_serial_ns_.compare_exchange_strong(
          expected,
          static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec));
    }
    if (self->options_.serial_sink) self->options_.serial_sink(data, length);
  };
  vm->serial_ = std::make_unique<Serial>(std::move(sink), vm->serial_irq_fd_.get());

  for (uint32_t i = 0; i < vm->options_.vcpus; ++i) vm->create_vcpu(kvm, i);
  return vm;
}

void Vm::create_vcpu(const Kvm& kvm, uint32_t index) {
  auto vcpu = std::make_unique<Vcpu>();
  vcpu->index = index;
  const int fd = ::ioctl(vm_fd_.get(), KVM_CREATE_VCPU, static_cast<unsigned long>(index));
  if (fd < 0) throw_errno("KVM_CREATE_VCPU " + std::to_string(index));
  vcpu->fd = UniqueFd(fd);
  vcpu->run_size = kvm.vcpu_mmap_size();
  void* run = ::mmap(nullptr, vcpu->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (run == MAP_FAILED) throw_errno("mmap of vCPU " + std::to_string(index) + "'s kvm_run");
  vcpu->run = static_cast<kvm_run*>(run);

  const std::vector<kvm_cpuid_entry2> entries = filter_cpuid(kvm.cpuid(), index, options_.vcpus);
  std::vector<uint8_t> buffer(sizeof(KvmListHeader) + entries.size() * sizeof(kvm_cpuid_entry2));
  const KvmListHeader header{static_cast<uint32_t>(entries.size()), 0};
  std::memcpy(buffer.data(), &header, sizeof header);
  std::memcpy(buffer.data() + sizeof header, entries.data(),
              entries.size() * sizeof(kvm_cpuid_entry2));
  vm_ioctl(vcpu->fd.get(), kKvmSetCpuid2, buffer.data(), "KVM_SET_CPUID2");
  set_reset_msrs(vcpu->fd.get());
  vcpus_.push_back(std::move(vcpu));
}

uint32_t Vm::add_device(MmioDevice& device) {
  if (started_) throw Error("a device (" + device.name() + ") added to a running VM");
  if (devices_.size() >= layout::kMaxMmioDevices)
    throw Error("more than " + std::to_string(layout::kMaxMmioDevices) + " devices");
  const uint32_t index = static_cast<uint32_t>(devices_.size());
  const uint64_t base = layout::mmio_window(index);
  for (const Doorbell& bell : device.doorbells()) {
    if (bell.offset > layout::kMmioWindow - 4 || bell.event_fd < 0)
      throw Error(device.name() + ": a doorbell at offset " + std::to_string(bell.offset) +
                  " outside its window or without an eventfd");
    kvm_ioeventfd ioeventfd{};
    ioeventfd.datamatch = bell.value;
    ioeventfd.addr = base + bell.offset;
    ioeventfd.len = 4;
    ioeventfd.fd = bell.event_fd;
    ioeventfd.flags = KVM_IOEVENTFD_FLAG_DATAMATCH;
    vm_ioctl(vm_fd_.get(), KVM_IOEVENTFD, &ioeventfd, "KVM_IOEVENTFD");
  }
  if (device.interrupt_fd() >= 0) {
    kvm_irqfd irqfd{};
    irqfd.fd = static_cast<uint32_t>(device.interrupt_fd());
    irqfd.gsi = layout::device_irq(index);
    vm_ioctl(vm_fd_.get(), KVM_IRQFD, &irqfd, "KVM_IRQFD");
  }
  devices_.push_back({&device, base});
  return index;
}

void Vm::set_entry(uint32_t index, const CpuEntry& entry) {
  if (started_) throw Error("a vCPU entry set on a running VM");
  if (index >= vcpus_.size()) throw Error("vCPU " + std::to_string(index) + " does not exist");
  vcpus_[index]->has_entry = true;
  vcpus_[index]->entry = entry;
}

void Vm::start() {
  if (started_) throw Error("the VM was started already");
  if (!vcpus_[0]->has_entry) throw Error("vCPU 0 has no entry: nothing to run");
  for (auto& vcpu : vcpus_)
    if (vcpu->has_entry) set_registers(*vcpu);
  install_kick_handler();
  started_ = true;
  std::lock_guard lock(mutex_);
  for (auto& vcpu : vcpus_) {
    Vcpu* v = vcpu.get();
    v->in_thread = true;
    ++threads_running_;
    v->thread = std::thread([this, v] { run_vcpu(*v); });
    v->handle = v->thread.native_handle();
  }
}

void Vm::finish(EndReason reason, const std::string& detail) {
  std::lock_guard lock(mutex_);
  if (end_.reason == EndReason::kRunning) {
    end_.reason = reason;
    end_.detail = detail;
  }
  ending_ = true;
  kick_all_locked();
  ended_cv_.notify_all();
}

void Vm::kick_all_locked() {
  for (auto& vcpu : vcpus_) {
    // Set before the signal: a thread about to enter KVM_RUN returns at
    // once, one inside it returns with EINTR.
    __atomic_store_n(&vcpu->run->immediate_exit, 1, __ATOMIC_SEQ_CST);
    if (vcpu->in_thread && vcpu->handle != pthread_self())
      ::pthread_kill(vcpu->handle, kick_signal());
  }
}

void Vm::thread_done(Vcpu& vcpu) {
  std::lock_guard lock(mutex_);
  vcpu.in_thread = false;
  --threads_running_;
  ended_cv_.notify_all();
}

void Vm::join_all() {
  for (auto& vcpu : vcpus_)
    if (vcpu->thread.joinable()) vcpu->thread.join();
}

void Vm::stop() {
  if (!started_) return;
  finish(EndReason::kStopped, "stopped by the VMM");
  wait(-1);
}

VmEnd Vm::wait(int timeout_ms) {
  {
    std::unique_lock lock(mutex_);
    auto all_out = [this] { return end_.reason != EndReason::kRunning && threads_running_ == 0; };
    if (timeout_ms < 0) {
      ended_cv_.wait(lock, all_out);
    } else if (!ended_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), all_out)) {
      return {};
    }
  }
  join_all();
  return end();
}

VmEnd Vm::end() const {
  std::lock_guard lock(mutex_);
  return end_;
}

Vm::~Vm() {
  stop();
  join_all();
  for (auto& vcpu : vcpus_)
    if (vcpu->run) ::munmap(vcpu->run, vcpu->run_size);
}

}  // namespace openshell::vm
