// Reading and writing a chain's buffers as one byte stream: a request's
// header may lie across several descriptors, and its data may start inside
// the descriptor that holds the header.
#pragma once

#include <sys/uio.h>

#include <cstdint>
#include <vector>

#include "vm/virtqueue.h"

namespace openshell::vm {

// Copies up to `length` bytes from `offset` in the buffers; returns how many.
uint64_t copy_from_buffers(const std::vector<GuestBuffer>& buffers, uint64_t offset, void* out,
                           uint64_t length);
// Copies up to `length` bytes to `offset` in the buffers; returns how many.
uint64_t copy_to_buffers(const std::vector<GuestBuffer>& buffers, uint64_t offset, const void* in,
                         uint64_t length);
// The bytes [offset, offset + length) of the buffers (less where they end),
// as iovecs for preadv/pwritev/sendmsg.
std::vector<iovec> buffer_slice(const std::vector<GuestBuffer>& buffers, uint64_t offset,
                                uint64_t length);

}  // namespace openshell::vm
