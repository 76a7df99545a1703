#include "vm/virtio_blk.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "vm/chain_io.h"

namespace openshell::vm {

using namespace virtio_blk;

namespace {

constexpr uint64_t kHeaderBytes = 16;  // le32 type, le32 reserved, le64 sector

uint64_t features(bool read_only) {
  uint64_t bits = (1ull << kSegMax) | (1ull << kBlkSize) | (1ull << kFlush);
  if (read_only) bits |= 1ull << kReadOnly;
  return bits;
}

// preadv/pwritev until every byte is done; false on an error or an end of
// file inside the range.
template <typename Io>
bool transfer_all(Io io, int fd, std::vector<iovec> pieces, uint64_t offset) {
  size_t first = 0;
  while (first < pieces.size()) {
    size_t count = pieces.size() - first;
    if (count > IOV_MAX) count = IOV_MAX;
    ssize_t n = io(fd, pieces.data() + first, static_cast<int>(count), static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    offset += static_cast<uint64_t>(n);
    auto done = static_cast<size_t>(n);
    while (first < pieces.size() && done >= pieces[first].iov_len) {
      done -= pieces[first].iov_len;
      ++first;
    }
    if (done > 0) {
      pieces[first].iov_base = static_cast<uint8_t*>(pieces[first].iov_base) + done;
      pieces[first].iov_len -= done;
    }
  }
  return true;
}

}  // namespace

VirtioBlk::VirtioBlk(const GuestMemory& memory, UniqueFd disk, bool read_only, std::string id)
    : VirtioMmio(memory, kDeviceId, features(read_only), {kQueueSize}),
      disk_(std::move(disk)),
      read_only_(read_only),
      id_(std::move(id)) {
  struct stat st {};
  if (::fstat(disk_.get(), &st) != 0) throw_errno("fstat the virtio-blk disk");
  capacity_ = static_cast<uint64_t>(st.st_size) / kSectorSize;
  if (id_.size() > kIdBytes) id_.resize(kIdBytes);
}

VirtioBlk::~VirtioBlk() { stop(); }

void VirtioBlk::read_config(uint64_t offset, uint8_t* data, uint32_t len) {
  uint8_t config[24] = {};
  uint32_t seg_max = kQueueSize - 2;  // a header and a status byte around the data
  uint32_t blk_size = kSectorSize;
  std::memcpy(config + kConfigCapacity, &capacity_, 8);
  std::memcpy(config + kConfigSegMax, &seg_max, 4);
  std::memcpy(config + kConfigBlkSize, &blk_size, 4);
  if (offset < sizeof config && len <= sizeof config - offset)
    std::memcpy(data, config + offset, len);
  else
    count_fault();
}

bool VirtioBlk::in_range(uint64_t sector, uint64_t bytes) const {
  // sector * 512 + bytes <= capacity * 512, without overflow.
  if (sector > capacity_) return false;
  return bytes <= (capacity_ - sector) * kSectorSize;
}

void VirtioBlk::queue_notified(uint16_t queue_index) {
  Chain chain;
  while (next_chain(queue_index, chain)) {
    // The status byte is the chain's last writable byte; a chain without
    // one cannot be answered, and goes back untouched.
    if (chain.readable_bytes < kHeaderBytes || chain.writable_bytes == 0) {
      count_fault();
      complete(queue_index, chain.head, 0);
      continue;
    }
    uint32_t data_written = 0;
    uint8_t status = handle(chain, chain.writable_bytes - 1, data_written);
    copy_to_buffers(chain.writable, chain.writable_bytes - 1, &status, 1);
    complete(queue_index, chain.head, data_written + 1);
  }
}

uint8_t VirtioBlk::handle(const Chain& chain, uint64_t data_bytes, uint32_t& data_written) {
  uint8_t header[kHeaderBytes];
  copy_from_buffers(chain.readable, 0, header, kHeaderBytes);
  uint32_t type;
  uint64_t sector;
  std::memcpy(&type, header, 4);
  std::memcpy(&sector, header + 8, 8);
  switch (type) {
    case kIn: {
      if (data_bytes % kSectorSize != 0 || !in_range(sector, data_bytes)) return kIoError;
      if (!transfer_all(::preadv, disk_.get(), buffer_slice(chain.writable, 0, data_bytes),
                        sector * kSectorSize))
        return kIoError;
      data_written = static_cast<uint32_t>(data_bytes);
      return kOk;
    }
    case kOut: {
      uint64_t bytes = chain.readable_bytes - kHeaderBytes;
      if (read_only_) return kIoError;
      if (bytes % kSectorSize != 0 || !in_range(sector, bytes)) return kIoError;
      if (!transfer_all(::pwritev, disk_.get(), buffer_slice(chain.readable, kHeaderBytes, bytes),
                        sector * kSectorSize))
        return kIoError;
      return kOk;
    }
    case kFlushRequest:
      if (read_only_) return kOk;
      return ::fdatasync(disk_.get()) == 0 ? kOk : kIoError;
    case kGetId: {
      char id[kIdBytes] = {};
      std::memcpy(id, id_.data(), id_.size());
      data_written = static_cast<uint32_t>(
          copy_to_buffers(chain.writable, 0, id, data_bytes < kIdBytes ? data_bytes : kIdBytes));
      return kOk;
    }
    default:
      return kUnsupported;
  }
}

}  // namespace openshell::vm
