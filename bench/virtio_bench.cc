// virtio_bench: the virtio devices' cost per request, without KVM: a
// driver (tests/unit/virtio_driver.h) in this process posts chains and
// rings the doorbell by QueueNotify, the device's thread answers, and the
// driver waits on the interrupt eventfd, as a guest's driver would after a
// vCPU's exit.
//
//   virtio_bench [--requests N] [--megabytes M]
//
// virtio-blk: N reads of 4 KiB, one in flight, from a 64 MiB memfd disk:
// the round trip's min, median and p99. virtio-vsock: M MiB from the
// host's end of a connection to the guest through 4 KiB rx buffers, the
// guest reposting each: MiB/s.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../tests/unit/virtio_driver.h"
#include "base/error.h"
#include "vm/guest_memory.h"
#include "vm/virtio_blk.h"
#include "vm/virtio_vsock.h"

namespace vm = openshell::vm;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint64_t kVersion1 = 1ull << vm::virtio_mmio::kFeatureVersion1;

double micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

int blk(int requests) {
  vm::GuestMemory memory = vm::GuestMemory::create(vm::testing::kMemoryBytes);
  int disk = ::memfd_create("virtio-bench", MFD_CLOEXEC);
  if (disk < 0 || ::ftruncate(disk, 64 << 20) != 0) return 1;
  vm::VirtioBlk device(memory, openshell::UniqueFd(disk), false, "bench");
  device.start();
  vm::testing::Driver driver(device, memory);
  if (!driver.bring_up(kVersion1, 1, 128)) return 1;
  uint64_t header = driver.alloc(16);
  uint64_t data = driver.alloc(4096);
  uint64_t status = driver.alloc(1);
  std::vector<double> times;
  for (int i = 0; i < requests; ++i) {
    uint64_t sector = (static_cast<uint64_t>(i) * 8) % ((64 << 20) / 512);
    std::memcpy(driver.host(header + 8, 8), &sector, 8);
    auto start = Clock::now();
    driver.post(0, {{header, 16, false}, {data, 4096, true}, {status, 1, true}});
    driver.notify(0);
    vm::testing::Used used;
    if (!driver.wait_used(0, used) || *driver.host(status, 1) != 0) return 1;
    times.push_back(micros(Clock::now() - start));
  }
  std::sort(times.begin(), times.end());
  std::printf(
      "virtio-blk: %d reads of 4 KiB, one in flight: min %.1f us, median %.1f us, p99 %.1f us\n",
      requests, times.front(), times[times.size() / 2], times[times.size() * 99 / 100]);
  return 0;
}

int vsock(int megabytes) {
  using namespace vm::virtio_vsock;
  vm::GuestMemory memory = vm::GuestMemory::create(vm::testing::kMemoryBytes);
  vm::VirtioVsock device(memory);
  openshell::UniqueFd host;
  device.listen(1024, [&](openshell::UniqueFd fd, uint32_t) { host = std::move(fd); });
  device.start();
  vm::testing::Driver driver(device, memory);
  if (!driver.bring_up(kVersion1, 3, 128)) return 1;
  std::vector<uint64_t> buffers;
  for (int i = 0; i < 64; ++i) {
    buffers.push_back(driver.alloc(4096 + sizeof(Header)));
    driver.post(kRxQueue, {{buffers.back(), 4096 + sizeof(Header), true}});
  }
  std::vector<uint64_t> by_head(128);
  for (int i = 0; i < 64; ++i) by_head[i] = buffers[i];
  Header h{kGuestCid, kHostCid, 5000, 1024, 0, kTypeStream, kOpRequest, 0, 1u << 30, 0};
  uint64_t packet = driver.alloc(sizeof h);
  std::memcpy(driver.host(packet, sizeof h), &h, sizeof h);
  driver.post(kTxQueue, {{packet, sizeof h, false}});
  driver.notify(kTxQueue);
  vm::testing::Used used;
  if (!driver.wait_used(kRxQueue, used)) return 1;  // the RESPONSE
  by_head[driver.post(kRxQueue, {{by_head[used.id], 4096 + sizeof(Header), true}})] =
      by_head[used.id];
  driver.notify(kRxQueue);
  const uint64_t total = static_cast<uint64_t>(megabytes) << 20;
  int fd = host.get();
  auto start = Clock::now();
  std::thread writer([fd, total] {
    std::vector<char> chunk(65536, 'b');
    for (uint64_t sent = 0; sent < total;) {
      ssize_t n = ::write(fd, chunk.data(), std::min<uint64_t>(chunk.size(), total - sent));
      if (n <= 0) return;
      sent += static_cast<uint64_t>(n);
    }
  });
  uint64_t received = 0;
  while (received < total) {
    if (!driver.wait_used(kRxQueue, used)) break;
    Header in;
    std::memcpy(&in, driver.host(by_head[used.id], sizeof in), sizeof in);
    if (in.op == kOpRw) received += in.len;
    uint64_t buffer = by_head[used.id];
    by_head[driver.post(kRxQueue, {{buffer, 4096 + sizeof(Header), true}})] = buffer;
    driver.notify(kRxQueue);
  }
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  writer.join();
  if (received < total) return 1;
  std::printf("virtio-vsock: %d MiB host to guest in 4 KiB rx buffers: %.0f MiB/s\n", megabytes,
              megabytes / seconds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int requests = 20000;
  int megabytes = 64;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if ((arg == "--requests" || arg == "--megabytes") && i + 1 < argc) {
      (arg == "--requests" ? requests : megabytes) = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: virtio_bench [--requests N] [--megabytes M]\n");
      return 2;
    }
  }
  try {
    if (blk(requests) != 0 || vsock(megabytes) != 0) {
      std::fprintf(stderr, "virtio_bench: a device did not answer\n");
      return 1;
    }
  } catch (const openshell::Error& e) {
    std::fprintf(stderr, "virtio_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
