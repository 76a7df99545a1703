#include "base/packet.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace openshell {

int send_packet(int socket_fd, std::string_view packet, const int* fds, int fd_count, int flags) {
  if (fd_count < 0 || fd_count > kMaxPacketFds) return -EINVAL;
  iovec iov{const_cast<char*>(packet.data()), packet.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxPacketFds * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd_count > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(fd_count * sizeof(int));
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(fd_count * sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), fds, fd_count * sizeof(int));
  }
  for (;;) {
    ssize_t n = ::sendmsg(socket_fd, &msg, MSG_NOSIGNAL | flags);
    if (n >= 0) return 0;
    if (errno != EINTR) return -errno;
  }
}

long receive_packet(int socket_fd, std::string* packet, PacketFds* fds) {
  packet->resize(kMaxPacket);
  long n = receive_packet(socket_fd, packet->data(), packet->size(), fds);
  packet->resize(n > 0 ? static_cast<size_t>(n) : 0);
  return n;
}

long receive_packet(int socket_fd, char* buffer, size_t size, PacketFds* fds) {
  for (auto& fd : *fds) fd.reset();
  iovec iov{buffer, size};
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxPacketFds * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = ::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return -errno;
  // Owned before anything else can happen; the kernel has already closed
  // any that did not fit the control buffer (MSG_CTRUNC).
  size_t kept = 0;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      UniqueFd owned(fd);
      if (kept < fds->size()) (*fds)[kept++] = std::move(owned);
    }
  }
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    for (auto& fd : *fds) fd.reset();
    return -EMSGSIZE;
  }
  return n;
}

}  // namespace openshell
