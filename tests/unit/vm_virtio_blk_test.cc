// virtio-blk driven as a guest's driver drives it: requests laid out in
// guest memory, the doorbell rung, the answer read from the used ring and
// the status byte, the disk file checked behind the device's back.
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "virtio_driver.h"
#include "vm/guest_memory.h"
#include "vm/virtio_blk.h"

namespace openshell::vm {
namespace {

using testing::Driver;
using testing::Segment;
using testing::Used;

constexpr uint64_t kVersion1 = 1ull << virtio_mmio::kFeatureVersion1;
constexpr uint64_t kSectors = 64;

class VirtioBlkTest : public ::testing::Test {
 protected:
  void open(bool read_only) {
    memory_ = std::make_unique<GuestMemory>(GuestMemory::create(testing::kMemoryBytes));
    if (disk_ >= 0) ::close(disk_);
    disk_ = ::memfd_create("virtio-blk-test", MFD_CLOEXEC);
    ASSERT_GE(disk_, 0);
    ASSERT_EQ(::ftruncate(disk_, kSectors * 512), 0);
    // A pattern to read back: sector s is filled with the byte s.
    for (uint64_t s = 0; s < kSectors; ++s) {
      std::string fill(512, static_cast<char>(s));
      ASSERT_EQ(::pwrite(disk_, fill.data(), 512, s * 512), 512);
    }
    device_ = std::make_unique<VirtioBlk>(*memory_, UniqueFd(::dup(disk_)), read_only, "disk-7");
    device_->start();
    driver_ = std::make_unique<Driver>(*device_, *memory_);
    ASSERT_TRUE(driver_->bring_up(kVersion1, 1, 16));
  }
  void SetUp() override { open(false); }
  void TearDown() override {
    device_.reset();
    if (disk_ >= 0) ::close(disk_);
  }

  // A request: header, `data_bytes` of data (readable for OUT, writable
  // otherwise), a status byte. Returns the used element; data and status
  // stay at data_ and status_.
  Used request(uint32_t type, uint64_t sector, uint32_t data_bytes, const std::string& out = "") {
    uint64_t header = driver_->alloc(16);
    uint8_t h[16] = {};
    std::memcpy(h, &type, 4);
    std::memcpy(h + 8, &sector, 8);
    std::memcpy(driver_->host(header, 16), h, 16);
    data_ = driver_->alloc(data_bytes ? data_bytes : 1);
    if (!out.empty()) std::memcpy(driver_->host(data_, out.size()), out.data(), out.size());
    status_ = driver_->alloc(1);
    *driver_->host(status_, 1) = 0xee;
    std::vector<Segment> chain{{header, 16, false}};
    if (data_bytes) chain.push_back({data_, data_bytes, type != virtio_blk::kOut});
    chain.push_back({status_, 1, true});
    driver_->post(0, chain);
    driver_->notify(0);
    Used used;
    EXPECT_TRUE(driver_->wait_used(0, used)) << device_->fatal();
    return used;
  }
  uint8_t status() { return *driver_->host(status_, 1); }
  std::string data(uint32_t bytes) {
    return std::string(reinterpret_cast<char*>(driver_->host(data_, bytes)), bytes);
  }
  std::string disk(uint64_t offset, size_t bytes) {
    std::string out(bytes, '\0');
    EXPECT_EQ(::pread(disk_, out.data(), bytes, offset), static_cast<ssize_t>(bytes));
    return out;
  }

  std::unique_ptr<GuestMemory> memory_;
  int disk_ = -1;
  std::unique_ptr<VirtioBlk> device_;
  std::unique_ptr<Driver> driver_;
  uint64_t data_ = 0;
  uint64_t status_ = 0;
};

TEST_F(VirtioBlkTest, ConfigSaysCapacityBlockSizeAndSegments) {
  EXPECT_EQ(driver_->get(virtio_mmio::kDeviceId), virtio_blk::kDeviceId);
  EXPECT_EQ(driver_->config64(virtio_blk::kConfigCapacity), kSectors);
  EXPECT_EQ(driver_->config32(virtio_blk::kConfigBlkSize), 512u);
  EXPECT_EQ(driver_->config32(virtio_blk::kConfigSegMax), virtio_blk::kQueueSize - 2u);
  uint64_t features = driver_->device_features();
  EXPECT_TRUE(features & (1ull << virtio_blk::kFlush));
  EXPECT_FALSE(features & (1ull << virtio_blk::kReadOnly));
}

TEST_F(VirtioBlkTest, ReadsTheSectorsItIsAskedFor) {
  Used used = request(virtio_blk::kIn, 3, 1024);
  EXPECT_EQ(status(), virtio_blk::kOk);
  EXPECT_EQ(used.length, 1025u);  // the data and the status byte
  EXPECT_EQ(data(1024), std::string(512, '\3') + std::string(512, '\4'));
}

TEST_F(VirtioBlkTest, WritesASectorAndReadsItBack) {
  std::string sector(512, 'w');
  sector.replace(0, 5, "hello");
  request(virtio_blk::kOut, 10, 512, sector);
  EXPECT_EQ(status(), virtio_blk::kOk);
  EXPECT_EQ(disk(10 * 512, 512), sector);
  EXPECT_EQ(disk(11 * 512, 1), std::string(1, '\13'));  // its neighbour untouched
  request(virtio_blk::kIn, 10, 512);
  EXPECT_EQ(status(), virtio_blk::kOk);
  EXPECT_EQ(data(512), sector);
}

TEST_F(VirtioBlkTest, FlushAnswersOk) {
  Used used = request(virtio_blk::kFlushRequest, 0, 0);
  EXPECT_EQ(status(), virtio_blk::kOk);
  EXPECT_EQ(used.length, 1u);
}

TEST_F(VirtioBlkTest, GetIdAnswersTheDisksId) {
  request(virtio_blk::kGetId, 0, virtio_blk::kIdBytes);
  EXPECT_EQ(status(), virtio_blk::kOk);
  EXPECT_EQ(data(virtio_blk::kIdBytes), std::string("disk-7") + std::string(14, '\0'));
}

TEST_F(VirtioBlkTest, UnknownRequestTypeIsUnsupported) {
  request(77, 0, 512);
  EXPECT_EQ(status(), virtio_blk::kUnsupported);
}

TEST_F(VirtioBlkTest, RequestsPastTheEndAreIoErrorsAndTouchNothing) {
  request(virtio_blk::kIn, kSectors, 512);  // the first sector past the end
  EXPECT_EQ(status(), virtio_blk::kIoError);
  EXPECT_EQ(data(512), std::string(512, '\0'));
  request(virtio_blk::kIn, kSectors - 1, 1024);  // starts inside, ends outside
  EXPECT_EQ(status(), virtio_blk::kIoError);
  // sector * 512 wraps around 2^64 to a small offset: still past the end.
  request(virtio_blk::kOut, (1ull << 55), 512, std::string(512, 'x'));
  EXPECT_EQ(status(), virtio_blk::kIoError);
  request(virtio_blk::kOut, ~0ull, 512, std::string(512, 'x'));
  EXPECT_EQ(status(), virtio_blk::kIoError);
  EXPECT_EQ(disk(0, 512), std::string(512, '\0'));
  EXPECT_EQ(device_->fatal(), "");
}

TEST_F(VirtioBlkTest, DataThatIsNotWholeSectorsIsAnIoError) {
  request(virtio_blk::kOut, 0, 100, std::string(100, 'x'));
  EXPECT_EQ(status(), virtio_blk::kIoError);
  EXPECT_EQ(disk(0, 100), std::string(100, '\0'));
}

TEST_F(VirtioBlkTest, AReadOnlyDiskRefusesWrites) {
  device_.reset();
  open(true);
  EXPECT_TRUE(driver_->device_features() & (1ull << virtio_blk::kReadOnly));
  request(virtio_blk::kOut, 2, 512, std::string(512, 'x'));
  EXPECT_EQ(status(), virtio_blk::kIoError);
  EXPECT_EQ(disk(2 * 512, 512), std::string(512, '\2'));
  request(virtio_blk::kIn, 2, 512);
  EXPECT_EQ(status(), virtio_blk::kOk);
  EXPECT_EQ(data(512), std::string(512, '\2'));
}

TEST_F(VirtioBlkTest, AChainWithoutAStatusByteGoesBackUntouched) {
  // A read whose every buffer is device-readable: nowhere to put the answer.
  uint64_t header = driver_->alloc(16);
  uint64_t data = driver_->alloc(512);
  std::memset(driver_->host(data, 512), 'u', 512);
  driver_->post(0, {{header, 16, false}, {data, 512, false}});
  driver_->notify(0);
  Used used;
  ASSERT_TRUE(driver_->wait_used(0, used));
  EXPECT_EQ(used.length, 0u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(driver_->host(data, 512)), 512),
            std::string(512, 'u'));
  EXPECT_GE(device_->faults(), 1u);
  // A header shorter than 16 bytes is refused the same way.
  driver_->post(0, {{header, 8, false}, {data, 1, true}});
  driver_->notify(0);
  ASSERT_TRUE(driver_->wait_used(0, used));
  EXPECT_EQ(used.length, 0u);
  // And the device still serves the next request.
  request(virtio_blk::kIn, 1, 512);
  EXPECT_EQ(status(), virtio_blk::kOk);
  EXPECT_EQ(device_->fatal(), "");
}

TEST_F(VirtioBlkTest, AHeaderAndDataMaySpanDescriptorsAnyWay) {
  // The header in two pieces, the data and the status in one buffer.
  uint64_t header = driver_->alloc(16);
  uint32_t type = virtio_blk::kIn;
  uint64_t sector = 5;
  std::memcpy(driver_->host(header, 4), &type, 4);
  std::memcpy(driver_->host(header + 8, 8), &sector, 8);
  uint64_t answer = driver_->alloc(513);
  driver_->post(0, {{header, 6, false}, {header + 6, 10, false}, {answer, 513, true}});
  driver_->notify(0);
  Used used;
  ASSERT_TRUE(driver_->wait_used(0, used));
  EXPECT_EQ(used.length, 513u);
  std::string got(reinterpret_cast<char*>(driver_->host(answer, 513)), 513);
  EXPECT_EQ(got, std::string(512, '\5') + std::string(1, '\0'));
}

TEST_F(VirtioBlkTest, IndirectDescriptorsCarryARequest) {
  ASSERT_TRUE(driver_->device_features() & (1ull << kVirtioRingIndirectDesc));
  ASSERT_TRUE(driver_->bring_up(kVersion1 | (1ull << kVirtioRingIndirectDesc), 1, 16));
  uint64_t header = driver_->alloc(16);
  uint64_t sector = 9;
  std::memcpy(driver_->host(header + 8, 8), &sector, 8);
  uint64_t data = driver_->alloc(512);
  uint64_t status = driver_->alloc(1);
  uint64_t table = driver_->alloc(48);
  auto entry = [&](int i, uint64_t address, uint32_t length, uint16_t flags, uint16_t next) {
    uint8_t* d = driver_->host(table + 16 * i, 16);
    std::memcpy(d, &address, 8);
    std::memcpy(d + 8, &length, 4);
    std::memcpy(d + 12, &flags, 2);
    std::memcpy(d + 14, &next, 2);
  };
  entry(0, header, 16, 1, 1);
  entry(1, data, 512, 3, 2);
  entry(2, status, 1, 2, 0);
  driver_->write_descriptor(0, 0, table, 48, 4, 0);
  driver_->make_available(0, 0);
  driver_->notify(0);
  Used used;
  ASSERT_TRUE(driver_->wait_used(0, used)) << device_->fatal();
  EXPECT_EQ(*driver_->host(status, 1), virtio_blk::kOk);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(driver_->host(data, 512)), 512),
            std::string(512, '\11'));
}

TEST_F(VirtioBlkTest, TheDoorbellEventfdWorksLikeAWriteToQueueNotify) {
  std::vector<Doorbell> bells = device_->doorbells();
  ASSERT_EQ(bells.size(), 1u);
  EXPECT_EQ(bells[0].offset, virtio_mmio::kQueueNotify);
  EXPECT_EQ(bells[0].value, 0u);
  uint64_t header = driver_->alloc(16);
  uint64_t data = driver_->alloc(512);
  uint64_t status = driver_->alloc(1);
  driver_->post(0, {{header, 16, false}, {data, 512, true}, {status, 1, true}});
  uint64_t one = 1;  // what KVM does on the guest's write, without an exit
  ASSERT_EQ(::write(bells[0].event_fd, &one, 8), 8);
  Used used;
  ASSERT_TRUE(driver_->wait_used(0, used));
  EXPECT_EQ(*driver_->host(status, 1), virtio_blk::kOk);
  EXPECT_TRUE(driver_->wait_interrupt()) << "no interrupt after the request completed";
}

}  // namespace
}  // namespace openshell::vm
