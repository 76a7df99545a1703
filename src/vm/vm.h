// One micro-VM on KVM: its guest memory in KVM's slots, the in-kernel
// interrupt controllers and timer, the serial port, the MMIO devices in
// their windows (layout.h), and one thread per vCPU running KVM_RUN.
//
// A VM ends once, for one reason, and ends only itself: stop() from the
// VMM, the guest's reset request (the keyboard controller's pulse, as
// Linux's `reboot=k` does) or a triple fault, a failed entry or an internal
// error of KVM, an exit the VMM does not know, or a guest that breaks the
// MMIO contract (an access no device serves, a misaligned or odd-sized one,
// a device's fatal()). Every vCPU thread is then told to leave KVM_RUN and
// is joined; the file descriptors close with the object.
#pragma once

#include <linux/kvm.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/unique_fd.h"
#include "vm/device.h"
#include "vm/guest_memory.h"
#include "vm/kvm.h"
#include "vm/serial.h"

namespace openshell::vm {

// Where a vCPU starts. Real mode: CS = real_cs (base real_cs * 16), IP =
// rip. Protected (the PVH ABI): flat 32-bit segments, paging off, EBX =
// rbx. Long: the boot GDT and identity page tables (boot.h writes them),
// RSI = rsi (boot_params for a bzImage), RSP = rsp.
struct CpuEntry {
  enum class Mode { kReal, kProtected, kLong };
  Mode mode = Mode::kReal;
  uint64_t rip = 0;
  uint64_t rsp = 0;
  uint64_t rsi = 0;
  uint64_t rbx = 0;
  uint16_t real_cs = 0;
};

enum class EndReason {
  kRunning,      // not ended yet
  kStopped,      // stop() was called
  kGuestReset,   // the guest asked for a reset (i8042 pulse, port 0xcf9)
  kPoweredOff,   // KVM_SYSTEM_EVENT_SHUTDOWN
  kTripleFault,  // KVM_EXIT_SHUTDOWN
  kHalted,       // KVM_EXIT_HLT (only without an in-kernel local APIC)
  kError,        // the guest or KVM broke something: see detail
};

struct VmEnd {
  EndReason reason = EndReason::kRunning;
  std::string detail;  // "triple fault", "MMIO write of 4 bytes at 0xd0005000: no device there"
};
const char* end_reason_name(EndReason reason);

// The signal that takes a vCPU thread out of KVM_RUN (a real-time one; its
// handler does nothing). Installed by Vm::start().
int kick_signal();
void install_kick_handler();
// The MSRs a vCPU has at reset (SYSENTER, SYSCALL targets, TSC, fast
// strings). Throws Error naming the first one KVM refuses.
void set_reset_msrs(int vcpu_fd);

struct VmOptions {
  uint32_t vcpus = 1;
  // Bytes the guest writes to its serial port (the sandbox's log later).
  SerialSink serial_sink;
  // Called on each vCPU thread before its first KVM_RUN (the VMM's
  // confinement installs the vCPU seccomp filter here). Returns an empty
  // string or why the thread cannot run (the VM then ends in Error).
  std::function<std::string(uint32_t vcpu)> on_vcpu_thread;
};

class Vm {
 public:
  // KVM_CREATE_VM with `memory` in its slots, the irqchip, the PIT, the
  // serial port and `options.vcpus` vCPUs (CPUID and MSRs set). Throws Error.
  static std::unique_ptr<Vm> create(const Kvm& kvm, GuestMemory memory, VmOptions options);
  ~Vm();  // stop() and join.
  Vm(const Vm&) = delete;
  Vm& operator=(const Vm&) = delete;

  GuestMemory& memory() { return memory_; }
  Serial& serial() { return *serial_; }
  int fd() const { return vm_fd_.get(); }

  // Before start(): a device in the next window (layout::mmio_window(i)),
  // its doorbells on KVM_IOEVENTFD and its interrupt_fd() on KVM_IRQFD at
  // layout::device_irq(i). The device must outlive the VM. Returns i.
  uint32_t add_device(MmioDevice& device);
  // Before start(): vCPU `index`'s entry. A vCPU without one waits for the
  // guest's INIT/SIPI, as an application processor does.
  void set_entry(uint32_t index, const CpuEntry& entry);

  // Starts one thread per vCPU. Throws Error.
  void start();
  // Ends the VM with kStopped unless it has ended already; returns when every
  // vCPU thread has left KVM_RUN and been joined.
  void stop();
  // Waits for the VM's end, at most `timeout_ms` (negative: forever); joins
  // the threads once ended. Returns the end, kRunning on a timeout.
  VmEnd wait(int timeout_ms = -1);
  VmEnd end() const;

  // Nanoseconds (CLOCK_MONOTONIC) of the first exit of any kind, and of the
  // first byte on the serial port; 0 when none yet. For the benchmark.
  uint64_t first_exit_ns() const { return first_exit_ns_.load(); }
  uint64_t first_serial_ns() const { return first_serial_ns_.load(); }

 private:
  struct Vcpu {
    uint32_t index = 0;
    UniqueFd fd;
    kvm_run* run = nullptr;
    size_t run_size = 0;
    bool has_entry = false;
    CpuEntry entry;
    std::thread thread;
    std::atomic<bool> in_thread{false};
    pthread_t handle{};
  };
  struct DeviceWindow {
    MmioDevice* device = nullptr;
    uint64_t base = 0;
  };

  Vm(GuestMemory memory, VmOptions options);
  void create_vcpu(const Kvm& kvm, uint32_t index);
  void set_registers(Vcpu& vcpu);
  void run_vcpu(Vcpu& vcpu);
  // Returns false when the VM must end (finish() already called).
  bool handle_exit(Vcpu& vcpu);
  bool handle_io(Vcpu& vcpu);
  bool handle_mmio(Vcpu& vcpu);
  void finish(EndReason reason, const std::string& detail);
  void kick_all_locked();
  void thread_done(Vcpu& vcpu);
  void join_all();

  GuestMemory memory_;
  VmOptions options_;
  UniqueFd vm_fd_;
  std::unique_ptr<Serial> serial_;
  UniqueFd serial_irq_fd_;
  std::vector<std::unique_ptr<Vcpu>> vcpus_;
  std::vector<DeviceWindow> devices_;
  bool started_ = false;

  mutable std::mutex mutex_;
  std::condition_variable ended_cv_;
  VmEnd end_;
  uint32_t threads_running_ = 0;
  bool joined_ = false;
  std::atomic<bool> ending_{false};
  std::atomic<uint64_t> first_exit_ns_{0};
  std::atomic<uint64_t> first_serial_ns_{0};
};

}  // namespace openshell::vm
