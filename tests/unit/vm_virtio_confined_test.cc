// The devices under the device thread's seccomp filter (vm/seccomp_rules.cc),
// as the VMM runs them: a blk write and read, and a vsock connection from the
// guest with data both ways and a shutdown, in a forked child that the
// filter would kill (SIGSYS) at the first call it lacks.
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"
#include "virtio_driver.h"
#include "vm/confine.h"
#include "vm/guest_memory.h"
#include "vm/virtio_blk.h"
#include "vm/virtio_vsock.h"

namespace openshell::vm {
namespace {

using ::openshell::testing::ChildWriter;
using testing::Driver;
using testing::Used;

constexpr uint64_t kVersion1 = 1ull << virtio_mmio::kFeatureVersion1;

std::function<std::string()> device_filter() {
  return [] { return confine::install_filter(confine::Thread::kDevice); };
}

std::string blk_round_trip() {
  GuestMemory memory = GuestMemory::create(testing::kMemoryBytes);
  int disk = ::memfd_create("virtio-confined", MFD_CLOEXEC);
  if (disk < 0 || ::ftruncate(disk, 8 * 512) != 0) return "no disk";
  VirtioBlk device(memory, UniqueFd(disk), false, "c");
  device.start(device_filter());
  Driver driver(device, memory);
  if (!driver.bring_up(kVersion1, 1, 16)) return "blk bring-up";
  for (uint32_t type : {virtio_blk::kOut, virtio_blk::kFlushRequest, virtio_blk::kIn}) {
    uint64_t header = driver.alloc(16);
    std::memcpy(driver.host(header, 4), &type, 4);
    uint64_t data = driver.alloc(512);
    if (type == virtio_blk::kOut) std::memset(driver.host(data, 512), 'S', 512);
    uint64_t status = driver.alloc(1);
    *driver.host(status, 1) = 0xee;
    driver.post(0, {{header, 16, false}, {data, 512, type != virtio_blk::kOut}, {status, 1, true}});
    driver.notify(0);
    Used used;
    if (!driver.wait_used(0, used)) return "blk request " + std::to_string(type) + ": no answer";
    if (*driver.host(status, 1) != virtio_blk::kOk) return "blk request " + std::to_string(type);
    if (type == virtio_blk::kIn &&
        std::string(reinterpret_cast<char*>(driver.host(data, 512)), 512) != std::string(512, 'S'))
      return "blk read back";
  }
  return device.fatal();
}

std::string vsock_round_trip() {
  using namespace virtio_vsock;
  GuestMemory memory = GuestMemory::create(testing::kMemoryBytes);
  VirtioVsock device(memory);
  UniqueFd host;
  device.listen(1024, [&](UniqueFd fd, uint32_t) { host = std::move(fd); });
  device.start(device_filter());
  Driver driver(device, memory);
  if (!driver.bring_up(kVersion1, 3, 16)) return "vsock bring-up";
  std::vector<uint64_t> rx;
  for (int i = 0; i < 8; ++i) {
    rx.push_back(driver.alloc(1024));
    driver.post(kRxQueue, {{rx.back(), 1024, true}});
  }
  auto send = [&](uint16_t op, const std::string& payload, uint32_t flags) {
    Header h{kGuestCid,   kHostCid, 5000,  1024,  static_cast<uint32_t>(payload.size()),
             kTypeStream, op,       flags, 65536, 0};
    uint64_t at = driver.alloc(sizeof h + payload.size());
    std::memcpy(driver.host(at, sizeof h), &h, sizeof h);
    std::memcpy(driver.host(at + sizeof h, payload.size()), payload.data(), payload.size());
    driver.post(kTxQueue, {{at, static_cast<uint32_t>(sizeof h + payload.size()), false}});
    driver.notify(kTxQueue);
    Used used;
    return driver.wait_used(kTxQueue, used);
  };
  auto receive = [&](Header& h, std::string& payload) {
    Used used;
    if (!driver.wait_used(kRxQueue, used)) return false;
    uint64_t at = rx[used.id];
    std::memcpy(&h, driver.host(at, sizeof h), sizeof h);
    payload.assign(reinterpret_cast<char*>(driver.host(at + sizeof h, h.len)), h.len);
    return true;
  };
  Header h{};
  std::string payload;
  if (!send(kOpRequest, "", 0) || !receive(h, payload) || h.op != kOpResponse)
    return "vsock connect";
  if (!host) return "vsock accept";
  if (!send(kOpRw, "ping", 0)) return "vsock send";
  char buffer[8] = {};
  pollfd p{host.get(), POLLIN, 0};
  if (::poll(&p, 1, 30000) != 1 || ::read(host.get(), buffer, 4) != 4 ||
      std::string(buffer, 4) != "ping")
    return "vsock guest to host";
  if (::write(host.get(), "pong", 4) != 4) return "vsock host write";
  if (!receive(h, payload) || h.op != kOpRw || payload != "pong") return "vsock host to guest";
  if (!send(kOpShutdown, "", kShutdownSend)) return "vsock shutdown";
  if (::poll(&p, 1, 30000) != 1 || ::read(host.get(), buffer, 1) != 0) return "vsock host eof";
  return device.fatal();
}

TEST(VmVirtioConfined, DevicesWorkUnderTheDeviceThreadsFilter) {
  auto report = ::openshell::testing::run_in_child([](ChildWriter& out) {
    out.say("blk " + blk_round_trip());
    out.say("vsock " + vsock_round_trip());
  });
  EXPECT_TRUE(report.exited_cleanly())
      << (WIFSIGNALED(report.wait_status) ? "killed by signal " : "exit ")
      << (WIFSIGNALED(report.wait_status) ? WTERMSIG(report.wait_status)
                                          : WEXITSTATUS(report.wait_status));
  EXPECT_NE(report.text.find("blk \n"), std::string::npos) << report.text;
  EXPECT_NE(report.text.find("vsock \n"), std::string::npos) << report.text;
}

// The filter is really there: a call the device thread has no need for
// kills the process.
TEST(VmVirtioConfined, TheDeviceThreadsFilterKillsWhatItLacks) {
  auto report = ::openshell::testing::run_in_child([](ChildWriter&) {
    GuestMemory memory = GuestMemory::create(testing::kMemoryBytes);
    VirtioVsock device(memory);
    device.start([] {
      std::string why = confine::install_filter(confine::Thread::kDevice);
      if (why.empty()) ::socket(AF_INET, SOCK_STREAM, 0);  // not on its list
      return why;
    });
    ::sleep(30);  // the filter ends the process first
    ::_exit(3);
  });
  ASSERT_TRUE(WIFSIGNALED(report.wait_status)) << report.wait_status;
  EXPECT_EQ(WTERMSIG(report.wait_status), SIGSYS);
}

}  // namespace
}  // namespace openshell::vm
