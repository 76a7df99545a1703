#include "vm/chain_io.h"

#include <cstring>

namespace openshell::vm {

std::vector<iovec> buffer_slice(const std::vector<GuestBuffer>& buffers, uint64_t offset,
                                uint64_t length) {
  std::vector<iovec> slice;
  for (const GuestBuffer& buffer : buffers) {
    if (length == 0) break;
    if (offset >= buffer.length) {
      offset -= buffer.length;
      continue;
    }
    uint64_t take = buffer.length - offset;
    if (take > length) take = length;
    slice.push_back({buffer.data + offset, static_cast<size_t>(take)});
    length -= take;
    offset = 0;
  }
  return slice;
}

uint64_t copy_from_buffers(const std::vector<GuestBuffer>& buffers, uint64_t offset, void* out,
                           uint64_t length) {
  uint64_t done = 0;
  for (const iovec& piece : buffer_slice(buffers, offset, length)) {
    std::memcpy(static_cast<uint8_t*>(out) + done, piece.iov_base, piece.iov_len);
    done += piece.iov_len;
  }
  return done;
}

uint64_t copy_to_buffers(const std::vector<GuestBuffer>& buffers, uint64_t offset, const void* in,
                         uint64_t length) {
  uint64_t done = 0;
  for (const iovec& piece : buffer_slice(buffers, offset, length)) {
    std::memcpy(piece.iov_base, static_cast<const uint8_t*>(in) + done, piece.iov_len);
    done += piece.iov_len;
  }
  return done;
}

}  // namespace openshell::vm
