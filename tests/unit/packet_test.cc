// Packets with fds beside them (base/packet.h), as the init's control
// channel and the exec handoff use them: every fd that arrives is owned from
// the moment it does, so whatever the receiver does not keep is closed; fds
// beyond the three a packet may carry are closed; send and receive report
// errors with the same sign.
#include "base/packet.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "protocol/exec_handoff.h"

namespace openshell {
namespace {

std::string msg(std::vector<std::string> parts) {
  std::string out;
  for (const auto& part : parts) out += part + '\0';
  return out;
}

struct SocketPair {
  int fd[2] = {-1, -1};
  SocketPair() { EXPECT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fd), 0); }
  ~SocketPair() {
    for (int f : fd)
      if (f >= 0) ::close(f);
  }
};

// Sends `count` copies of `fd` with one packet, bypassing send_packet's limit.
void send_fds(int socket_fd, int fd, int count, const std::string& data = "x") {
  std::vector<int> fds(count, fd);
  iovec iov{const_cast<char*>(data.data()), data.size()};
  std::vector<char> control(CMSG_SPACE(count * sizeof(int)));
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  m.msg_control = control.data();
  m.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(count * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds.data(), count * sizeof(int));
  ASSERT_EQ(::sendmsg(socket_fd, &m, 0), static_cast<ssize_t>(data.size()));
}

// True when no copy of a pipe's write end is left open anywhere.
bool write_end_closed(int read_fd) {
  ::fcntl(read_fd, F_SETFL, O_NONBLOCK);
  char byte;
  return ::read(read_fd, &byte, 1) == 0;
}

// How many fds this process has open.
int open_fds() {
  int count = 0;
  DIR* d = ::opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') ++count;
  ::closedir(d);
  return count - 1;  // the directory's own
}

TEST(PacketReceive, FdsAndPacketArriveCloseOnExec) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  int sent[2] = {p[1], p[1]};
  ASSERT_EQ(send_packet(s.fd[0], msg({"started", "1", "2"}), sent, 2), 0);
  ::close(p[1]);
  std::string packet;
  PacketFds fds;
  ASSERT_EQ(receive_packet(s.fd[1], &packet, &fds), 12);
  EXPECT_EQ(packet, msg({"started", "1", "2"}));
  ASSERT_TRUE(fds[0]);
  ASSERT_TRUE(fds[1]);
  EXPECT_FALSE(fds[2]);
  EXPECT_EQ(::fcntl(fds[0].get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_FALSE(write_end_closed(p[0]));
  fds[0].reset();
  fds[1].reset();
  EXPECT_TRUE(write_end_closed(p[0]));
  ::close(p[0]);
}

// One fd over the limit fits the control buffer's alignment padding, so the
// kernel delivers it: receive_packet must close it, not leak it.
TEST(PacketReceive, AnFdOverTheLimitIsClosed) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  send_fds(s.fd[0], p[1], kMaxPacketFds + 1);
  ::close(p[1]);
  std::string packet;
  PacketFds fds;
  ASSERT_EQ(receive_packet(s.fd[1], &packet, &fds), 1);
  for (auto& fd : fds) {
    ASSERT_TRUE(fd);
    fd.reset();
  }
  EXPECT_TRUE(write_end_closed(p[0])) << "the fd over the limit is still open";
  ::close(p[0]);
}

TEST(PacketReceive, TooManyFdsRefuseThePacketAndCloseAll) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  send_fds(s.fd[0], p[1], kMaxPacketFds + 8);
  ::close(p[1]);
  std::string packet;
  PacketFds fds;
  EXPECT_EQ(receive_packet(s.fd[1], &packet, &fds), -EMSGSIZE);
  for (auto& fd : fds) EXPECT_FALSE(fd);
  EXPECT_TRUE(write_end_closed(p[0])) << "an fd of a refused packet is still open";
  ::close(p[0]);
}

TEST(PacketReceive, AnOversizedPacketIsRefusedAndItsFdsClosed) {
  SocketPair s;
  int size = 1 << 20;
  ::setsockopt(s.fd[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(s.fd[1], SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  std::string big(kMaxPacket + 1, 'a');
  int sent = send_packet(s.fd[0], big, &p[1], 1);
  ::close(p[1]);
  if (sent == -EMSGSIZE) GTEST_SKIP() << "the socket buffer cannot hold a packet over 256 KiB here";
  ASSERT_EQ(sent, 0);
  std::string packet;
  PacketFds fds;
  EXPECT_EQ(receive_packet(s.fd[1], &packet, &fds), -EMSGSIZE);
  EXPECT_FALSE(fds[0]);
  EXPECT_TRUE(write_end_closed(p[0]));
  ::close(p[0]);
}

TEST(PacketReceive, EndOfStreamIsZero) {
  SocketPair s;
  ::close(s.fd[0]);
  s.fd[0] = -1;
  std::string packet = "stale";
  PacketFds fds;
  EXPECT_EQ(receive_packet(s.fd[1], &packet, &fds), 0);
  EXPECT_EQ(packet, "");
}

// The container's one-byte "F"/"N" messages: received into the caller's
// buffer, and a second fd that came along is owned (closed with the
// PacketFds), not left open in the receiver.
TEST(PacketReceive, IntoABufferEveryFdIsOwned) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  send_fds(s.fd[0], p[1], 2, "F");
  ::close(p[1]);
  char tag = 0;
  {
    PacketFds fds;
    ASSERT_EQ(receive_packet(s.fd[1], &tag, 1, &fds), 1);
    EXPECT_EQ(tag, 'F');
    EXPECT_TRUE(fds[0]);
    EXPECT_TRUE(fds[1]);
    EXPECT_FALSE(write_end_closed(p[0]));
  }
  EXPECT_TRUE(write_end_closed(p[0])) << "a received fd is still open";
  ::close(p[0]);
}

TEST(PacketReceive, IntoABufferALongerPacketIsRefusedAndItsFdsClosed) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  send_fds(s.fd[0], p[1], 1, "FF");
  ::close(p[1]);
  char tag = 0;
  PacketFds fds;
  EXPECT_EQ(receive_packet(s.fd[1], &tag, 1, &fds), -EMSGSIZE);
  EXPECT_FALSE(fds[0]);
  EXPECT_TRUE(write_end_closed(p[0])) << "an fd of a refused packet is still open";
  ::close(p[0]);
}

TEST(PacketErrors, SendAndReceiveBothReturnMinusErrno) {
  SocketPair s;
  ::close(s.fd[1]);
  s.fd[1] = -1;
  EXPECT_EQ(send_packet(s.fd[0], msg({"kill", "1", "9"}), nullptr, 0), -EPIPE);
  std::string packet;
  PacketFds fds;
  EXPECT_EQ(receive_packet(-1, &packet, &fds), -EBADF);
  EXPECT_EQ(send_packet(-1, msg({"kill", "1", "9"}), nullptr, 0), -EBADF);
  int fd = 0;
  EXPECT_EQ(send_packet(s.fd[0], "x", &fd, kMaxPacketFds + 1), -EINVAL);
}

// Fds that arrive with a packet the receiver has no use for (an exec that is
// gone, a kind that carries none) leave no descriptor open in this process.
TEST(PacketReceive, UnwantedFdsLeaveNothingOpen) {
  SocketPair s;
  const int before = open_fds();
  ASSERT_GT(before, 0);
  for (int round = 0; round < 20; ++round) {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    int sent[3] = {p[0], p[1], p[1]};
    ASSERT_EQ(send_packet(s.fd[0], msg({"exited", "99", "0"}), sent, 3), 0);
    ::close(p[0]);
    ::close(p[1]);
    std::string packet;
    PacketFds fds;
    ASSERT_EQ(receive_packet(s.fd[1], &packet, &fds), 12);
    EXPECT_EQ(open_fds(), before + 3) << "round " << round << ": the three did not arrive";
  }
  EXPECT_EQ(open_fds(), before);
}

// The exec handoff keeps the one connection and closes every other fd that
// came with it, also when it refuses the packet.
TEST(ExecHandoffReceive, ExtraAndUnexpectedFdsAreClosed) {
  SocketPair s;
  const int before = open_fds();
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  const std::string request = "GET /v1/sandboxes/x/exec HTTP/1.1\r\n\r\n";
  {
    // Two fds: refused, both closed.
    int sent[2] = {p[1], p[1]};
    ASSERT_EQ(send_packet(s.fd[0], protocol::encode_exec_handoff(request), sent, 2), 0);
    try {
      protocol::receive_exec_handoff(s.fd[1]);
      ADD_FAILURE() << "a handoff with two fds was taken";
    } catch (const protocol::ProtocolError& e) {
      EXPECT_STREQ(e.what(), "exec handoff: the packet must carry exactly one descriptor");
    }
  }
  {
    // The init's format, with an fd: refused, closed.
    ASSERT_EQ(send_packet(s.fd[0], msg({"handoff", request}), &p[1], 1), 0);
    try {
      protocol::receive_exec_handoff(s.fd[1]);
      ADD_FAILURE() << "a packet without the tag was taken";
    } catch (const protocol::ProtocolError& e) {
      EXPECT_STREQ(e.what(),
                   "exec handoff: the packet does not start with \"openshell exec-handoff 1\"");
    }
  }
  {
    // No fd at all.
    ASSERT_EQ(send_packet(s.fd[0], protocol::encode_exec_handoff(request), nullptr, 0), 0);
    EXPECT_THROW(protocol::receive_exec_handoff(s.fd[1]), protocol::ProtocolError);
  }
  {
    // Four fds: the fourth is over the packet's three, the rest refused.
    send_fds(s.fd[0], p[1], 4, protocol::encode_exec_handoff(request));
    EXPECT_THROW(protocol::receive_exec_handoff(s.fd[1]), protocol::ProtocolError);
  }
  ::close(p[1]);
  EXPECT_TRUE(write_end_closed(p[0])) << "an fd that came with a refused handoff is open";
  ::close(p[0]);
  EXPECT_EQ(open_fds(), before);
  {
    // One fd: taken, with the request byte for byte (not UTF-8 either).
    const std::string odd = request + std::string("\xff\x00\xfe", 3);
    int q[2];
    ASSERT_EQ(::pipe2(q, O_CLOEXEC), 0);
    ASSERT_EQ(protocol::send_exec_handoff(s.fd[0], odd, q[1]), 0);
    ::close(q[1]);
    protocol::ExecHandoff handoff = protocol::receive_exec_handoff(s.fd[1]);
    EXPECT_EQ(handoff.request, odd);
    ASSERT_TRUE(handoff.connection);
    EXPECT_FALSE(write_end_closed(q[0]));
    handoff.connection.reset();
    EXPECT_TRUE(write_end_closed(q[0]));
    ::close(q[0]);
  }
  EXPECT_EQ(open_fds(), before);
}

}  // namespace
}  // namespace openshell
