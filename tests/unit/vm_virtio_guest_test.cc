// A guest's own virtio-blk and virtio-vsock drivers (tests/vm/guests/
// virtio_blk.S, virtio_vsock.S) against our devices, under KVM: MMIO exits for the registers, the
// doorbell through KVM_IOEVENTFD, the interrupt through KVM_IRQFD. Skips where /dev/kvm cannot be
// opened (it is root-only here).
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "vm/guest_memory.h"
#include "vm/kvm.h"
#include "vm/layout.h"
#include "vm/virtio_blk.h"
#include "vm/virtio_vsock.h"
#include "vm/vm.h"
#include "vm_guest.h"

namespace openshell::vm {
namespace {

// Stops the VM when a test leaves early, before its devices go.
struct StopFirst {
  Vm& vm;
  ~StopFirst() { vm.stop(); }
};

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
  StopFirst stop_first{*vm};
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

TEST(VmVirtioGuest, AGuestConnectsOverVsockAndTalksToTheHost) {
  OSH_REQUIRE_KVM(kvm);
  const std::vector<uint8_t> binary = testing::read_guest("virtio_vsock");
  GuestMemory memory = GuestMemory::create(16ull << 20);
  ASSERT_TRUE(memory.write(layout::kKernelStart, binary.data(), binary.size()));
  auto output = std::make_shared<std::pair<std::mutex, std::string>>();
  VmOptions options;
  options.serial_sink = [output](const char* data, size_t length) {
    std::lock_guard lock(output->first);
    output->second.append(data, length);
  };
  std::unique_ptr<Vm> vm = Vm::create(*kvm, std::move(memory), options);
  auto device = std::make_unique<VirtioVsock>(vm->memory());
  std::mutex accepted_mutex;
  UniqueFd host;
  uint32_t guest_port = 0;
  device->listen(1024, [&](UniqueFd fd, uint32_t port) {
    std::lock_guard lock(accepted_mutex);
    host = std::move(fd);
    guest_port = port;
  });
  StopFirst stop_first{*vm};
  EXPECT_EQ(vm->add_device(*device), 0u);
  device->start();
  vm->set_entry(0, {CpuEntry::Mode::kLong, layout::kKernelStart, layout::kBootStack, 0, 0, 0});
  vm->start();

  // The host's side: the guest's connection, its "ping", our "pong".
  int fd = -1;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (fd < 0 && std::chrono::steady_clock::now() < deadline) {
    {
      std::lock_guard lock(accepted_mutex);
      fd = host.get();
    }
    if (fd < 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GE(fd, 0) << "the guest never connected; serial: " << output->second;
  EXPECT_EQ(guest_port, 5000u);
  char ping[4] = {};
  pollfd p{fd, POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1);
  ASSERT_EQ(::read(fd, ping, 4), 4);
  EXPECT_EQ(std::string(ping, 4), "ping");
  ASSERT_EQ(::write(fd, "pong", 4), 4);

  VmEnd end = vm->wait(30000);
  if (end.reason == EndReason::kRunning) {
    ADD_FAILURE() << "the guest still runs after 30 s";
    vm->stop();
    end = vm->end();
  }
  // The guest's shutdown both ways ended the connection: end of file here.
  char c;
  EXPECT_EQ(::poll(&p, 1, 30000), 1);
  EXPECT_EQ(::read(fd, &c, 1), 0);
  EXPECT_EQ(device->connection_count(), 0u);
  device.reset();
  std::lock_guard lock(output->first);
  EXPECT_EQ(output->second, "pong\nOK\n");
  EXPECT_EQ(end.reason, EndReason::kGuestReset) << end.detail;
}

}  // namespace
}  // namespace openshell::vm
