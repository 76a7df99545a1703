#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "egress/connect_watch.h"
#include "runtime/seccomp.h"

namespace openshell::egress {
namespace {

using Clock = ConnectLog::Clock;

Caller caller(pid_t pid, const std::string& exe) {
  Caller c;
  c.pid = pid;
  c.exe = exe;
  return c;
}

TEST(ConnectLog, ARecordIsTakenOnce) {
  ConnectLog log;
  log.record(7, caller(10, "/usr/bin/curl"));
  auto taken = log.take(7);
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].pid, 10);
  EXPECT_EQ(taken[0].exe, "/usr/bin/curl");
  EXPECT_TRUE(log.take(7).empty());
  EXPECT_TRUE(log.take(8).empty());
}

// A process the policy does not name connects; one it names connects the
// same socket again (EISCONN, or after a failure): both count.
TEST(ConnectLog, EveryProcessThatConnectsTheSocketCounts) {
  ConnectLog log;
  log.record(7, caller(11, "/usr/bin/evil"));
  log.record(7, caller(10, "/usr/bin/curl"));
  log.record(7, caller(10, "/usr/bin/curl"));  // a retry: once
  EXPECT_EQ(log.size(), 1u);
  auto taken = log.take(7);
  ASSERT_EQ(taken.size(), 2u);
  EXPECT_EQ(taken[0].exe, "/usr/bin/evil");
  EXPECT_EQ(taken[1].exe, "/usr/bin/curl");
}

TEST(ConnectLog, ManyConnectorsEndInAnUnknownOne) {
  ConnectLog log;
  for (pid_t pid = 1; pid <= 20; ++pid) log.record(7, caller(pid, "/usr/bin/curl"));
  auto taken = log.take(7);
  ASSERT_EQ(taken.size(), ConnectLog::kMaxConnectors);
  EXPECT_EQ(taken.back().exe, "");
  EXPECT_EQ(taken.back().untrusted, "more processes connected the socket than are kept");
}

TEST(ConnectLog, IsBoundedOldestFirst) {
  ConnectLog log(3);
  for (uint64_t inode = 1; inode <= 5; ++inode) log.record(inode, caller(1, "/x"));
  EXPECT_EQ(log.size(), 3u);
  EXPECT_TRUE(log.take(1).empty());
  EXPECT_TRUE(log.take(2).empty());
  EXPECT_FALSE(log.take(3).empty());
  EXPECT_FALSE(log.take(5).empty());
}

TEST(ConnectLog, LongPathsAreBoundedByBytes) {
  ConnectLog log(100, std::chrono::seconds(60), 64 * 1024);
  for (uint64_t inode = 1; inode <= 100; ++inode)
    log.record(inode, caller(1, "/" + std::string(4000, 'a')));
  EXPECT_LE(log.bytes(), 64u * 1024);
  EXPECT_LT(log.size(), 17u);
  EXPECT_FALSE(log.take(100).empty());
  EXPECT_TRUE(log.take(1).empty());
  for (uint64_t inode = 1; inode < 100; ++inode) log.take(inode);
  EXPECT_EQ(log.bytes(), 0u);
}

TEST(ConnectLog, RecordsExpire) {
  ConnectLog log(10, std::chrono::seconds(60));
  const Clock::time_point t0 = Clock::now();
  log.record(1, caller(1, "/x"), t0);
  log.record(2, caller(1, "/x"), t0 + std::chrono::seconds(30));
  EXPECT_TRUE(log.take(1, t0 + std::chrono::seconds(61)).empty());
  EXPECT_FALSE(log.take(2, t0 + std::chrono::seconds(61)).empty());
}

void send_fd(int socket_fd, int fd) {
  char tag = 'F';
  iovec iov{&tag, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
  }
  (void)!::sendmsg(socket_fd, &msg, 0);
}

int receive_fd(int socket_fd) {
  char tag = 0;
  iovec iov{&tag, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(socket_fd, &msg, MSG_CMSG_CLOEXEC) != 1) return -1;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (!cmsg || cmsg->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof fd);
  return fd;
}

struct ChildReport {
  uint64_t tcp_inode;
  int tcp_connect;   // 0, or the errno
  int unix_connect;  // 0, or the errno
};

struct Outcome {
  bool skipped = false;
  ChildReport report{};
  pid_t child = 0;
  std::optional<Caller> connector;
};

// A child with the connect filter connects a TCP socket (to a listener of
// the parent's) and a Unix one, while a watcher serves the filter.
// proxy_port: the watcher's (0: the listener's own).
void connect_in_child(uint16_t proxy_port, Outcome* out) {
  UniqueFd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof addr;
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &size), 0);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd parent_end(pair[0]), child_end(pair[1]);

  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
    int notify = runtime::seccomp::install_connect_listener();
    send_fd(child_end.get(), notify);
    if (notify < 0) ::_exit(3);
    ::close(notify);
    char go;
    if (::read(child_end.get(), &go, 1) != 1) ::_exit(4);
    ChildReport report{};
    int tcp = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct stat st {};
    ::fstat(tcp, &st);
    report.tcp_inode = st.st_ino;
    report.tcp_connect =
        ::connect(tcp, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 ? 0 : errno;
    int unix_listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un un{};
    un.sun_family = AF_UNIX;
    std::memcpy(un.sun_path, "\0osh-watch-test", 15);
    socklen_t un_size = offsetof(sockaddr_un, sun_path) + 15;
    ::bind(unix_listener, reinterpret_cast<sockaddr*>(&un), un_size);
    ::listen(unix_listener, 1);
    int unix_socket = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    report.unix_connect =
        ::connect(unix_socket, reinterpret_cast<sockaddr*>(&un), un_size) == 0 ? 0 : errno;
    (void)!::write(child_end.get(), &report, sizeof report);
    ::_exit(0);
  }
  child_end.reset();
  UniqueFd notify(receive_fd(parent_end.get()));
  if (!notify) {
    ::waitpid(child, nullptr, 0);
    out->skipped = true;
    return;
  }
  auto log = std::make_shared<ConnectLog>();
  ChildReport report{};
  {
    ConnectWatcher watcher(std::move(notify), child, log,
                           proxy_port ? proxy_port : ntohs(addr.sin_port));
    ASSERT_TRUE(watcher.active());
    ASSERT_EQ(::write(parent_end.get(), "g", 1), 1);
    ASSERT_EQ(::read(parent_end.get(), &report, sizeof report),
              static_cast<ssize_t>(sizeof report));
    EXPECT_EQ(watcher.answered(), 2u);
    EXPECT_EQ(watcher.recorded(), 1u);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(report.tcp_connect, 0) << std::strerror(report.tcp_connect);
  EXPECT_EQ(report.unix_connect, 0) << std::strerror(report.unix_connect);
  EXPECT_EQ(log->size(), 1u);
  out->report = report;
  out->child = child;
  auto connectors = log->take(report.tcp_inode);
  if (connectors.size() == 1) out->connector = connectors[0];
  EXPECT_EQ(connectors.size(), 1u);
}

// Both connects succeed, and only the TCP socket is recorded, as the
// child's, judged by the crediting rules.
TEST(ConnectWatcher, RecordsTheProcessThatConnectsATcpSocket) {
  Outcome out;
  connect_in_child(0, &out);
  if (out.skipped) GTEST_SKIP() << "the kernel gives no seccomp listener for connect";
  ASSERT_TRUE(out.connector.has_value());
  EXPECT_EQ(out.connector->pid, out.child);
  char exe[4096];
  ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  ASSERT_GT(n, 0);
  EXPECT_EQ(out.connector->exe, std::string(exe, static_cast<size_t>(n)));
  // Judged by the crediting rules (which a test binary run by its files'
  // owner may fail): not merely unexamined.
  EXPECT_EQ(out.connector->untrusted.find("not examined"), std::string::npos)
      << out.connector->untrusted;
}

// A connect to another port than the proxy's is recorded unexamined: a
// process that changes the address after the look is not credited.
TEST(ConnectWatcher, AConnectElsewhereIsRecordedUnexamined) {
  Outcome out;
  connect_in_child(1, &out);
  if (out.skipped) GTEST_SKIP() << "the kernel gives no seccomp listener for connect";
  ASSERT_TRUE(out.connector.has_value());
  EXPECT_EQ(out.connector->pid, out.child);
  EXPECT_EQ(out.connector->untrusted,
            "it was not examined (its connect(2) named another port than the proxy's)");
}

}  // namespace
}  // namespace openshell::egress
