// SOCK_SEQPACKET packets with file descriptors beside them (SCM_RIGHTS): the
// init's control channel and the gateway's exec handoff to a supervisor.
// A received descriptor is owned from the moment it arrives: whatever the
// caller does not keep is closed with the PacketFds that holds it.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "base/unique_fd.h"

namespace openshell {

inline constexpr size_t kMaxPacket = 256 * 1024;
// Fds beyond stdio that a process may be handed (oci --preserve-fds).
inline constexpr int kMaxExtraFds = 32;
inline constexpr int kMaxPacketFds = 3 + kMaxExtraFds;

// The descriptors of one packet, in the order they were sent; the rest
// invalid.
using PacketFds = std::array<UniqueFd, kMaxPacketFds>;

// Sends a packet with up to kMaxPacketFds fds (not taken: the caller still
// owns them); returns 0 or -errno. flags: more of sendmsg's (MSG_DONTWAIT).
int send_packet(int socket_fd, std::string_view packet, const int* fds, int fd_count,
                int flags = 0);

// Receives a packet and up to kMaxPacketFds fds (close-on-exec; more are
// closed); returns the packet's size, 0 at end of stream, or -errno, the
// sign send_packet uses too. A packet over kMaxPacket is -EMSGSIZE, its fds
// closed.
long receive_packet(int socket_fd, std::string* packet, PacketFds* fds);

// The same into a caller's buffer of `size` bytes (a longer packet is
// -EMSGSIZE); it allocates nothing, so a child between clone and exec may
// call it.
long receive_packet(int socket_fd, char* buffer, size_t size, PacketFds* fds);

}  // namespace openshell
