// The VMM on /dev/kvm with the tests' small guests: modes, serial output,
// MMIO dispatch and doorbells, and every way a VM ends. Skips where
// /dev/kvm cannot be opened (it is root-only here).
#include "vm/vm.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include <gtest/gtest.h>

#include "test_util.h"
#include "vm/device.h"
#include "vm/kvm.h"
#include "vm/layout.h"
#include "vm_guest.h"

namespace openshell::vm {
namespace {

using testing::GuestOptions;
using testing::GuestStart;
using testing::run_flat_guest;

// A device that records writes and answers reads with 'K' at 0x14.
class RecordingDevice : public MmioDevice {
 public:
  RecordingDevice() : bell_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}
  std::string name() const override { return "test-device"; }
  void read(uint64_t offset, uint8_t* data, uint32_t len) override {
    std::memset(data, 0, len);
    if (offset == 0x14) data[0] = 'K';
  }
  void write(uint64_t offset, const uint8_t* data, uint32_t len) override {
    uint64_t value = 0;
    std::memcpy(&value, data, len);
    std::lock_guard lock(mutex_);
    writes_[offset] = value;
  }
  std::vector<Doorbell> doorbells() override { return {{0x50, 7, bell_.get()}}; }
  std::string fatal() const override { return fatal_; }

  std::map<uint64_t, uint64_t> writes() {
    std::lock_guard lock(mutex_);
    return writes_;
  }
  uint64_t rings() {
    uint64_t count = 0;
    return ::read(bell_.get(), &count, sizeof count) == sizeof count ? count : 0;
  }
  std::string fatal_;

 private:
  UniqueFd bell_;
  std::mutex mutex_;
  std::map<uint64_t, uint64_t> writes_;
};

TEST(VmKvm, OpensWithEveryCapabilityItNeeds) {
  OSH_REQUIRE_KVM(kvm);
  EXPECT_GE(kvm->vcpu_mmap_size(), sizeof(kvm_run));
  EXPECT_GE(kvm->max_vcpus(), 1u);
  EXPECT_FALSE(kvm->cpuid().empty());
}

TEST(VmKvm, MissingDeviceIsOneLineNamingThePath) {
  const std::string message = ::openshell::testing::error_of([] { Kvm::open("/nonexistent/kvm"); });
  EXPECT_EQ(message, "/nonexistent/kvm: No such file or directory");
}

TEST(VmKvm, RealModeGuestWritesHelloThenIsStopped) {
  OSH_REQUIRE_KVM(kvm);
  GuestOptions options;
  options.stop_after = "hello\n";
  const auto result = run_flat_guest(*kvm, "real_hello", GuestStart::kReal, options);
  EXPECT_EQ(result.serial, "hello\n");
  // HLT with interrupts off stays in the kernel's halt (in-kernel LAPIC);
  // where KVM reports it instead, the VM ends as halted.
  EXPECT_TRUE(result.end.reason == EndReason::kStopped || result.end.reason == EndReason::kHalted)
      << end_reason_name(result.end.reason) << ": " << result.end.detail;
}

TEST(VmKvm, RealModeGuestReachesLongModeByItself) {
  OSH_REQUIRE_KVM(kvm);
  const auto result = run_flat_guest(*kvm, "real_to_long", GuestStart::kReal);
  EXPECT_EQ(result.serial, "long mode\n");
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
}

TEST(VmKvm, BootCodeStartsAGuestInLongModeWithTheHypervisorBit) {
  OSH_REQUIRE_KVM(kvm);
  const auto result = run_flat_guest(*kvm, "long_hello", GuestStart::kLong);
  EXPECT_EQ(result.serial, "long hypervisor\n");
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
  EXPECT_EQ(result.end.detail, "the guest asked for a reset");
}

TEST(VmKvm, TripleFaultEndsTheVmNotTheProcess) {
  OSH_REQUIRE_KVM(kvm);
  const auto result = run_flat_guest(*kvm, "triple_fault", GuestStart::kLong);
  EXPECT_EQ(result.serial, "!");
  EXPECT_EQ(result.end.reason, EndReason::kTripleFault) << result.end.detail;
  EXPECT_EQ(result.end.detail, "triple fault");
  // The process goes on: another VM runs after it.
  EXPECT_EQ(run_flat_guest(*kvm, "long_hello", GuestStart::kLong).serial, "long hypervisor\n");
}

TEST(VmKvm, MmioReachesTheDeviceAndDoorbellsRingItsEventfd) {
  OSH_REQUIRE_KVM(kvm);
  RecordingDevice device;
  GuestOptions options;
  options.devices = {&device};
  const auto result = run_flat_guest(*kvm, "mmio", GuestStart::kLong, options);
  EXPECT_EQ(result.serial, "K");
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
  const auto writes = device.writes();
  ASSERT_EQ(writes.count(0x10), 1u);
  EXPECT_EQ(writes.at(0x10), 0xabcdu);
  // The doorbell went to the eventfd, not to write().
  EXPECT_EQ(writes.count(0x50), 0u);
  EXPECT_EQ(device.rings(), 1u);
}

// The mmio guest's 4-byte write at `target` (patched into its first quadword).
testing::GuestResult mmio_write_at(const Kvm& kvm, uint64_t target,
                                   std::vector<MmioDevice*> devices) {
  GuestOptions options;
  options.devices = std::move(devices);
  options.patch = [target](GuestMemory& memory) {
    ASSERT_TRUE(memory.write(layout::kKernelStart + 8, &target, 8));
  };
  return run_flat_guest(kvm, "mmio", GuestStart::kLong, options);
}

TEST(VmKvm, MmioToAWindowNoDeviceHasEndsTheVmInError) {
  OSH_REQUIRE_KVM(kvm);
  RecordingDevice device;
  const auto result = mmio_write_at(*kvm, layout::mmio_window(5), {&device});
  EXPECT_EQ(result.serial, "K");  // the access before it was served; no '+' after it
  EXPECT_EQ(result.end.reason, EndReason::kError);
  EXPECT_EQ(result.end.detail, "MMIO write of 4 bytes at 0xd0005000: no device there");
}

TEST(VmKvm, MisalignedMmioEndsTheVmInError) {
  OSH_REQUIRE_KVM(kvm);
  RecordingDevice device;
  const auto result = mmio_write_at(*kvm, layout::mmio_window(0) + 2, {&device});
  EXPECT_EQ(result.end.reason, EndReason::kError);
  EXPECT_EQ(result.end.detail, "MMIO write of 4 bytes at 0xd0000002: misaligned");
  EXPECT_EQ(device.writes().count(2), 0u);
}

TEST(VmKvm, AnAccessBeyondRamOutsideTheHoleEndsTheVmInError) {
  OSH_REQUIRE_KVM(kvm);
  const auto result = mmio_write_at(*kvm, 0x40000000, {});  // 1 GiB, the guest has 16 MiB
  EXPECT_EQ(result.end.reason, EndReason::kError);
  // The first access (window 0) already has no device.
  EXPECT_EQ(result.end.detail, "MMIO write of 4 bytes at 0xd0000010: no device there");
}

TEST(VmKvm, ADeviceFatalErrorEndsTheVmWithItsReason) {
  OSH_REQUIRE_KVM(kvm);
  RecordingDevice device;
  device.fatal_ = "a loop in a descriptor chain";
  const auto result = mmio_write_at(*kvm, 0, {&device});
  EXPECT_EQ(result.serial, "");
  EXPECT_EQ(result.end.reason, EndReason::kError);
  EXPECT_EQ(result.end.detail, "test-device: a loop in a descriptor chain");
}

// A device whose interrupt the guest raises by writing at 0x60 (when it
// has an interrupt eventfd at all).
class InterruptingDevice : public MmioDevice {
 public:
  explicit InterruptingDevice(bool wired)
      : irq_(wired ? ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK) : -1) {}
  std::string name() const override { return "interrupting-device"; }
  void read(uint64_t, uint8_t* data, uint32_t len) override { std::memset(data, 0, len); }
  void write(uint64_t offset, const uint8_t*, uint32_t) override {
    const uint64_t one = 1;
    if (offset == 0x60 && irq_) EXPECT_EQ(::write(irq_.get(), &one, sizeof one), 8);
  }
  int interrupt_fd() const override { return irq_.get(); }

 private:
  UniqueFd irq_;
};

GuestOptions interrupt_on_pin(uint64_t pin) {
  GuestOptions options;
  options.patch = [pin](GuestMemory& memory) {
    ASSERT_TRUE(memory.write(layout::kKernelStart + 8, &pin, 8));
  };
  return options;
}

TEST(VmKvm, TheSerialPortsInterruptReachesTheGuestThroughTheIoapic) {
  OSH_REQUIRE_KVM(kvm);
  const auto result =
      run_flat_guest(*kvm, "interrupt", GuestStart::kLong, interrupt_on_pin(layout::kSerialIrq));
  EXPECT_EQ(result.serial, "irq");
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
}

TEST(VmKvm, ADevicesInterruptEventfdReachesTheGuestAtItsIrq) {
  OSH_REQUIRE_KVM(kvm);
  InterruptingDevice device(true);
  GuestOptions options = interrupt_on_pin(layout::device_irq(0));
  options.devices = {&device};
  const auto result = run_flat_guest(*kvm, "interrupt", GuestStart::kLong, options);
  EXPECT_EQ(result.serial, "irq");
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
}

TEST(VmKvm, WithoutAnInterruptEventfdTheGuestWaitsForever) {
  OSH_REQUIRE_KVM(kvm);
  InterruptingDevice device(false);
  GuestOptions options = interrupt_on_pin(layout::device_irq(0));
  options.devices = {&device};
  options.timeout_ms = 200;
  options.stop_after = "never written";
  const auto result = run_flat_guest(*kvm, "interrupt", GuestStart::kLong, options);
  EXPECT_EQ(result.serial, "");
  EXPECT_EQ(result.end.reason, EndReason::kStopped) << result.end.detail;
}

TEST(VmKvm, StopEndsAGuestThatRunsForeverWithinABound) {
  OSH_REQUIRE_KVM(kvm);
  GuestOptions options;
  options.stop_after = "s";
  const auto result = run_flat_guest(*kvm, "spin", GuestStart::kLong, options);
  EXPECT_EQ(result.serial, "s");
  EXPECT_EQ(result.end.reason, EndReason::kStopped) << result.end.detail;
  EXPECT_LT(result.stop_ms, 2000.0);  // not a timeout: KVM_RUN left at once
  RecordProperty("stop_ms", std::to_string(result.stop_ms));
}

TEST(VmKvm, TwoVcpusRunAndSeeTheirOwnApicIds) {
  OSH_REQUIRE_KVM(kvm);
  if (kvm->max_vcpus() < 2) GTEST_SKIP() << "this host's KVM runs one vCPU per VM";
  GuestOptions options;
  options.vcpus = 2;
  const auto result = run_flat_guest(*kvm, "two_cpus", GuestStart::kLong, options);
  EXPECT_TRUE(result.serial == "01\n" || result.serial == "10\n") << result.serial;
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
}

TEST(VmKvm, RefusesMoreVcpusThanTheHostRuns) {
  OSH_REQUIRE_KVM(kvm);
  const std::string message = ::openshell::testing::error_of([&] {
    Vm::create(*kvm, GuestMemory::create(2 << 20), VmOptions{kvm->max_vcpus() + 1, {}, {}});
  });
  EXPECT_NE(message.find("vCPUs: this host's KVM runs 1 to"), std::string::npos) << message;
}

TEST(VmKvm, DestroyingARunningVmStopsIt) {
  OSH_REQUIRE_KVM(kvm);
  std::vector<uint8_t> spin = testing::read_guest("spin");
  GuestMemory memory = GuestMemory::create(4 << 20);
  ASSERT_TRUE(memory.write(layout::kKernelStart, spin.data(), spin.size()));
  auto vm = Vm::create(*kvm, std::move(memory), {});
  vm->set_entry(0, {CpuEntry::Mode::kLong, layout::kKernelStart, layout::kBootStack, 0, 0, 0});
  vm->start();
  EXPECT_EQ(vm->wait(20).reason, EndReason::kRunning);
  vm.reset();  // joins its thread; a leak or a hang fails the test run
}

}  // namespace
}  // namespace openshell::vm
