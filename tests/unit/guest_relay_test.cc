// The guest init's relays (runtime/guest_relay.h) outside a VM: the
// listeners on test-chosen loopback ports, the host's end a Unix socket the
// test holds (an abstract name: nothing to remove), reached through the
// relay's HostConnector where the guest uses vsock. Each relay runs in a
// forked process group of its own, killed at the end.
#include "runtime/guest_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/files.h"
#include "base/unique_fd.h"

namespace openshell::runtime::guest {
namespace {

// The host's end: a listening Unix socket, and a connector to it that
// names the port it was asked for in the socket's name.
struct Host {
  UniqueFd listener;
  sockaddr_un addr{};
  socklen_t len = 0;
  uint32_t asked_port = 0;

  explicit Host(const std::string& tag) {
    listener.reset(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    addr.sun_family = AF_UNIX;
    std::string name = "osh-relay-test-" + tag + "-" + std::to_string(getpid());
    std::memcpy(addr.sun_path + 1, name.data(), name.size());
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    EXPECT_EQ(bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), len), 0);
    EXPECT_EQ(listen(listener.get(), 16), 0);
  }
  HostConnector connector() const {
    sockaddr_un a = addr;
    socklen_t l = len;
    return [a, l](uint32_t port) {
      if (port != 4242) {
        errno = ECONNREFUSED;
        return UniqueFd();
      }
      UniqueFd fd(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&a), l) != 0) return UniqueFd();
      return fd;
    };
  }
  // The next connection, or none within timeout_ms.
  UniqueFd accept_one(int timeout_ms = 10000) const {
    pollfd p{listener.get(), POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) return UniqueFd();
    return UniqueFd(accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  }
};

// A relay in a process group of its own, killed (with its connections'
// processes) when this goes.
struct Relay {
  pid_t pid = -1;
  explicit Relay(const std::function<void()>& serve) {
    pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      serve();
      _exit(1);
    }
    setpgid(pid, pid);
  }
  ~Relay() {
    kill(-pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
  }
};

uint16_t port_of(int fd) {
  sockaddr_in addr{};
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  return ntohs(addr.sin_port);
}

// Reads up to and with the first newline (or 10 seconds).
std::string read_line(int fd) {
  std::string line;
  char c;
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, 10000) == 1 && read(fd, &c, 1) == 1) {
    line.push_back(c);
    if (c == '\n') break;
  }
  return line;
}

std::string read_exactly(int fd, size_t n) {
  std::string out;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  while (out.size() < n && poll(&p, 1, 10000) == 1) {
    ssize_t got = read(fd, buf, std::min(sizeof buf, n - out.size()));
    if (got <= 0) break;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

// Whether fd reads end of file (not merely nothing) within 10 seconds.
bool ends(int fd) {
  pollfd p{fd, POLLIN, 0};
  char c;
  return poll(&p, 1, 10000) == 1 && read(fd, &c, 1) == 0;
}

int connect_tcp(uint16_t port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A caller the test forked: killed and reaped if the test ends before it.
struct Child {
  pid_t pid = -1;
  explicit Child(pid_t p) : pid(p) {}
  ~Child() {
    if (pid <= 0) return;
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
  }
  int wait() {
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

TEST(GuestRelay, TheIdentityLineIsOneJsonLine) {
  EXPECT_EQ(identity_line(42, "/usr/bin/curl", ""),
            "{\"pid\":42,\"exe\":\"/usr/bin/curl\",\"untrusted\":\"\"}\n");
  EXPECT_EQ(identity_line(0, "", "LD_PRELOAD in its environment"),
            "{\"pid\":0,\"exe\":\"\",\"untrusted\":\"LD_PRELOAD in its environment\"}\n");
  // Bytes that are not UTF-8 still make one JSON line.
  std::string odd = identity_line(1, "/bin/\xff\"x", "");
  EXPECT_EQ(odd.find('\n'), odd.size() - 1);
  EXPECT_NO_THROW({
    nlohmann::json parsed = nlohmann::json::parse(odd);
    EXPECT_EQ(parsed["pid"], 1);
  });
}

TEST(GuestRelay, AProxyConnectionReachesTheHostNamingItsCallerThenBytesFlowBothWays) {
  UniqueFd listener = listen_loopback_tcp(0);
  const uint16_t port = port_of(listener.get());
  Host host("egress");
  Relay relay([&] { serve_egress(listener.get(), 4242, host.connector()); });
  listener.reset();

  // The caller: a child of the test, which waits for the host's answer.
  Child client(fork());
  if (client.pid == 0) {
    int fd = connect_tcp(port);
    if (fd < 0) _exit(2);
    if (write(fd, "CONNECT example.com:443 HTTP/1.1\r\n\r\n", 36) != 36) _exit(3);
    std::string answer = read_exactly(fd, 19);
    _exit(answer == "HTTP/1.1 200 OK\r\n\r\n" ? 0 : 4);
  }
  UniqueFd conn = host.accept_one();
  ASSERT_TRUE(conn) << "the relay did not connect to the host";
  std::string line = read_line(conn.get());
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  nlohmann::json identity = nlohmann::json::parse(line);
  EXPECT_EQ(identity["pid"], client.pid) << line;
  EXPECT_EQ(identity["exe"], files::read_link("/proc/self/exe")) << line;
  EXPECT_TRUE(identity["untrusted"].is_string()) << line;
  EXPECT_EQ(read_exactly(conn.get(), 36), "CONNECT example.com:443 HTTP/1.1\r\n\r\n");
  files::write_all(conn.get(), "HTTP/1.1 200 OK\r\n\r\n");
  EXPECT_EQ(client.wait(), 0);
  // The caller closed: the host's end sees the end.
  EXPECT_TRUE(ends(conn.get()));
}

TEST(GuestRelay, ACallerWithLdPreloadIsNotCredited) {
  const char* bash = "/bin/bash";
  if (access(bash, X_OK) != 0) GTEST_SKIP() << "no /bin/bash (its /dev/tcp is the caller here)";
  UniqueFd listener = listen_loopback_tcp(0);
  const uint16_t port = port_of(listener.get());
  Host host("preload");
  Relay relay([&] { serve_egress(listener.get(), 4242, host.connector()); });
  listener.reset();
  Child client(fork());
  if (client.pid == 0) {
    std::string script = "exec 3<>/dev/tcp/127.0.0.1/" + std::to_string(port) +
                         " && printf ping >&3 && read -r answer <&3 && [ \"$answer\" = pong ]";
    // The loader says it cannot preload the file, and goes on: the
    // environment is what is judged.
    char* const argv[] = {const_cast<char*>("bash"), const_cast<char*>("-c"), script.data(),
                          nullptr};
    char* const env[] = {const_cast<char*>("LD_PRELOAD=/nonexistent/osh-preload.so"),
                         const_cast<char*>("PATH=/usr/bin:/bin"), nullptr};
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 2);
    execve(bash, argv, env);
    _exit(127);
  }
  UniqueFd conn = host.accept_one();
  ASSERT_TRUE(conn);
  nlohmann::json identity = nlohmann::json::parse(read_line(conn.get()));
  EXPECT_EQ(identity["pid"], client.pid);
  EXPECT_NE(identity["exe"].get<std::string>().find("bash"), std::string::npos) << identity;
  EXPECT_EQ(identity["untrusted"], "LD_PRELOAD in its environment");
  EXPECT_EQ(read_exactly(conn.get(), 4), "ping");
  files::write_all(conn.get(), "pong\n");
  EXPECT_EQ(client.wait(), 0);
}

TEST(GuestRelay, AStalledConnectionDoesNotHoldUpTheNext) {
  UniqueFd listener = listen_loopback_tcp(0);
  const uint16_t port = port_of(listener.get());
  Host host("stall");
  Relay relay([&] { serve_egress(listener.get(), 4242, host.connector(), 4); });
  listener.reset();
  // The first caller sends more than any buffer holds and the host never
  // reads it; the second is served all the same.
  UniqueFd first(connect_tcp(port));
  ASSERT_TRUE(first);
  UniqueFd first_host = host.accept_one();
  ASSERT_TRUE(first_host);
  read_line(first_host.get());
  std::string lots(1 << 20, 'x');
  fcntl(first.get(), F_SETFL, O_NONBLOCK);
  ssize_t ignored = write(first.get(), lots.data(), lots.size());
  (void)ignored;
  UniqueFd second(connect_tcp(port));
  ASSERT_TRUE(second);
  UniqueFd second_host = host.accept_one();
  ASSERT_TRUE(second_host);
  nlohmann::json identity = nlohmann::json::parse(read_line(second_host.get()));
  EXPECT_EQ(identity["pid"], getpid());
  files::write_all(second.get(), "hello");
  EXPECT_EQ(read_exactly(second_host.get(), 5), "hello");
  files::write_all(second_host.get(), "world");
  EXPECT_EQ(read_exactly(second.get(), 5), "world");
}

TEST(GuestRelay, WithoutTheHostTheCallerSeesTheConnectionClose) {
  UniqueFd listener = listen_loopback_tcp(0);
  const uint16_t port = port_of(listener.get());
  // A connector for another port than the one asked: the host refuses.
  Host host("refused");
  Relay relay([&] { serve_egress(listener.get(), 4243, host.connector()); });
  listener.reset();
  UniqueFd fd(connect_tcp(port));
  ASSERT_TRUE(fd);
  EXPECT_TRUE(ends(fd.get()));
}

std::string frame(const std::string& message) {
  std::string out;
  out.push_back(static_cast<char>(message.size() >> 8));
  out.push_back(static_cast<char>(message.size() & 0xff));
  return out + message;
}

TEST(GuestRelay, DnsQueriesTravelFramedOnOneStreamAndAnswersFindTheirCallers) {
  UniqueFd udp = bind_loopback_udp(0);
  const uint16_t port = port_of(udp.get());
  Host host("dns");
  Relay relay([&] { serve_dns(udp.get(), 4242, host.connector()); });
  udp.reset();
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  // Two callers with the same query id: the relay tells them apart.
  UniqueFd a(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  UniqueFd b(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  const std::string body_a = std::string(10, 'a'), body_b = std::string(30, 'b');
  const std::string query_a = "\x12\x34" + body_a, query_b = "\x12\x34" + body_b;
  ASSERT_EQ(sendto(a.get(), query_a.data(), query_a.size(), 0, reinterpret_cast<sockaddr*>(&to),
                   sizeof to),
            static_cast<ssize_t>(query_a.size()));
  UniqueFd stream = host.accept_one();
  ASSERT_TRUE(stream) << "no DNS stream to the host";
  ASSERT_EQ(sendto(b.get(), query_b.data(), query_b.size(), 0, reinterpret_cast<sockaddr*>(&to),
                   sizeof to),
            static_cast<ssize_t>(query_b.size()));
  std::string got_a = read_exactly(stream.get(), 2 + query_a.size());
  std::string got_b = read_exactly(stream.get(), 2 + query_b.size());
  ASSERT_EQ(got_a.size(), 2 + query_a.size());
  ASSERT_EQ(got_b.size(), 2 + query_b.size());
  EXPECT_EQ(got_a.substr(0, 2), frame(query_a).substr(0, 2)) << "the length, big-endian";
  EXPECT_EQ(got_a.substr(4), body_a);
  EXPECT_EQ(got_b.substr(4), body_b);
  const std::string id_a = got_a.substr(2, 2), id_b = got_b.substr(2, 2);
  EXPECT_NE(id_a, id_b) << "one id for two pending queries";
  // The answers, the second first, in one write.
  files::write_all(stream.get(), frame(id_b + "answer-b-...") + frame(id_a + "answer-a-..."));
  char buf[512];
  pollfd p{a.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ssize_t n = recv(a.get(), buf, sizeof buf, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))),
            "\x12\x34"
            "answer-a-...");
  p = {b.get(), POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  n = recv(b.get(), buf, sizeof buf, 0);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))),
            "\x12\x34"
            "answer-b-...");
  // A stream the host ends is made again for a later query (a query that
  // meets the old one's end is lost, as UDP may lose it: the caller asks
  // again, as a resolver would).
  stream.reset();
  UniqueFd again;
  for (int attempt = 0; attempt < 20 && !again; ++attempt) {
    ASSERT_EQ(sendto(a.get(), query_a.data(), query_a.size(), 0, reinterpret_cast<sockaddr*>(&to),
                     sizeof to),
              static_cast<ssize_t>(query_a.size()));
    again = host.accept_one(500);
  }
  ASSERT_TRUE(again) << "no new stream after the first ended";
  EXPECT_EQ(read_exactly(again.get(), 2 + query_a.size()).substr(4), body_a);
}

}  // namespace
}  // namespace openshell::runtime::guest
