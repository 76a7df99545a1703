#include <arpa/inet.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "egress/identity.h"

namespace openshell::egress {
namespace {

using ::testing::HasSubstr;
using Kind = sock_diag::Reply::Kind;

TcpEnd end(const char* address, uint16_t port) {
  auto parsed = Address::parse(address);
  EXPECT_TRUE(parsed.has_value()) << address;
  return TcpEnd{parsed.value_or(Address{}), port};
}

struct Request {
  nlmsghdr header;
  inet_diag_req_v2 request;
};

Request decode_request(const std::string& bytes) {
  Request r{};
  EXPECT_EQ(bytes.size(), sizeof r);
  std::memcpy(&r, bytes.data(), std::min(bytes.size(), sizeof r));
  return r;
}

// What the kernel sends for a found socket: header, inet_diag_msg, and an
// attribute after it (real answers carry some).
std::string found_reply(uint32_t sequence, uint8_t family, const void* src, const void* dst,
                        uint16_t sport, uint16_t dport, uint32_t inode, uint32_t uid) {
  struct {
    nlmsghdr header;
    inet_diag_msg msg;
    char attribute[8];
  } m{};
  m.header.nlmsg_len = sizeof m;
  m.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  m.header.nlmsg_seq = sequence;
  m.msg.idiag_family = family;
  m.msg.idiag_state = 1;  // TCP_ESTABLISHED
  m.msg.id.idiag_sport = htons(sport);
  m.msg.id.idiag_dport = htons(dport);
  std::memcpy(m.msg.id.idiag_src, src, family == AF_INET ? 4 : 16);
  std::memcpy(m.msg.id.idiag_dst, dst, family == AF_INET ? 4 : 16);
  m.msg.idiag_inode = inode;
  m.msg.idiag_uid = uid;
  return std::string(reinterpret_cast<const char*>(&m), sizeof m);
}

std::string found_v4(uint32_t sequence, uint16_t sport, uint16_t dport, uint32_t inode) {
  const uint8_t loopback[4] = {127, 0, 0, 1};
  return found_reply(sequence, AF_INET, loopback, loopback, sport, dport, inode, 1000);
}

std::string error_reply(uint32_t sequence, int error) {
  struct {
    nlmsghdr header;
    nlmsgerr err;
  } m{};
  m.header.nlmsg_len = sizeof m;
  m.header.nlmsg_type = NLMSG_ERROR;
  m.header.nlmsg_seq = sequence;
  m.err.error = error;
  return std::string(reinterpret_cast<const char*>(&m), sizeof m);
}

TEST(SockDiagRequest, AsksForTheExactTcpSocketWithoutADump) {
  Request r =
      decode_request(sock_diag::exact_request(end("127.0.0.1", 41000), end("127.0.0.1", 3128), 7));
  EXPECT_EQ(r.header.nlmsg_len, sizeof r);
  EXPECT_EQ(r.header.nlmsg_type, SOCK_DIAG_BY_FAMILY);
  EXPECT_EQ(r.header.nlmsg_flags, NLM_F_REQUEST);  // NLM_F_DUMP would walk every socket
  EXPECT_EQ(r.header.nlmsg_seq, 7u);
  EXPECT_EQ(r.request.sdiag_family, AF_INET);
  EXPECT_EQ(r.request.sdiag_protocol, IPPROTO_TCP);
  EXPECT_EQ(r.request.idiag_ext, 0);
  EXPECT_EQ(r.request.idiag_states, ~0U);
  // The socket's own end is "src", in network byte order.
  EXPECT_EQ(r.request.id.idiag_sport, htons(41000));
  EXPECT_EQ(r.request.id.idiag_dport, htons(3128));
  EXPECT_EQ(r.request.id.idiag_src[0], htonl(INADDR_LOOPBACK));
  EXPECT_EQ(r.request.id.idiag_dst[0], htonl(INADDR_LOOPBACK));
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(r.request.id.idiag_src[i], 0u);
    EXPECT_EQ(r.request.id.idiag_dst[i], 0u);
  }
  EXPECT_EQ(r.request.id.idiag_if, 0u);
  EXPECT_EQ(r.request.id.idiag_cookie[0], INET_DIAG_NOCOOKIE);
  EXPECT_EQ(r.request.id.idiag_cookie[1], INET_DIAG_NOCOOKIE);
}

TEST(SockDiagRequest, CarriesIpv6Addresses) {
  Request r = decode_request(sock_diag::exact_request(end("2001:db8::1", 5), end("::1", 6), 1));
  EXPECT_EQ(r.request.sdiag_family, AF_INET6);
  in6_addr src, dst;
  ::inet_pton(AF_INET6, "2001:db8::1", &src);
  ::inet_pton(AF_INET6, "::1", &dst);
  EXPECT_EQ(std::memcmp(r.request.id.idiag_src, &src, 16), 0);
  EXPECT_EQ(std::memcmp(r.request.id.idiag_dst, &dst, 16), 0);
}

TEST(SockDiagReply, AFoundSocketGivesItsInodeAndUid) {
  auto client = end("127.0.0.1", 41000), proxy = end("127.0.0.1", 3128);
  auto reply = sock_diag::parse_reply(found_v4(9, 41000, 3128, 123456), 9, client, proxy);
  ASSERT_EQ(reply.kind, Kind::kFound) << reply.why;
  EXPECT_EQ(reply.inode, 123456u);
  EXPECT_EQ(reply.uid, 1000u);
}

TEST(SockDiagReply, ADualStackSocketMatchesItsIpv4Ends) {
  // An AF_INET6 client connected to ::ffff:127.0.0.1 answers for the IPv4 tuple.
  in6_addr mapped;
  ::inet_pton(AF_INET6, "::ffff:127.0.0.1", &mapped);
  auto bytes = found_reply(3, AF_INET6, &mapped, &mapped, 41000, 3128, 42, 0);
  auto reply = sock_diag::parse_reply(bytes, 3, end("127.0.0.1", 41000), end("127.0.0.1", 3128));
  ASSERT_EQ(reply.kind, Kind::kFound) << reply.why;
  EXPECT_EQ(reply.inode, 42u);
  // But not for another address.
  auto other = sock_diag::parse_reply(bytes, 3, end("127.0.0.2", 41000), end("127.0.0.1", 3128));
  EXPECT_EQ(other.kind, Kind::kOther);
}

TEST(SockDiagReply, AnAnswerForAnotherSocketIsNotThatSocket) {
  auto client = end("127.0.0.1", 41000), proxy = end("127.0.0.1", 3128);
  for (auto [sport, dport] :
       {std::pair<uint16_t, uint16_t>{41001, 3128}, {41000, 3129}, {3128, 41000}}) {
    auto reply = sock_diag::parse_reply(found_v4(1, sport, dport, 5), 1, client, proxy);
    EXPECT_EQ(reply.kind, Kind::kOther) << sport << " " << dport;
    EXPECT_EQ(reply.inode, 0u);
    EXPECT_THAT(reply.why, HasSubstr("other than the one asked for"));
  }
}

TEST(SockDiagReply, ErrorsCarryTheErrno) {
  auto client = end("127.0.0.1", 1), proxy = end("127.0.0.1", 2);
  auto gone = sock_diag::parse_reply(error_reply(4, -ENOENT), 4, client, proxy);
  EXPECT_EQ(gone.kind, Kind::kError);
  EXPECT_EQ(gone.error, ENOENT);
  auto invalid = sock_diag::parse_reply(error_reply(4, -EINVAL), 4, client, proxy);
  EXPECT_EQ(invalid.kind, Kind::kError);
  EXPECT_EQ(invalid.error, EINVAL);
  // An acknowledgement (error 0) is no answer.
  EXPECT_EQ(sock_diag::parse_reply(error_reply(4, 0), 4, client, proxy).kind, Kind::kMalformed);
}

TEST(SockDiagReply, AnotherRequestsAnswerIsStale) {
  auto client = end("127.0.0.1", 41000), proxy = end("127.0.0.1", 3128);
  EXPECT_EQ(sock_diag::parse_reply(found_v4(8, 41000, 3128, 5), 9, client, proxy).kind,
            Kind::kStale);
  EXPECT_EQ(sock_diag::parse_reply(error_reply(8, -ENOENT), 9, client, proxy).kind, Kind::kStale);
}

TEST(SockDiagReply, TruncatedOrForeignMessagesAreMalformed) {
  auto client = end("127.0.0.1", 41000), proxy = end("127.0.0.1", 3128);
  std::string whole = found_v4(1, 41000, 3128, 5);
  // Shorter than a header; a header claiming more than arrived; a message
  // too short for an inet_diag_msg.
  EXPECT_EQ(sock_diag::parse_reply(whole.substr(0, 10), 1, client, proxy).kind, Kind::kMalformed);
  EXPECT_EQ(sock_diag::parse_reply(whole.substr(0, whole.size() - 1), 1, client, proxy).kind,
            Kind::kMalformed);
  std::string short_msg = whole.substr(0, NLMSG_HDRLEN + 8);
  nlmsghdr h;
  std::memcpy(&h, short_msg.data(), sizeof h);
  h.nlmsg_len = static_cast<uint32_t>(short_msg.size());
  std::memcpy(short_msg.data(), &h, sizeof h);
  auto reply = sock_diag::parse_reply(short_msg, 1, client, proxy);
  EXPECT_EQ(reply.kind, Kind::kMalformed);
  EXPECT_THAT(reply.why, HasSubstr("inet_diag_msg"));
  // NLMSG_DONE (the end of a dump) is not an answer to an exact request.
  std::string done = whole;
  std::memcpy(&h, done.data(), sizeof h);
  h.nlmsg_type = NLMSG_DONE;
  std::memcpy(done.data(), &h, sizeof h);
  EXPECT_EQ(sock_diag::parse_reply(done, 1, client, proxy).kind, Kind::kMalformed);
}

// The kernel's side, on loopback in this process's own network namespace.

UniqueFd diag_socket() {
  return UniqueFd(::socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_SOCK_DIAG));
}

struct Loopback {
  UniqueFd listener, client, accepted;
  TcpEnd client_end, server_end;
};

Loopback connect_on_loopback() {
  Loopback l;
  l.listener.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT_EQ(::bind(l.listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::listen(l.listener.get(), 4), 0);
  EXPECT_EQ(::getsockname(l.listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  l.server_end = end("127.0.0.1", ntohs(addr.sin_port));
  l.client.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_EQ(::connect(l.client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  l.accepted.reset(::accept4(l.listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(l.accepted.valid());
  len = sizeof addr;
  EXPECT_EQ(::getsockname(l.client.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  l.client_end = end("127.0.0.1", ntohs(addr.sin_port));
  return l;
}

sock_diag::Reply ask(int fd, const TcpEnd& local, const TcpEnd& remote, uint32_t sequence) {
  std::string request = sock_diag::exact_request(local, remote, sequence);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  EXPECT_EQ(::sendto(fd, request.data(), request.size(), 0, reinterpret_cast<sockaddr*>(&kernel),
                     sizeof kernel),
            static_cast<ssize_t>(request.size()));
  alignas(nlmsghdr) char buffer[8192];
  ssize_t n = ::recv(fd, buffer, sizeof buffer, MSG_DONTWAIT);  // answered within sendto()
  EXPECT_GT(n, 0) << std::strerror(errno);
  return sock_diag::parse_reply(std::string_view(buffer, n > 0 ? static_cast<size_t>(n) : 0),
                                sequence, local, remote);
}

// A sock_diag socket that answers for TCP sockets, or none (the tests that
// need one skip).
UniqueFd working_diag_socket(std::string* why) {
  UniqueFd diag = diag_socket();
  if (!diag) {
    *why = std::string("no NETLINK_SOCK_DIAG socket: ") + std::strerror(errno);
    return diag;
  }
  Loopback l = connect_on_loopback();
  auto reply = ask(diag.get(), l.client_end, l.server_end, 1000);
  if (reply.kind != Kind::kFound) {
    *why = "the kernel does not answer inet_diag requests for TCP (" + reply.why +
           std::strerror(reply.error) + ")";
    diag.reset();
  }
  return diag;
}

uint64_t inode_of(int fd) {
  struct stat st {};
  EXPECT_EQ(::fstat(fd, &st), 0);
  return st.st_ino;
}

TEST(SockDiagKernel, FindsTheSocketOfAnExactTuple) {
  UniqueFd diag = diag_socket();
  if (!diag) GTEST_SKIP() << "no NETLINK_SOCK_DIAG socket: " << std::strerror(errno);
  Loopback l = connect_on_loopback();
  auto client = ask(diag.get(), l.client_end, l.server_end, 1);
  if (client.kind == Kind::kError && client.error == ENOENT)
    GTEST_SKIP() << "the kernel has no inet_diag for TCP";
  ASSERT_EQ(client.kind, Kind::kFound) << client.why << client.error;
  EXPECT_EQ(client.inode, inode_of(l.client.get()));
  EXPECT_EQ(client.uid, ::getuid());
  // The other end of the same connection is another socket.
  auto accepted = ask(diag.get(), l.server_end, l.client_end, 2);
  ASSERT_EQ(accepted.kind, Kind::kFound) << accepted.why;
  EXPECT_EQ(accepted.inode, inode_of(l.accepted.get()));
  // A tuple of no socket.
  TcpEnd nobody = l.client_end;
  nobody.port = static_cast<uint16_t>(nobody.port == 1 ? 2 : 1);
  auto none = ask(diag.get(), nobody, l.server_end, 3);
  EXPECT_EQ(none.kind, Kind::kError);
  EXPECT_EQ(none.error, ENOENT);
  // A listener answers for its port when no connection has the tuple.
  TcpEnd anyone = end("0.0.0.0", 0);
  auto listener = ask(diag.get(), l.server_end, anyone, 4);
  ASSERT_EQ(listener.kind, Kind::kFound) << listener.why;
  EXPECT_EQ(listener.inode, inode_of(l.listener.get()));
  auto for_a_stranger = ask(diag.get(), l.server_end, nobody, 5);
  EXPECT_EQ(for_a_stranger.kind, Kind::kOther);
}

TEST(CallerFinder, FindsTheProcessHoldingTheClientSocket) {
  std::string why;
  UniqueFd diag = working_diag_socket(&why);
  if (!diag) GTEST_SKIP() << why;
  Loopback l = connect_on_loopback();
  // This process is the "sandbox": its init and the holder of the client.
  CallerFinder finder(::getpid(), std::move(diag));
  ::testing::internal::CaptureStderr();
  Caller caller = finder.find(l.client_end, l.server_end);
  std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(finder.uses_sock_diag());
  EXPECT_EQ(warnings, "");
  EXPECT_EQ(caller.pid, ::getpid());
  char self[4096] = {};
  ASSERT_GT(::readlink("/proc/self/exe", self, sizeof self - 1), 0);
  EXPECT_EQ(caller.exe, self);
}

TEST(CallerFinder, AClientThatHasGoneIsUnknownAndSockDiagStays) {
  std::string why;
  UniqueFd diag = working_diag_socket(&why);
  if (!diag) GTEST_SKIP() << why;
  Loopback l = connect_on_loopback();
  CallerFinder finder(::getpid(), std::move(diag));
  // Reset by the client (SO_LINGER 0): its socket is gone from the table,
  // and so is the accepted one (the lookup of that falls back to the
  // listener).
  linger off{1, 0};
  ASSERT_EQ(::setsockopt(l.client.get(), SOL_SOCKET, SO_LINGER, &off, sizeof off), 0);
  l.client.reset();
  ::testing::internal::CaptureStderr();
  Caller caller = finder.find(l.client_end, l.server_end);
  std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(caller.pid, 0);
  EXPECT_EQ(caller.exe, "");
  EXPECT_TRUE(finder.uses_sock_diag()) << "a client gone is no reason to give sock_diag up";
  EXPECT_EQ(warnings, "");
}

TEST(CallerFinder, WithoutSockDiagFallsBackToProcWithOneWarning) {
  Loopback l = connect_on_loopback();
  CallerFinder finder(::getpid(), UniqueFd());
  ::testing::internal::CaptureStderr();
  Caller first = finder.find(l.client_end, l.server_end);
  Caller second = finder.find(l.client_end, l.server_end);
  std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(first.pid, ::getpid());
  EXPECT_EQ(second.pid, ::getpid());
  EXPECT_THAT(warnings, HasSubstr("/net/tcp instead"));
  EXPECT_EQ(warnings.find("warning"), warnings.rfind("warning")) << "warned more than once:\n"
                                                                 << warnings;
  EXPECT_FALSE(finder.uses_sock_diag());
}

TEST(CallerFinder, ASocketThatCannotAskFallsBackToProc) {
  // Sending to the kernel's netlink address fails on a UDP socket: the
  // caller must still be found, through /proc.
  UniqueFd udp(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  ASSERT_TRUE(udp.valid());
  Loopback l = connect_on_loopback();
  CallerFinder finder(::getpid(), std::move(udp));
  ::testing::internal::CaptureStderr();
  Caller caller = finder.find(l.client_end, l.server_end);
  std::string warnings = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(caller.pid, ::getpid());
  EXPECT_FALSE(finder.uses_sock_diag());
  EXPECT_THAT(warnings, HasSubstr("send a sock_diag request"));
  EXPECT_THAT(warnings, HasSubstr("/net/tcp instead"));
}

TEST(CallerFinder, EveryHolderOfTheSocketIsFoundWithinTheBudget) {
  std::string why;
  UniqueFd diag = working_diag_socket(&why);
  if (!diag) GTEST_SKIP() << why;
  Loopback l = connect_on_loopback();
  // A child holds the client socket too (inherited), as a program started
  // by the one that connected would.
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(ready[0]);
    (void)!::write(ready[1], "x", 1);
    ::pause();
    ::_exit(0);
  }
  ::close(ready[1]);
  char c;
  ASSERT_EQ(::read(ready[0], &c, 1), 1);
  ::close(ready[0]);
  CallerFinder finder(::getpid(), std::move(diag));
  Holders all = finder.holders(l.client_end, l.server_end);
  Holders cut = finder.holders(l.client_end, l.server_end, 3);
  // A later search from that one: a process started since (which inherits
  // the socket) is found, the holders are found again.
  pid_t later = ::fork();
  if (later == 0) {
    ::pause();
    ::_exit(0);
  }
  for (int i = 0; i < 3000 && finder.holders(l.client_end, l.server_end).processes.size() < 3; ++i)
    ::usleep(10000);
  Holders again = finder.holders(l.client_end, l.server_end, kIdentityBudget, &all);
  ::kill(later, SIGKILL);
  ::waitpid(later, nullptr, 0);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  ASSERT_EQ(again.processes.size(), 3u);
  EXPECT_EQ(again.processes[2].pid, later);
  EXPECT_EQ(all.seen.size(), 2u);
  ASSERT_EQ(all.processes.size(), 2u);
  EXPECT_EQ(all.processes[0].pid, ::getpid());
  EXPECT_EQ(all.processes[1].pid, child);
  EXPECT_FALSE(all.budget_exceeded);
  EXPECT_GT(all.entries, 2u);
  // The newest holder is what find() names.
  EXPECT_EQ(finder.find(l.client_end, l.server_end).pid, ::getpid());  // the child is gone now
  EXPECT_TRUE(cut.budget_exceeded);
  EXPECT_EQ(cut.entries, 3u);
}

TEST(Credit, PreloadingEnvironmentsAreNamed) {
  using namespace std::string_literals;
  EXPECT_EQ(credit::environment_problem("PATH=/bin\0LD_PRELOAD=/tmp/x.so\0"s),
            "LD_PRELOAD in its environment");
  EXPECT_EQ(credit::environment_problem("LD_AUDIT=/tmp/a.so"s), "LD_AUDIT in its environment");
  EXPECT_EQ(credit::environment_problem("LD_PRELOAD=\0HOME=/x\0"s), "");
  EXPECT_EQ(credit::environment_problem("XLD_PRELOAD=/x\0MY_LD_AUDIT=1\0"s), "");
  EXPECT_EQ(credit::environment_problem(""), "");
}

TEST(Credit, ExecutableFileMappingsAreListed) {
  const char* maps =
      "00400000-00401000 r--p 00000000 08:01 123 /usr/bin/curl\n"
      "00401000-00480000 r-xp 00001000 08:01 123 /usr/bin/curl\n"
      "7f0000000000-7f0000010000 r-xp 00000000 08:01 456 /usr/lib/x86_64-linux-gnu/libc.so.6\n"
      "7f0000020000-7f0000030000 rw-p 00000000 08:01 789 /tmp/data\n"
      "7f0000040000-7f0000050000 r-xp 00000000 00:01 99 /memfd:x (deleted)\n"
      "7f0000060000-7f0000070000 rwxp 00000000 00:00 0 \n"
      "7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0                          [vdso]\n"
      "7f0000080000-7f0000090000 r-xp 00000000 08:01 321 /tmp/my lib.so\n";
  EXPECT_THAT(credit::executable_files(maps),
              ::testing::ElementsAre("/usr/bin/curl", "/usr/lib/x86_64-linux-gnu/libc.so.6",
                                     "/memfd:x (deleted)", "/tmp/my lib.so"));
}

TEST(Credit, LibrariesComeFromLibraryDirectoriesOnly) {
  for (const char* path : {"/lib/x86_64-linux-gnu/libc.so.6", "/lib64/ld-linux-x86-64.so.2",
                           "/usr/lib/python3.11/lib-dynload/_ssl.so", "/usr/local/lib/libfoo.so",
                           "/usr/lib64/libz.so.1"})
    EXPECT_TRUE(credit::library_path_allowed(path, "/usr/bin/curl")) << path;
  for (const char* path : {"/tmp/evil.so", "/sandbox/lib/x.so", "/usr/lib", "/usr/libexec/x.so",
                           "/usr/lib/../../tmp/x.so", "/usr/lib/x.so (deleted)",
                           "/memfd:x (deleted)", "", "lib/x.so", "/opt/app/lib/libapp.so"})
    EXPECT_FALSE(credit::library_path_allowed(path, "/usr/bin/curl")) << path;
  // An executable's own prefix: /opt/app/bin/app has /opt/app/lib.
  EXPECT_TRUE(credit::library_path_allowed("/opt/app/lib/libapp.so", "/opt/app/bin/app"));
  EXPECT_TRUE(credit::library_path_allowed("/opt/app/lib64/libapp.so", "/opt/app/bin/app"));
  EXPECT_FALSE(credit::library_path_allowed("/opt/app/share/x.so", "/opt/app/bin/app"));
  EXPECT_FALSE(credit::library_path_allowed("/opt/lib/x.so", "/opt/app/app"));
}

}  // namespace
}  // namespace openshell::egress
