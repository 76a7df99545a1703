// The virtio-mmio transport as a guest's driver meets it, and the queues
// against a hostile guest: every broken ring ends in fatal() with a reason,
// never in a crash, a hang or a host address outside guest RAM.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "virtio_driver.h"
#include "vm/guest_memory.h"
#include "vm/layout.h"
#include "vm/virtio_blk.h"

namespace openshell::vm {
namespace {

using testing::Driver;
using testing::Segment;
using testing::Used;

constexpr uint64_t kVersion1 = 1ull << virtio_mmio::kFeatureVersion1;
constexpr uint64_t kIndirect = 1ull << kVirtioRingIndirectDesc;

class VirtioMmioTest : public ::testing::Test {
 protected:
  void SetUp() override {
    memory_ = std::make_unique<GuestMemory>(GuestMemory::create(testing::kMemoryBytes));
    int disk = ::memfd_create("virtio-mmio-test", MFD_CLOEXEC);
    ASSERT_GE(disk, 0);
    ASSERT_EQ(::ftruncate(disk, 64 * 512), 0);
    device_ = std::make_unique<VirtioBlk>(*memory_, UniqueFd(disk), false, "d");
    device_->start();
    driver_ = std::make_unique<Driver>(*device_, *memory_);
  }

  // A good read request of one sector: header, data, status.
  std::vector<Segment> good_request() {
    uint64_t header = driver_->alloc(16);
    return {{header, 16, false}, {driver_->alloc(512), 512, true}, {driver_->alloc(1), 1, true}};
  }

  // After a fatal error the device answers nothing more, however the
  // driver asks.
  void expect_no_answer_to_a_good_request() {
    uint16_t before = driver_->used_idx(0);
    driver_->post(0, good_request());
    driver_->notify(0);
    device_->stop();  // the device's thread has seen the doorbell, or never will
    device_->service();
    EXPECT_EQ(driver_->used_idx(0), before);
  }

  std::unique_ptr<GuestMemory> memory_;
  std::unique_ptr<VirtioBlk> device_;
  std::unique_ptr<Driver> driver_;
};

TEST(VirtioMmioCmdline, DeclaresEachDevicesWindowAndInterrupt) {
  EXPECT_EQ(virtio_mmio_cmdline(0), "virtio_mmio.device=4K@0xd0000000:5");
  EXPECT_EQ(virtio_mmio_cmdline(3), "virtio_mmio.device=4K@0xd0003000:8");
}

TEST_F(VirtioMmioTest, IdentifiesItselfAsAVersion2VirtioDevice) {
  EXPECT_EQ(driver_->get(virtio_mmio::kMagicValue), 0x74726976u);
  EXPECT_EQ(driver_->get(virtio_mmio::kVersionReg), 2u);
  EXPECT_EQ(driver_->get(virtio_mmio::kDeviceId), 2u);
  EXPECT_EQ(driver_->get(virtio_mmio::kVendorIdReg), virtio_mmio::kVendorId);
  EXPECT_TRUE(driver_->device_features() & kVersion1);
  driver_->set(virtio_mmio::kQueueSel, 0);
  EXPECT_EQ(driver_->get(virtio_mmio::kQueueNumMax), virtio_blk::kQueueSize);
  driver_->set(virtio_mmio::kQueueSel, 1);  // a queue the device lacks
  EXPECT_EQ(driver_->get(virtio_mmio::kQueueNumMax), 0u);
}

TEST_F(VirtioMmioTest, KeepsFeaturesOkOnlyForOfferedFeaturesWithVersion1) {
  EXPECT_FALSE(driver_->negotiate(0));                         // a legacy driver
  EXPECT_FALSE(driver_->negotiate(kVersion1 | (1ull << 40)));  // a bit it never offered
  EXPECT_TRUE(driver_->negotiate(kVersion1 | (1ull << virtio_blk::kFlush)));
}

TEST_F(VirtioMmioTest, StatusBitsOnlyAccumulateUntilAReset) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  uint32_t ok = driver_->get(virtio_mmio::kStatus);
  EXPECT_TRUE(ok & virtio_mmio::kDriverOk);
  driver_->set(virtio_mmio::kStatus, virtio_mmio::kAcknowledge);  // clearing bits: refused
  EXPECT_EQ(driver_->get(virtio_mmio::kStatus), ok);
  driver_->set(virtio_mmio::kStatus, 0);
  EXPECT_EQ(driver_->get(virtio_mmio::kStatus), 0u);
  driver_->set(virtio_mmio::kQueueSel, 0);
  EXPECT_EQ(driver_->get(virtio_mmio::kQueueReady), 0u);
  // DRIVER_OK without FEATURES_OK is refused.
  driver_->set(virtio_mmio::kStatus,
               virtio_mmio::kAcknowledge | virtio_mmio::kDriver | virtio_mmio::kDriverOk);
  EXPECT_EQ(driver_->get(virtio_mmio::kStatus), virtio_mmio::kAcknowledge | virtio_mmio::kDriver);
}

TEST_F(VirtioMmioTest, AccessesOutsideTheContractAreIgnoredAndCounted) {
  uint64_t before = device_->faults();
  uint16_t narrow = 0xffff;
  device_->read(virtio_mmio::kMagicValue, reinterpret_cast<uint8_t*>(&narrow), 2);
  EXPECT_EQ(narrow, 0);
  driver_->get(0x0b0);                         // no such register
  driver_->set(virtio_mmio::kQueueNotify, 7);  // no such queue
  EXPECT_EQ(device_->faults(), before + 3);
  // A queue's setup cannot change while it is ready.
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  driver_->set(virtio_mmio::kQueueSel, 0);
  driver_->set(virtio_mmio::kQueueDescLow, 0xdead0000);
  EXPECT_EQ(device_->faults(), before + 4);
  Used used;
  driver_->post(0, good_request());
  driver_->notify(0);
  EXPECT_TRUE(driver_->wait_used(0, used));
}

TEST_F(VirtioMmioTest, TheInterruptSaysUsedBufferUntilAcknowledged) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  driver_->post(0, good_request());
  driver_->notify(0);
  uint64_t count = 0;
  pollfd p{device_->interrupt_fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 30000), 1);
  ASSERT_EQ(::read(device_->interrupt_fd(), &count, 8), 8);
  EXPECT_EQ(driver_->get(virtio_mmio::kInterruptStatus), virtio_mmio::kUsedBuffer);
  driver_->set(virtio_mmio::kInterruptAck, virtio_mmio::kUsedBuffer);
  EXPECT_EQ(driver_->get(virtio_mmio::kInterruptStatus), 0u);
}

TEST_F(VirtioMmioTest, AQueueSizeThatIsNotAPowerOfTwoIsFatal) {
  ASSERT_TRUE(driver_->negotiate(kVersion1));
  driver_->setup_queue(0, 12);
  EXPECT_NE(device_->fatal().find("queue size 12 is not a power of two up to 128"),
            std::string::npos)
      << device_->fatal();
}

TEST_F(VirtioMmioTest, ARingOutsideGuestRamIsFatal) {
  ASSERT_TRUE(driver_->negotiate(kVersion1));
  driver_->set(virtio_mmio::kQueueSel, 0);
  driver_->set(virtio_mmio::kQueueNum, 16);
  driver_->set(virtio_mmio::kQueueDescLow, static_cast<uint32_t>(layout::kMmioStart));
  driver_->set(virtio_mmio::kQueueDriverLow, 0x20000);
  driver_->set(virtio_mmio::kQueueDeviceLow, 0x21000);
  driver_->set(virtio_mmio::kQueueReady, 1);
  EXPECT_EQ(driver_->get(virtio_mmio::kQueueReady), 0u);
  EXPECT_EQ(device_->fatal(),
            "virtio-blk: queue 0: the descriptor table at 0xd0000000 (256 bytes) is outside "
            "guest RAM");
  EXPECT_TRUE(driver_->get(virtio_mmio::kStatus) & virtio_mmio::kDeviceNeedsReset);
}

TEST_F(VirtioMmioTest, ADescriptorLoopIsFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  uint64_t buffer = driver_->alloc(16);
  driver_->write_descriptor(0, 0, buffer, 16, 1, 1);  // 0 -> 1 -> 0 -> ...
  driver_->write_descriptor(0, 1, buffer, 16, 1, 0);
  driver_->make_available(0, 0);
  driver_->notify(0);
  EXPECT_EQ(driver_->wait_fatal(),
            "virtio-blk: queue 0: the descriptor chain from head 0 is longer than the queue's "
            "size 16 (a loop)");
  expect_no_answer_to_a_good_request();
}

TEST_F(VirtioMmioTest, AChainLongerThanTheQueueIsFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1 | kIndirect, 1, 16));
  // An indirect table of 129 descriptors: more than the queue's maximum.
  uint64_t table = driver_->alloc(129 * 16);
  driver_->write_descriptor(0, 0, table, 129 * 16, 4, 0);
  driver_->make_available(0, 0);
  driver_->notify(0);
  EXPECT_NE(driver_->wait_fatal().find("an indirect table of 2064 bytes"), std::string::npos)
      << device_->fatal();
}

TEST_F(VirtioMmioTest, ALoopInsideAnIndirectTableIsFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1 | kIndirect, 1, 16));
  uint64_t table = driver_->alloc(32);
  uint64_t buffer = driver_->alloc(16);
  uint8_t d[32] = {};
  uint32_t length = 16;
  uint16_t next_flag = 1;
  for (int i = 0; i < 2; ++i) {
    std::memcpy(d + 16 * i, &buffer, 8);
    std::memcpy(d + 16 * i + 8, &length, 4);
    std::memcpy(d + 16 * i + 12, &next_flag, 2);
    uint16_t next = 1 - i;
    std::memcpy(d + 16 * i + 14, &next, 2);
  }
  std::memcpy(driver_->host(table, 32), d, 32);
  driver_->write_descriptor(0, 0, table, 32, 4, 0);
  driver_->make_available(0, 0);
  driver_->notify(0);
  EXPECT_NE(driver_->wait_fatal().find("is longer than its table (a loop)"), std::string::npos)
      << device_->fatal();
}

TEST_F(VirtioMmioTest, IndirectDescriptorsNotNegotiatedAreFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  uint64_t table = driver_->alloc(16);
  driver_->write_descriptor(0, 0, table, 16, 4, 0);
  driver_->make_available(0, 0);
  driver_->notify(0);
  EXPECT_NE(driver_->wait_fatal().find("VIRTIO_F_INDIRECT_DESC was not negotiated"),
            std::string::npos);
}

TEST_F(VirtioMmioTest, ABufferOutsideGuestRamIsFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  uint64_t header = driver_->alloc(16);
  // The last bytes of RAM and one past them.
  driver_->post(0, {{header, 16, false}, {testing::kMemoryBytes - 8, 16, true}});
  driver_->notify(0);
  EXPECT_EQ(driver_->wait_fatal(),
            "virtio-blk: queue 0: a buffer at 0x3ffff8 (16 bytes) is outside guest RAM");
  expect_no_answer_to_a_good_request();
}

TEST_F(VirtioMmioTest, AnAddressThatWrapsAroundIsFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  driver_->post(0, {{~0ull - 7, 0xffffffff, false}});
  driver_->notify(0);
  EXPECT_NE(driver_->wait_fatal().find("is outside guest RAM"), std::string::npos);
}

TEST_F(VirtioMmioTest, ADescriptorIndexOutsideTheQueueIsFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  uint64_t buffer = driver_->alloc(16);
  driver_->write_descriptor(0, 0, buffer, 16, 1, 200);
  driver_->make_available(0, 0);
  driver_->notify(0);
  EXPECT_EQ(driver_->wait_fatal(),
            "virtio-blk: queue 0: descriptor index 200 is outside the queue of size 16");
}

TEST_F(VirtioMmioTest, AReadableBufferAfterAWritableOneIsFatal) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  uint64_t a = driver_->alloc(16);
  driver_->post(0, {{a, 16, false}, {a, 1, true}, {a, 16, false}});
  driver_->notify(0);
  EXPECT_NE(driver_->wait_fatal().find("a device-readable descriptor after a device-writable"),
            std::string::npos);
}

TEST_F(VirtioMmioTest, AnAvailableIndexThatLeapsPastTheQueueIsARunawayQueue) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  driver_->set_avail_idx(0, 17);
  driver_->notify(0);
  EXPECT_EQ(driver_->wait_fatal(),
            "virtio-blk: queue 0: runaway queue: the available index moved 17 entries ahead of "
            "the device, more than the queue's size 16");
  expect_no_answer_to_a_good_request();
}

TEST_F(VirtioMmioTest, AFullQueueIsNotARunaway) {
  ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 4));
  device_->stop();  // all four made available before the device looks
  for (int i = 0; i < 4; ++i) {
    uint64_t header = driver_->alloc(16);
    driver_->write_descriptor(0, i, header, 16, 0, 0);
    driver_->make_available(0, i);
  }
  driver_->notify(0);
  device_->service();
  EXPECT_EQ(device_->fatal(), "");
  EXPECT_EQ(driver_->used_idx(0), 4);
}

}  // namespace
}  // namespace openshell::vm
