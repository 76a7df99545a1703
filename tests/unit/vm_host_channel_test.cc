// The VMM's channel to its supervisor (vm/host_channel.h): every message
// encoded and decoded back, hostile text refused with a reason, and
// datagrams over a real SOCK_SEQPACKET pair with and without an fd; a
// datagram with the wrong count of fds is dropped with its fds closed.
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "vm/host_channel.h"

namespace openshell::vm::host_channel {
namespace {

struct Pair {
  UniqueFd vmm;
  UniqueFd supervisor;
};

Pair seqpacket_pair() {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, fds) != 0) return {};
  return {UniqueFd(fds[0]), UniqueFd(fds[1])};
}

// Sends `text` with every fd of `fds` in one SCM_RIGHTS message.
void send_raw(int channel, const std::string& text, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(text.data()), text.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(fds.size() * sizeof(int)));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), fds.data(), fds.size() * sizeof(int));
  }
  ASSERT_EQ(::sendmsg(channel, &msg, 0), static_cast<ssize_t>(text.size()));
}

// How many fds this process has open: what a dropped datagram must not grow.
size_t open_fds() {
  size_t count = 0;
  for (int fd = 0; fd < 1024; ++fd)
    if (::fcntl(fd, F_GETFD) >= 0) ++count;
  return count;
}

std::string why_not(const std::string& text) {
  std::string why;
  EXPECT_FALSE(decode(text, &why).has_value()) << text;
  return why;
}

TEST(VmHostChannel, EveryMessageEncodesAndDecodesBack) {
  EXPECT_EQ(encode(Accepted{1025, 49153}), "accepted 1025 49153");
  EXPECT_EQ(encode(Connect{18446744073709551615ull, 1024}), "connect 18446744073709551615 1024");
  EXPECT_EQ(encode(Connected{7}), "connected 7");
  EXPECT_EQ(encode(Refused{7, "the guest's driver is not running"}),
            "refused 7 the guest's driver is not running");

  std::string why;
  auto accepted = decode("accepted 4294967295 5000", &why);
  ASSERT_TRUE(accepted) << why;
  EXPECT_EQ(std::get<Accepted>(*accepted).host_port, 4294967295u);
  EXPECT_EQ(std::get<Accepted>(*accepted).guest_port, 5000u);
  auto connect = decode("connect 42 1024", &why);
  ASSERT_TRUE(connect) << why;
  EXPECT_EQ(std::get<Connect>(*connect).id, 42u);
  EXPECT_EQ(std::get<Connect>(*connect).guest_port, 1024u);
  auto refused = decode("refused 3 no  such port", &why);
  ASSERT_TRUE(refused) << why;
  EXPECT_EQ(std::get<Refused>(*refused).id, 3u);
  EXPECT_EQ(std::get<Refused>(*refused).reason, "no  such port");
  EXPECT_TRUE(carries_fd(*accepted));
  EXPECT_FALSE(carries_fd(*connect));
  EXPECT_TRUE(carries_fd(Connected{1}));
  EXPECT_FALSE(carries_fd(*refused));
}

TEST(VmHostChannel, ARefusalsReasonIsMadePrintableAndCutToFit) {
  const std::string text = encode(Refused{1, "a\nb\x01" + std::string(1000, 'x')});
  EXPECT_EQ(text.size(), kMaxMessage);
  EXPECT_EQ(text.substr(0, 14), "refused 1 a?b?");
  std::string why;
  EXPECT_TRUE(decode(text, &why)) << why;
  EXPECT_EQ(encode(Refused{1, ""}), "refused 1 no reason given");
}

TEST(VmHostChannel, HostileTextIsRefusedWithAReason) {
  EXPECT_EQ(why_not(""), "an empty message");
  EXPECT_EQ(why_not("connect 1 " + std::string(300, '1')), "a message of 310 bytes (at most 256)");
  EXPECT_EQ(why_not("hello 1 2"), "unknown verb \"hello\"");
  EXPECT_EQ(why_not("CONNECT 1 2"), "unknown verb \"CONNECT\"");
  EXPECT_EQ(why_not("connect 1 2\n"), "a message with bytes that are not printable ASCII");
  EXPECT_EQ(why_not(std::string("connect 1\0 2", 11)),
            "a message with bytes that are not printable ASCII");
  EXPECT_EQ(why_not("connect 1"), "connect: 1 fields (2 wanted)");
  EXPECT_EQ(why_not("connect 1 2 3"), "connect: 3 fields (2 wanted)");
  EXPECT_EQ(why_not("connect 1 2 "), "connect: 3 fields (2 wanted)");
  EXPECT_EQ(why_not("connect  1 2"), "connect: 3 fields (2 wanted)");
  EXPECT_EQ(why_not("connect  1"), "connect: bad id \"\"");
  EXPECT_EQ(why_not("connect -1 2"), "connect: bad id \"-1\"");
  EXPECT_EQ(why_not("connect +1 2"), "connect: bad id \"+1\"");
  EXPECT_EQ(why_not("connect 18446744073709551616 2"), "connect: bad id \"18446744073709551616\"");
  EXPECT_EQ(why_not("connect 1 4294967296"), "connect: bad guest port \"4294967296\"");
  EXPECT_EQ(why_not("connect 1 0x10"), "connect: bad guest port \"0x10\"");
  EXPECT_EQ(why_not("connect 01 2"), "connect: bad id \"01\"");
  EXPECT_EQ(why_not("accepted 4294967296 1"), "accepted: bad host port \"4294967296\"");
  EXPECT_EQ(why_not("connected"), "connected: 0 fields (1 wanted)");
  EXPECT_EQ(why_not("connected 1 2"), "connected: 2 fields (1 wanted)");
  EXPECT_EQ(why_not("refused 1"), "refused: no reason");
  EXPECT_EQ(why_not("refused 1 "), "refused: no reason");
  EXPECT_EQ(why_not("refused x why"), "refused: bad id \"x\"");
}

// Text made of the protocol's own pieces, at random: whatever decodes is
// what encode() writes for it, and nothing else crashes or is taken.
TEST(VmHostChannel, RandomTextDecodesOnlyToWhatEncodesBackTheSame) {
  const char* verbs[] = {"accepted", "connect", "connected", "refused", "Connect", "", "x"};
  const char* fields[] = {"0",  "1", "42", "4294967295", "4294967296", "18446744073709551615",
                          "-1", "x", "\n", "",           "07",         "why not"};
  const char* gaps[] = {" ", " ", " ", "  ", "", "\t"};
  std::mt19937 random(20261201);
  size_t decoded = 0;
  for (int round = 0; round < 20000; ++round) {
    std::string text = verbs[random() % std::size(verbs)];
    const int count = static_cast<int>(random() % 4);
    for (int i = 0; i < count; ++i) {
      text += gaps[random() % std::size(gaps)];
      text += fields[random() % std::size(fields)];
    }
    std::string why;
    const auto message = decode(text, &why);
    if (!message) {
      EXPECT_FALSE(why.empty()) << text;
      continue;
    }
    ++decoded;
    EXPECT_EQ(encode(*message), text);
  }
  EXPECT_GT(decoded, 100u);  // the test reached past the refusals
}

TEST(VmHostChannel, AMessageAndItsFdCrossTheChannel) {
  Pair pair = seqpacket_pair();
  ASSERT_TRUE(pair.vmm && pair.supervisor);
  int carried[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, carried), 0);
  UniqueFd ours(carried[0]);
  EXPECT_EQ(send(pair.vmm.get(), encode(Accepted{1025, 5000}), carried[1]), "");
  ::close(carried[1]);  // the copy sent is the other end's now

  Datagram got = receive(pair.supervisor.get());
  EXPECT_FALSE(got.closed);
  EXPECT_EQ(got.problem, "");
  EXPECT_EQ(got.text, "accepted 1025 5000");
  ASSERT_TRUE(got.fd);
  EXPECT_EQ(::fcntl(got.fd.get(), F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
  std::string why;
  auto message = parse(got, &why);
  ASSERT_TRUE(message) << why;
  ASSERT_TRUE(got.fd);  // parse leaves the fd with the datagram
  // The fd is the other end of our pair: bytes cross it both ways.
  ASSERT_EQ(::write(got.fd.get(), "ping", 4), 4);
  char buffer[4];
  ASSERT_EQ(::read(ours.get(), buffer, 4), 4);
  EXPECT_EQ(std::string(buffer, 4), "ping");

  EXPECT_EQ(send(pair.supervisor.get(), encode(Connect{9, 1024})), "");
  got = receive(pair.vmm.get());
  EXPECT_EQ(got.text, "connect 9 1024");
  EXPECT_FALSE(got.fd);
  message = parse(got, &why);
  ASSERT_TRUE(message) << why;
  EXPECT_EQ(std::get<Connect>(*message).id, 9u);
}

TEST(VmHostChannel, AnFdTheVerbDoesNotTakeOrLacksIsRefused) {
  Pair pair = seqpacket_pair();
  ASSERT_TRUE(pair.vmm && pair.supervisor);
  const size_t before = open_fds();
  {
    UniqueFd spare(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    send_raw(pair.supervisor.get(), "connect 1 1024", {spare.get()});
  }
  Datagram got = receive(pair.vmm.get());
  std::string why;
  EXPECT_FALSE(parse(got, &why));
  EXPECT_EQ(why, "\"connect 1 1024\" with an fd it does not take");
  EXPECT_FALSE(got.fd);
  EXPECT_EQ(open_fds(), before);

  send_raw(pair.supervisor.get(), "connected 1", {});
  got = receive(pair.vmm.get());
  EXPECT_FALSE(parse(got, &why));
  EXPECT_EQ(why, "\"connected 1\" without its fd");
}

TEST(VmHostChannel, ADatagramWithTooManyFdsOrTooLongIsDroppedWithItsFds) {
  Pair pair = seqpacket_pair();
  ASSERT_TRUE(pair.vmm && pair.supervisor);
  const size_t before = open_fds();
  {
    UniqueFd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    UniqueFd b(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    send_raw(pair.supervisor.get(), "accepted 1 2", {a.get(), b.get()});
    std::vector<int> many(20, a.get());
    send_raw(pair.supervisor.get(), "accepted 1 2", many);
    send_raw(pair.supervisor.get(), std::string(1000, 'x'), {a.get()});
  }
  Datagram got = receive(pair.vmm.get());
  EXPECT_EQ(got.problem, "a datagram with 2 fds (at most 1)");
  EXPECT_FALSE(got.fd);
  EXPECT_FALSE(got.closed);
  got = receive(pair.vmm.get());
  EXPECT_EQ(got.problem, "a datagram with more than 8 fds");
  got = receive(pair.vmm.get());
  EXPECT_EQ(got.problem, "a datagram longer than 256 bytes");
  EXPECT_FALSE(got.fd);
  EXPECT_EQ(open_fds(), before);

  // The channel goes on after what it dropped.
  EXPECT_EQ(send(pair.supervisor.get(), "connect 2 1024"), "");
  got = receive(pair.vmm.get());
  EXPECT_EQ(got.problem, "");
  EXPECT_EQ(got.text, "connect 2 1024");
}

TEST(VmHostChannel, ThePeersCloseIsSeenAndSendingThenFails) {
  Pair pair = seqpacket_pair();
  ASSERT_TRUE(pair.vmm && pair.supervisor);
  pair.supervisor.reset();
  Datagram got = receive(pair.vmm.get());
  EXPECT_TRUE(got.closed);
  EXPECT_EQ(got.problem, "");
  EXPECT_EQ(send(pair.vmm.get(), "connected 1"), "sendmsg: Broken pipe");
  EXPECT_EQ(send(pair.vmm.get(), std::string(300, 'x')), "a message of 300 bytes");
}

TEST(VmHostChannel, ASendThatMustNotWaitSaysTheChannelIsFull) {
  Pair pair = seqpacket_pair();
  ASSERT_TRUE(pair.vmm && pair.supervisor);
  bool full = false;
  int sent = 0;
  while (sent < 100000) {
    ASSERT_EQ(send(pair.vmm.get(), "connected 1", -1, &full), "");
    if (full) break;
    ++sent;
  }
  EXPECT_TRUE(full);
  EXPECT_GT(sent, 0);
  // What was sent is all there, whole datagrams.
  Datagram got = receive(pair.supervisor.get());
  EXPECT_EQ(got.text, "connected 1");
}

}  // namespace
}  // namespace openshell::vm::host_channel
