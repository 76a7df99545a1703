// virtio-blk (virtio 1.x, 5.2) over a file: the sandbox's disk. One request
// queue; IN, OUT, FLUSH and GET_ID; a read-only disk refuses OUT. Every
// request is checked against the capacity before the file is touched.
#pragma once

#include <cstdint>
#include <string>

#include "base/unique_fd.h"
#include "vm/virtio_mmio.h"

namespace openshell::vm {

namespace virtio_blk {
inline constexpr uint32_t kDeviceId = 2;
inline constexpr uint16_t kQueueSize = 128;
inline constexpr uint64_t kSectorSize = 512;
inline constexpr uint32_t kIdBytes = 20;  // VIRTIO_BLK_ID_BYTES

// Feature bits.
inline constexpr uint32_t kSegMax = 2;
inline constexpr uint32_t kReadOnly = 5;
inline constexpr uint32_t kBlkSize = 6;
inline constexpr uint32_t kFlush = 9;

// Request types and status bytes.
inline constexpr uint32_t kIn = 0;
inline constexpr uint32_t kOut = 1;
inline constexpr uint32_t kFlushRequest = 4;
inline constexpr uint32_t kGetId = 8;
inline constexpr uint8_t kOk = 0;
inline constexpr uint8_t kIoError = 1;
inline constexpr uint8_t kUnsupported = 2;

// Offsets in the config space.
inline constexpr uint64_t kConfigCapacity = 0;  // le64, in 512-byte sectors
inline constexpr uint64_t kConfigSegMax = 12;   // le32
inline constexpr uint64_t kConfigBlkSize = 20;  // le32
}  // namespace virtio_blk

class VirtioBlk : public VirtioMmio {
 public:
  // `disk` is read and written with pread/pwrite; its size, rounded down to
  // whole sectors, is the capacity. `id` is GET_ID's answer (20 bytes at
  // most). Throws Error.
  VirtioBlk(const GuestMemory& memory, UniqueFd disk, bool read_only, std::string id);
  ~VirtioBlk() override;

  std::string name() const override { return "virtio-blk"; }
  uint64_t capacity_sectors() const { return capacity_; }

 protected:
  void read_config(uint64_t offset, uint8_t* data, uint32_t len) override;
  void queue_notified(uint16_t queue) override;

 private:
  // The status byte to write, and how many data bytes were written.
  uint8_t handle(const Chain& chain, uint64_t data_bytes, uint32_t& data_written);
  bool in_range(uint64_t sector, uint64_t bytes) const;

  UniqueFd disk_;
  bool read_only_;
  std::string id_;
  uint64_t capacity_ = 0;
};

}  // namespace openshell::vm
