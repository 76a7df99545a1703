// A vCPU: its registers at entry, its MSRs at reset, and the thread that
// runs KVM_RUN and answers each exit.
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "vm/boot.h"
#include "vm/layout.h"
#include "vm/vm.h"

namespace openshell::vm {

namespace {

constexpr uint64_t kCr0Pe = 1ull << 0;
constexpr uint64_t kCr0Et = 1ull << 4;
constexpr uint64_t kCr0Ne = 1ull << 5;
constexpr uint64_t kCr0Pg = 1ull << 31;
constexpr uint64_t kCr4Pae = 1ull << 5;
constexpr uint64_t kEferLme = 1ull << 8;
constexpr uint64_t kEferLma = 1ull << 10;
constexpr uint64_t kRflagsReserved = 1ull << 1;

// MSR numbers (the SDM's; the kernel's msr-index.h is not a uapi header).
constexpr uint32_t MSR_IA32_SYSENTER_CS = 0x174;
constexpr uint32_t MSR_IA32_SYSENTER_ESP = 0x175;
constexpr uint32_t MSR_IA32_SYSENTER_EIP = 0x176;
constexpr uint32_t MSR_IA32_TSC = 0x10;
constexpr uint32_t MSR_IA32_MISC_ENABLE = 0x1a0;
constexpr uint64_t MSR_IA32_MISC_ENABLE_FAST_STRING = 1;
constexpr uint32_t MSR_STAR = 0xc0000081;
constexpr uint32_t MSR_LSTAR = 0xc0000082;
constexpr uint32_t MSR_CSTAR = 0xc0000083;
constexpr uint32_t MSR_SYSCALL_MASK = 0xc0000084;
constexpr uint32_t MSR_KERNEL_GS_BASE = 0xc0000102;

constexpr uint16_t kI8042Command = 0x64;
constexpr uint16_t kI8042Data = 0x60;
constexpr uint8_t kI8042PulseReset = 0xfe;
constexpr uint16_t kResetControl = 0xcf9;

std::string hex(uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%llx", static_cast<unsigned long long>(value));
  return text;
}

uint64_t now_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
}

kvm_segment flat_segment(uint16_t selector, uint8_t type, bool code64) {
  kvm_segment s{};
  s.base = 0;
  s.limit = 0xffffffff;
  s.selector = selector;
  s.type = type;
  s.present = 1;
  s.dpl = 0;
  s.db = code64 ? 0 : 1;
  s.s = 1;
  s.l = code64 ? 1 : 0;
  s.g = 1;
  return s;
}

void on_kick(int) {}

}  // namespace

int kick_signal() { return SIGRTMIN + 2; }

void install_kick_handler() {
  struct sigaction action {};
  action.sa_handler = on_kick;  // no SA_RESTART: KVM_RUN returns EINTR
  sigemptyset(&action.sa_mask);
  if (::sigaction(kick_signal(), &action, nullptr) != 0)
    throw_errno("sigaction for the vCPU kick signal");
}

void set_reset_msrs(int vcpu_fd) {
  struct Msr {
    uint32_t index;
    uint64_t value;
    const char* name;
  };
  static const Msr msrs[] = {
      {MSR_IA32_SYSENTER_CS, 0, "IA32_SYSENTER_CS"},
      {MSR_IA32_SYSENTER_ESP, 0, "IA32_SYSENTER_ESP"},
      {MSR_IA32_SYSENTER_EIP, 0, "IA32_SYSENTER_EIP"},
      {MSR_STAR, 0, "STAR"},
      {MSR_CSTAR, 0, "CSTAR"},
      {MSR_KERNEL_GS_BASE, 0, "KERNEL_GS_BASE"},
      {MSR_SYSCALL_MASK, 0, "SYSCALL_MASK"},
      {MSR_LSTAR, 0, "LSTAR"},
      {MSR_IA32_TSC, 0, "IA32_TSC"},
      {MSR_IA32_MISC_ENABLE, MSR_IA32_MISC_ENABLE_FAST_STRING, "IA32_MISC_ENABLE"},
  };
  constexpr size_t count = sizeof msrs / sizeof msrs[0];
  std::vector<uint8_t> buffer(sizeof(KvmListHeader) + count * sizeof(kvm_msr_entry));
  const KvmListHeader header{static_cast<uint32_t>(count), 0};
  std::memcpy(buffer.data(), &header, sizeof header);
  for (size_t i = 0; i < count; ++i) {
    kvm_msr_entry entry{};
    entry.index = msrs[i].index;
    entry.data = msrs[i].value;
    std::memcpy(buffer.data() + sizeof header + i * sizeof entry, &entry, sizeof entry);
  }
  const int set = ::ioctl(vcpu_fd, kKvmSetMsrs, buffer.data());
  if (set < 0) throw_errno("KVM_SET_MSRS");
  if (static_cast<size_t>(set) < count)
    throw Error(std::string("KVM_SET_MSRS refused MSR ") + msrs[set].name);
}

void Vm::set_registers(Vcpu& vcpu) {
  const CpuEntry& entry = vcpu.entry;
  const int fd = vcpu.fd.get();
  if (vcpu.index != 0) {
    // An application processor waits for SIPI until told it is running.
    kvm_mp_state state{KVM_MP_STATE_RUNNABLE};
    if (::ioctl(fd, KVM_SET_MP_STATE, &state) != 0) throw_errno("KVM_SET_MP_STATE");
  }
  kvm_sregs sregs{};
  if (::ioctl(fd, KVM_GET_SREGS, &sregs) != 0) throw_errno("KVM_GET_SREGS");
  kvm_regs regs{};
  regs.rflags = kRflagsReserved;
  regs.rip = entry.rip;
  regs.rsp = entry.rsp;
  regs.rsi = entry.rsi;
  regs.rbx = entry.rbx;
  switch (entry.mode) {
    case CpuEntry::Mode::kReal: {
      for (kvm_segment* s : {&sregs.cs, &sregs.ds, &sregs.es, &sregs.fs, &sregs.gs, &sregs.ss}) {
        s->selector = entry.real_cs;
        s->base = static_cast<uint64_t>(entry.real_cs) << 4;
      }
      break;
    }
    case CpuEntry::Mode::kProtected:
    case CpuEntry::Mode::kLong: {
      const bool long_mode = entry.mode == CpuEntry::Mode::kLong;
      boot::write_gdt(memory_);
      if (long_mode) boot::write_identity_page_tables(memory_);
      sregs.gdt.base = layout::kBootGdt;
      sregs.gdt.limit = boot::kGdtEntries * 8 - 1;
      sregs.idt.base = layout::kBootIdt;
      sregs.idt.limit = 0;
      sregs.cs = long_mode ? flat_segment(layout::kBootCode64, 0xb, true)
                           : flat_segment(layout::kBootCode32, 0xb, false);
      const kvm_segment data = flat_segment(layout::kBootData, 0x3, false);
      sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = data;
      sregs.cr0 = kCr0Pe | kCr0Et | kCr0Ne;
      sregs.cr4 = 0;
      sregs.efer = 0;
      if (long_mode) {
        sregs.cr3 = layout::kPml4;
        sregs.cr4 = kCr4Pae;
        sregs.cr0 |= kCr0Pg;
        sregs.efer = kEferLme | kEferLma;
      }
      break;
    }
  }
  if (::ioctl(fd, KVM_SET_SREGS, &sregs) != 0) throw_errno("KVM_SET_SREGS");
  if (::ioctl(fd, KVM_SET_REGS, &regs) != 0) throw_errno("KVM_SET_REGS");
}

void Vm::run_vcpu(Vcpu& vcpu) {
  sigset_t kick;
  sigemptyset(&kick);
  sigaddset(&kick, kick_signal());
  ::pthread_sigmask(SIG_UNBLOCK, &kick, nullptr);
  // "vcpu 0" in /proc/PID/task/TID/comm, ps and top.
  const std::string name = "vcpu " + std::to_string(vcpu.index);
  ::prctl(PR_SET_NAME, name.c_str(), 0, 0, 0);
  if (options_.on_vcpu_thread) {
    const std::string why = options_.on_vcpu_thread(vcpu.index);
    if (!why.empty()) {
      finish(EndReason::kError, "vCPU " + std::to_string(vcpu.index) + ": " + why);
      thread_done(vcpu);
      return;
    }
  }
  while (!ending_.load()) {
    if (::ioctl(vcpu.fd.get(), KVM_RUN, 0) != 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      finish(EndReason::kError,
             errno_message("KVM_RUN on vCPU " + std::to_string(vcpu.index), errno));
      break;
    }
    if (first_exit_ns_.load(std::memory_order_relaxed) == 0) {
      uint64_t expected = 0;
      first_exit_ns_.compare_exchange_strong(expected, now_ns());
    }
    if (!handle_exit(vcpu)) break;
  }
  thread_done(vcpu);
}

bool Vm::handle_exit(Vcpu& vcpu) {
  kvm_run& run = *vcpu.run;
  switch (run.exit_reason) {
    case KVM_EXIT_IO:
      return handle_io(vcpu);
    case KVM_EXIT_MMIO:
      return handle_mmio(vcpu);
    case KVM_EXIT_INTR:
      return true;
    case KVM_EXIT_HLT:
      finish(EndReason::kHalted, "the guest halted");
      return false;
    case KVM_EXIT_SHUTDOWN:
      finish(EndReason::kTripleFault, "triple fault");
      return false;
    case KVM_EXIT_SYSTEM_EVENT:
      if (run.system_event.type == KVM_SYSTEM_EVENT_RESET) {
        finish(EndReason::kGuestReset, "the guest asked for a reset");
      } else if (run.system_event.type == KVM_SYSTEM_EVENT_SHUTDOWN) {
        finish(EndReason::kPoweredOff, "the guest powered off");
      } else {
        finish(EndReason::kError,
               "system event " + std::to_string(run.system_event.type) + " from the guest");
      }
      return false;
    case KVM_EXIT_FAIL_ENTRY:
      finish(EndReason::kError, "KVM could not enter the guest on vCPU " +
                                    std::to_string(vcpu.index) +
                                    " (hardware entry failure reason " +
                                    hex(run.fail_entry.hardware_entry_failure_reason) + ")");
      return false;
    case KVM_EXIT_INTERNAL_ERROR: {
      const uint32_t sub = run.internal.suberror;
      const char* what = sub == KVM_INTERNAL_ERROR_EMULATION  ? "an instruction KVM cannot emulate"
                         : sub == KVM_INTERNAL_ERROR_SIMUL_EX ? "an exception while delivering one"
                         : sub == KVM_INTERNAL_ERROR_DELIVERY_EV
                             ? "an event that cannot be delivered"
                             : "an internal error";
      finish(EndReason::kError, std::string("KVM internal error on vCPU ") +
                                    std::to_string(vcpu.index) + ": " + what + " (suberror " +
                                    std::to_string(sub) + ")");
      return false;
    }
    default:
      finish(EndReason::kError, "unknown KVM exit " + std::to_string(run.exit_reason) +
                                    " on vCPU " + std::to_string(vcpu.index));
      return false;
  }
}

bool Vm::handle_io(Vcpu& vcpu) {
  kvm_run& run = *vcpu.run;
  const bool out = run.io.direction == KVM_EXIT_IO_OUT;
  const uint16_t port = run.io.port;
  uint8_t* data = reinterpret_cast<uint8_t*>(&run) + run.io.data_offset;
  const uint32_t size = run.io.size;
  if (run.io.data_offset + static_cast<uint64_t>(size) * run.io.count > vcpu.run_size) {
    finish(EndReason::kError, "an I/O exit whose data lies outside kvm_run");
    return false;
  }
  for (uint32_t i = 0; i < run.io.count; ++i, data += size) {
    if (port >= layout::kSerialPort && port < layout::kSerialPort + Serial::kRegisters) {
      const uint16_t offset = static_cast<uint16_t>(port - layout::kSerialPort);
      if (out) {
        serial_->write(offset, data[0]);
      } else {
        std::memset(data, 0, size);
        data[0] = serial_->read(offset);
      }
    } else if (out && port == kI8042Command && data[0] == kI8042PulseReset) {
      finish(EndReason::kGuestReset, "the guest asked for a reset");
      return false;
    } else if (out && port == kResetControl && size == 1 && (data[0] & 0x04)) {
      finish(EndReason::kGuestReset, "the guest asked for a reset");
      return false;
    } else if (!out) {
      // The keyboard controller reads as idle (Linux's reset polls it);
      // every other port reads as nothing there.
      const uint8_t value = (port == kI8042Command || port == kI8042Data) ? 0 : 0xff;
      std::memset(data, value, size);
    }
  }
  return true;
}

bool Vm::handle_mmio(Vcpu& vcpu) {
  kvm_run& run = *vcpu.run;
  const uint64_t address = run.mmio.phys_addr;
  const uint32_t length = run.mmio.len;
  const bool write = run.mmio.is_write != 0;
  const std::string access = std::string("MMIO ") + (write ? "write" : "read") + " of " +
                             std::to_string(length) + " bytes at " + hex(address);
  const uint64_t end = layout::kMmioStart + devices_.size() * layout::kMmioWindow;
  if (address < layout::kMmioStart || address >= end) {
    finish(EndReason::kError, access + ": no device there");
    return false;
  }
  const DeviceWindow& window = devices_[(address - layout::kMmioStart) / layout::kMmioWindow];
  const uint64_t offset = address - window.base;
  if (length != 1 && length != 2 && length != 4 && length != 8) {
    finish(EndReason::kError, access + ": not 1, 2, 4 or 8 bytes");
    return false;
  }
  if (offset % length != 0 || offset + length > layout::kMmioWindow) {
    finish(EndReason::kError, access + ": misaligned");
    return false;
  }
  if (write) {
    window.device->write(offset, run.mmio.data, length);
  } else {
    window.device->read(offset, run.mmio.data, length);
  }
  if (std::string fatal = window.device->fatal(); !fatal.empty()) {
    finish(EndReason::kError, window.device->name() + ": " + fatal);
    return false;
  }
  return true;
}

}  // namespace openshell::vm
