// The init's control channel: what arrives from inside the sandbox is parsed
// strictly (a malformed exec request is refused, never half-read), fds beyond
// the three a packet may carry are closed, and send and receive report errors
// with the same sign.
#include "runtime/init_protocol.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../fuzz/init_protocol_check.h"

namespace openshell::runtime {
namespace {

using Kind = InitMessage::Kind;

std::string msg(std::vector<std::string> parts) { return make_message(parts); }

TEST(InitProtocolParse, EachKindAndItsFields) {
  struct Case {
    std::string packet;
    Kind kind;
    std::vector<std::string> fields;
  };
  const std::vector<Case> cases = {
      {msg({"started", "3", "42"}), Kind::kStarted, {"3", "42"}},
      {msg({"failed", "3", "127", "2", "exec"}), Kind::kFailed, {"3", "127", "2", "exec"}},
      {msg({"exited", "3", "0"}), Kind::kExited, {"3", "0"}},
      {msg({"exec", "1"}), Kind::kExec, {"1"}},
      {msg({"kill", "3", "15"}), Kind::kKill, {"3", "15"}},
      {msg({"kill"}), Kind::kKill, {}},
      {msg({"kill", "", ""}), Kind::kKill, {"", ""}},
      {msg({"bogus", "1"}), Kind::kUnknown, {"1"}},
      {msg({""}), Kind::kUnknown, {}},
      {msg({"Exec", "1"}), Kind::kUnknown, {"1"}},
  };
  for (const auto& c : cases) {
    InitMessage m = parse_message(c.packet);
    EXPECT_EQ(m.kind, c.kind) << c.packet;
    EXPECT_EQ(m.fields, c.fields) << c.packet;
  }
}

TEST(InitProtocolParse, ShortOrUnterminatedPacketsAreUnknownAndEmpty) {
  for (std::string packet : {std::string(), std::string("exec"), std::string("kill\0003\00015", 9),
                             std::string("started\0", 8) + "3"}) {
    InitMessage m = parse_message(packet);
    EXPECT_EQ(m.kind, Kind::kUnknown) << packet.size();
    EXPECT_TRUE(m.fields.empty()) << packet.size();
  }
}

ExecRequest sample() {
  ExecRequest r;
  r.id = 18446744073709551615ull;
  r.tty = true;
  r.rows = 65535;
  r.cols = 1;
  r.workdir = "/work dir";
  r.argv = {"sh", "-c", "echo 'a b'", ""};
  r.env = {"PATH=/bin", "EMPTY="};
  return r;
}

TEST(InitProtocolExec, RoundTripKeepsEveryField) {
  auto r = decode_exec(parse_message(encode_exec(sample())));
  ASSERT_TRUE(r);
  EXPECT_EQ(r->id, sample().id);
  EXPECT_TRUE(r->tty);
  EXPECT_EQ(r->rows, 65535);
  EXPECT_EQ(r->cols, 1);
  EXPECT_EQ(r->workdir, "/work dir");
  EXPECT_EQ(r->argv, sample().argv);
  EXPECT_EQ(r->env, sample().env);
}

// exec ID TTY ROWS COLS WORKDIR ARGC ARG... ENVC ENV...
TEST(InitProtocolExec, MalformedRequestsAreRefused) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"wrong kind", {"kill", "1", "0", "24", "80", "/", "1", "sh", "0"}},
      {"no fields", {"exec"}},
      {"no argc", {"exec", "1", "0", "24", "80", "/"}},
      {"no envc", {"exec", "1", "0", "24", "80", "/", "1", "sh"}},
      {"id not a number", {"exec", "x", "0", "24", "80", "/", "1", "sh", "0"}},
      {"negative id", {"exec", "-1", "0", "24", "80", "/", "1", "sh", "0"}},
      {"id past 64 bits", {"exec", "18446744073709551616", "0", "24", "80", "/", "1", "sh", "0"}},
      {"empty id", {"exec", "", "0", "24", "80", "/", "1", "sh", "0"}},
      {"tty 2", {"exec", "1", "2", "24", "80", "/", "1", "sh", "0"}},
      {"tty empty", {"exec", "1", "", "24", "80", "/", "1", "sh", "0"}},
      {"rows past 16 bits", {"exec", "1", "0", "65536", "80", "/", "1", "sh", "0"}},
      {"cols with a sign", {"exec", "1", "0", "24", "+80", "/", "1", "sh", "0"}},
      {"cols with a space", {"exec", "1", "0", "24", "80 ", "/", "1", "sh", "0"}},
      {"argc zero", {"exec", "1", "0", "24", "80", "/", "0", "0"}},
      {"argc past the packet", {"exec", "1", "0", "24", "80", "/", "3", "sh", "0"}},
      {"argc past the limit", {"exec", "1", "0", "24", "80", "/", "65537", "sh", "0"}},
      {"argc negative", {"exec", "1", "0", "24", "80", "/", "-1", "sh", "0"}},
      {"envc short", {"exec", "1", "0", "24", "80", "/", "1", "sh", "2", "A=1"}},
      {"envc long", {"exec", "1", "0", "24", "80", "/", "1", "sh", "0", "A=1"}},
      {"envc not a number", {"exec", "1", "0", "24", "80", "/", "1", "sh", "one", "A=1"}},
      {"envc huge", {"exec", "1", "0", "24", "80", "/", "1", "sh", "18446744073709551615"}},
  };
  for (const auto& [what, parts] : cases)
    EXPECT_FALSE(decode_exec(parse_message(make_message(parts)))) << what;
  // The same shape with good values decodes, so each refusal above is the
  // field it names.
  EXPECT_TRUE(decode_exec(parse_message(msg({"exec", "1", "0", "24", "80", "/", "1", "sh", "0"}))));
  EXPECT_TRUE(
      decode_exec(parse_message(msg({"exec", "1", "1", "0", "0", "", "1", "sh", "1", "A=1"}))));
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
void send_fds(int socket_fd, int fd, int count) {
  std::vector<int> fds(count, fd);
  char byte = 'x';
  iovec iov{&byte, 1};
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
  ASSERT_EQ(::sendmsg(socket_fd, &m, 0), 1);
}

// True when no copy of a pipe's write end is left open anywhere.
bool write_end_closed(int read_fd) {
  ::fcntl(read_fd, F_SETFL, O_NONBLOCK);
  char byte;
  return ::read(read_fd, &byte, 1) == 0;
}

TEST(InitProtocolReceive, FdsAndPacketArriveCloseOnExec) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  int sent[2] = {p[1], p[1]};
  ASSERT_EQ(send_packet(s.fd[0], msg({"started", "1", "2"}), sent, 2), 0);
  ::close(p[1]);
  std::string packet;
  int fds[3];
  ASSERT_EQ(receive_packet(s.fd[1], &packet, fds), 12);
  EXPECT_EQ(packet, msg({"started", "1", "2"}));
  ASSERT_GE(fds[0], 0);
  ASSERT_GE(fds[1], 0);
  EXPECT_EQ(fds[2], -1);
  EXPECT_EQ(::fcntl(fds[0], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  EXPECT_FALSE(write_end_closed(p[0]));
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_TRUE(write_end_closed(p[0]));
  ::close(p[0]);
}

TEST(InitProtocolReceive, AFourthFdIsClosed) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  send_fds(s.fd[0], p[1], 4);
  ::close(p[1]);
  std::string packet;
  int fds[3];
  ASSERT_EQ(receive_packet(s.fd[1], &packet, fds), 1);
  for (int fd : fds) {
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  EXPECT_TRUE(write_end_closed(p[0])) << "the fourth fd is still open";
  ::close(p[0]);
}

TEST(InitProtocolReceive, TooManyFdsRefuseThePacketAndCloseAll) {
  SocketPair s;
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  send_fds(s.fd[0], p[1], 8);
  ::close(p[1]);
  std::string packet;
  int fds[3];
  EXPECT_EQ(receive_packet(s.fd[1], &packet, fds), -EMSGSIZE);
  EXPECT_EQ(fds[0], -1);
  EXPECT_EQ(fds[1], -1);
  EXPECT_EQ(fds[2], -1);
  EXPECT_TRUE(write_end_closed(p[0])) << "an fd of a refused packet is still open";
  ::close(p[0]);
}

TEST(InitProtocolReceive, AnOversizedPacketIsRefusedAndItsFdsClosed) {
  SocketPair s;
  int size = 1 << 20;
  ::setsockopt(s.fd[0], SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
  ::setsockopt(s.fd[1], SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
  int p[2];
  ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
  std::string big(kMaxControlMessage + 1, 'a');
  int sent = send_packet(s.fd[0], big, &p[1], 1);
  ::close(p[1]);
  if (sent == -EMSGSIZE) GTEST_SKIP() << "the socket buffer cannot hold a packet over 256 KiB here";
  ASSERT_EQ(sent, 0);
  std::string packet;
  int fds[3];
  EXPECT_EQ(receive_packet(s.fd[1], &packet, fds), -EMSGSIZE);
  EXPECT_EQ(fds[0], -1);
  EXPECT_TRUE(write_end_closed(p[0]));
  ::close(p[0]);
}

TEST(InitProtocolReceive, EndOfStreamIsZero) {
  SocketPair s;
  ::close(s.fd[0]);
  s.fd[0] = -1;
  std::string packet = "stale";
  int fds[3];
  EXPECT_EQ(receive_packet(s.fd[1], &packet, fds), 0);
  EXPECT_EQ(packet, "");
}

TEST(InitProtocolErrors, SendAndReceiveBothReturnMinusErrno) {
  SocketPair s;
  ::close(s.fd[1]);
  s.fd[1] = -1;
  EXPECT_EQ(send_packet(s.fd[0], msg({"kill", "1", "9"}), nullptr, 0), -EPIPE);
  std::string packet;
  int fds[3];
  EXPECT_EQ(receive_packet(-1, &packet, fds), -EBADF);
  EXPECT_EQ(send_packet(-1, msg({"kill", "1", "9"}), nullptr, 0), -EBADF);
}

// The fuzz target's properties, over its committed corpus, on every build.
TEST(InitProtocolCorpus, EveryInputKeepsTheProtocolsProperties) {
  namespace fs = std::filesystem;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(OSH_INIT_PROTOCOL_CORPUS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(fuzz::init_protocol_violation(data), "") << entry.path();
    ++count;
  }
  EXPECT_GE(count, 10) << "the corpus at " OSH_INIT_PROTOCOL_CORPUS " is missing";
}

}  // namespace
}  // namespace openshell::runtime
