// A guest's own virtio-blk driver (tests/vm/guests/virtio_blk.S) against
// our device, under KVM: MMIO exits for the registers, the doorbell through
// KVM_IOEVENTFD, the interrupt through KVM_IRQFD. Skips where /dev/kvm
// cannot be opened (it is root-only here).
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "vm/guest_memory.h"
#include "vm/kvm.h"
#include "vm/layout.h"
#include "vm/virtio_blk.h"
#include "vm/vm.h"
#include "vm_guest.h"

namespace openshell::vm {
namespace {

TEST(VmVirtioGuest, AGuestDriverWritesASectorAndReadsItBack) {
  OSH_REQUIRE_KVM(kvm);
  const std::vector<uint8_t> binary = testing::read_guest("virtio_blk");
  GuestMemory memory = GuestMemory::create(16ull << 20);
  ASSERT_TRUE(memory.write(layout::kKernelStart, binary.data(), binary.size()));

  auto output = std::make_shared<std::pair<std::mutex, std::string>>();
  VmOptions options;
  options.serial_sink = [output](const char* data, size_t length) {
    std::lock_guard lock(output->first);
    output->second.append(data, length);
  };
  std::unique_ptr<Vm> vm = Vm::create(*kvm, std::move(memory), options);
  int disk = ::memfd_create("virtio-guest-test", MFD_CLOEXEC);
  ASSERT_GE(disk, 0);
  ASSERT_EQ(::ftruncate(disk, 8 * 512), 0);
  auto device = std::make_unique<VirtioBlk>(vm->memory(), UniqueFd(::dup(disk)), false, "g");
  EXPECT_EQ(vm->add_device(*device), 0u);
  device->start();
  vm->set_entry(0, {CpuEntry::Mode::kLong, layout::kKernelStart, layout::kBootStack, 0, 0, 0});
  vm->start();
  VmEnd end = vm->wait(30000);
  if (end.reason == EndReason::kRunning) {
    ADD_FAILURE() << "the guest still runs after 30 s";
    vm->stop();
    end = vm->end();
  }
  device.reset();  // its thread ends before the VM's memory goes

  std::string serial;
  {
    std::lock_guard lock(output->first);
    serial = output->second;
  }
  EXPECT_EQ(serial, "OK\n");
  EXPECT_EQ(end.reason, EndReason::kGuestReset) << end.detail;
  // The sector is on the disk, behind the device's back.
  std::string sector(512, '\0');
  ASSERT_EQ(::pread(disk, sector.data(), 512, 512), 512);
  EXPECT_EQ(sector, std::string(512, 'V'));
  std::string first(512, '\1');
  ASSERT_EQ(::pread(disk, first.data(), 512, 0), 512);
  EXPECT_EQ(first, std::string(512, '\0'));
  ::close(disk);
}

}  // namespace
}  // namespace openshell::vm
