// Port forwards (openshell forward, sandbox create --forward): TCP from the
// host's 127.0.0.1:PORT to 127.0.0.1:PORT inside a sandbox, relayed by its
// supervisor; as root and rootless. The servers inside are busybox's httpd
// and `osh-probe tcp-serve` (an echo that answers "eof after N bytes" at
// the end of the client's writes, to show half-closes).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

// A port of 127.0.0.1 that nothing listens on now (the kernel's choice).
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  uint16_t port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  ::close(fd);
  return port;
}

// A client connection to 127.0.0.1:port; -errno when refused.
int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    int err = errno;
    ::close(fd);
    return -err;
  }
  return fd;
}

bool send_all(int fd, const std::string& data) {
  for (size_t off = 0; off < data.size();) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// What arrives until the peer's end of stream, or until `want` bytes came
// (0: to the end), 20 s at most.
std::string read_from(int fd, size_t want = 0) {
  std::string got;
  char buf[65536];
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (want == 0 || got.size() < want) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || ::poll(&p, 1, static_cast<int>(left.count())) != 1) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  return got;
}

// One connection: `data` sent (by a thread of its own, so that a large
// echo never blocks both ends), the client's writes shut down (a
// half-close), and everything read back to the end. "refused: ..." when
// the connection was refused.
std::string round_trip(uint16_t port, const std::string& data) {
  int fd = connect_to(port);
  if (fd < 0) return std::string("refused: ") + std::strerror(-fd);
  std::thread writer([&] {
    send_all(fd, data);
    ::shutdown(fd, SHUT_WR);
  });
  std::string got = read_from(fd);
  writer.join();
  ::close(fd);
  return got;
}

std::string echoed(const std::string& data) {
  return data + "eof after " + std::to_string(data.size()) + " bytes\n";
}

class Forward : public GatewayTest {
 protected:
  Forward() : GatewayTest("fwd") {}

  // A sandbox whose main process is the echo server on `port`.
  void echo_sandbox(const std::string& name, uint16_t port,
                    const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"sandbox", "create", "--name", name, "--from", rootfs(), "-d"};
    args.insert(args.end(), extra.begin(), extra.end());
    for (const char* word : {"--", "osh-probe", "tcp-serve"}) args.push_back(word);
    args.push_back(std::to_string(port));
    Result r = os(args);
    ASSERT_EQ(r.status, 0) << r.err;
  }

  // The server inside starts a moment after the sandbox is Ready: until
  // then a connection is closed at once (nothing listens there yet).
  bool served(uint16_t port, const std::string& probe = "ping") {
    for (int i = 0; i < 300; ++i) {
      if (round_trip(port, probe) == echoed(probe)) return true;
      ::usleep(100000);
    }
    return false;
  }

  // `forward list` until its line of the port shows `state` (30 s).
  bool wait_state(uint16_t port, const std::string& state) {
    for (int i = 0; i < 300; ++i) {
      if (list_line(port).find(state) != std::string::npos) return true;
      ::usleep(100000);
    }
    return false;
  }
  std::string list_line(uint16_t port) {
    Result list = os({"forward", "list"});
    for (const auto& line : split_lines(list.out))
      if (line.find("   " + std::to_string(port) + "   ") != std::string::npos) return line;
    return "";
  }
  static std::vector<std::string> split_lines(const std::string& text) {
    std::vector<std::string> out;
    size_t start = 0;
    for (size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
      out.push_back(text.substr(start, nl - start));
    return out;
  }
};
E2E_ALL_MODES(Forward);

TEST_P(Forward, CarriesAnHttpServersResponsesToManyClientsAtOnce) {
  const uint16_t port = free_port();
  const std::string p = std::to_string(port);
  Result create =
      os({"sandbox", "create", "--name", "web", "--from", rootfs(), "-d", "--", "sh", "-c",
          "mkdir -p /tmp/www && echo hello-through-the-forward > /tmp/www/index.html "
          "&& exec httpd -f -p 127.0.0.1:" +
              p + " -h /tmp/www"});
  ASSERT_EQ(create.status, 0) << create.err;
  Result start = os({"forward", "start", "-d", p, "web"});
  ASSERT_EQ(start.status, 0) << start.err;
  EXPECT_EQ(start.out, "Forwarding 127.0.0.1:" + p + " -> sandbox 'web' port " + p +
                           " (stop it with 'openshell forward stop " + p + " web')\n");
  const std::string get = "GET /index.html HTTP/1.0\r\nHost: localhost\r\n\r\n";
  std::string reply;
  for (int i = 0; i < 300 && reply.find(" 200 ") == std::string::npos; ++i) {
    int fd = connect_to(port);
    ASSERT_GE(fd, 0) << "the forward's listener refused: " << std::strerror(-fd);
    send_all(fd, get);
    reply = read_from(fd);
    ::close(fd);
    if (reply.empty()) ::usleep(100000);  // httpd not listening yet
  }
  EXPECT_THAT(reply, HasSubstr(" 200 OK\r\n"));
  EXPECT_THAT(reply, HasSubstr("\r\n\r\nhello-through-the-forward\n"));
  // Many clients at once, each its own connection and its own answer.
  constexpr int kClients = 24;
  std::vector<std::string> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      int fd = connect_to(port);
      if (fd < 0) return;
      send_all(fd, get);
      replies[i] = read_from(fd);
      ::close(fd);
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < kClients; ++i)
    EXPECT_THAT(replies[i], HasSubstr("\r\n\r\nhello-through-the-forward\n")) << "client " << i;
  Result list = os({"forward", "list"});
  EXPECT_EQ(list.status, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("SANDBOX   BIND        PORT"));
  EXPECT_THAT(list_line(port), HasSubstr("web       127.0.0.1   " + p + "   listening"));
  Result json = os({"forward", "list", "-o", "json"});
  EXPECT_THAT(json.out, HasSubstr("\"address\": \"127.0.0.1:" + p + "\""));
  EXPECT_THAT(json.out, HasSubstr("\"state\": \"listening\""));
}

// The client ends its writes and still reads the whole reply; large and
// many transfers at once, each kept apart.
TEST_P(Forward, HalfClosesAndConcurrentEchoes) {
  const uint16_t port = free_port();
  echo_sandbox("echo", port);
  ASSERT_EQ(os({"forward", "start", "-d", std::to_string(port), "echo"}).status, 0);
  ASSERT_TRUE(served(port));
  // The server writes its last line only after our end of stream.
  EXPECT_EQ(round_trip(port, "half"), "halfeof after 4 bytes\n");
  EXPECT_EQ(round_trip(port, ""), "eof after 0 bytes\n");
  std::string big(3 * 1024 * 1024 + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>('a' + i * 7 % 26);
  EXPECT_TRUE(round_trip(port, big) == echoed(big)) << "a 3 MiB echo differs";
  constexpr int kClients = 32;
  std::vector<std::string> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      replies[i] = round_trip(port, "client " + std::to_string(i) + std::string(i * 1000, 'x'));
    });
  for (auto& t : clients) t.join();
  for (int i = 0; i < kClients; ++i)
    EXPECT_EQ(replies[i], echoed("client " + std::to_string(i) + std::string(i * 1000, 'x')))
        << "client " << i;
}

// The gateway is out of the data path: killed outright, an open connection
// goes on and new ones connect; the next gateway hears the forward's state.
TEST_P(Forward, SurvivesTheGatewaysKill) {
  const uint16_t port = free_port();
  echo_sandbox("survivor", port);
  ASSERT_EQ(os({"forward", "start", "-d", std::to_string(port), "survivor"}).status, 0);
  ASSERT_TRUE(served(port));
  int open = connect_to(port);
  ASSERT_GE(open, 0);
  ASSERT_TRUE(send_all(open, "before"));
  EXPECT_EQ(read_from(open, 6), "before");
  int killed = 0;
  for (const auto& p : gateway_processes(home_))
    if (p.find(":openshell-gateway") != std::string::npos) {
      ASSERT_TRUE(kill_and_wait(p.substr(0, p.find(':')))) << p;
      ++killed;
    }
  ASSERT_EQ(killed, 1) << "no gateway to kill";
  ASSERT_TRUE(send_all(open, "after"));
  EXPECT_EQ(read_from(open, 5), "after") << "the open connection, with the gateway gone";
  EXPECT_EQ(round_trip(port, "new"), echoed("new")) << "a new connection, with the gateway gone";
  ::shutdown(open, SHUT_WR);
  EXPECT_EQ(read_from(open), "eof after 11 bytes\n");
  ::close(open);
  // The next command starts a gateway; the supervisor reconnects and reports.
  EXPECT_TRUE(wait_state(port, "listening")) << list_line(port);
  EXPECT_EQ(round_trip(port, "later"), echoed("later"));
}

// A stopped sandbox's forward says so and listens no more; started again,
// the sandbox's new supervisor opens it again.
TEST_P(Forward, FollowsTheSandboxsStopAndStart) {
  const uint16_t port = free_port();
  const std::string p = std::to_string(port);
  echo_sandbox("cycle", port);
  ASSERT_EQ(os({"forward", "start", "-d", p, "cycle"}).status, 0);
  ASSERT_TRUE(served(port));
  ASSERT_EQ(os({"sandbox", "stop", "cycle"}).status, 0);
  EXPECT_THAT(list_line(port), HasSubstr("stopped: sandbox is Stopped"));
  EXPECT_EQ(connect_to(port), -ECONNREFUSED) << "a stopped sandbox's forward still listens";
  ASSERT_EQ(os({"sandbox", "start", "cycle"}).status, 0);
  EXPECT_TRUE(wait_state(port, "listening")) << list_line(port);
  EXPECT_TRUE(served(port)) << "after the start";
  // While it is stopped, the port taken by another program: the start
  // says why the forward does not listen, in the list.
  ASSERT_EQ(os({"sandbox", "stop", "cycle"}).status, 0);
  int squatter = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(squatter, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0)
      << std::strerror(errno);
  ASSERT_EQ(::listen(squatter, 1), 0);
  ASSERT_EQ(os({"sandbox", "start", "cycle"}).status, 0);
  EXPECT_TRUE(wait_state(port, "error: 127.0.0.1:" + p + ": Address already in use"))
      << list_line(port);
  ::close(squatter);
}

// forward stop closes the listener; a delete takes the sandbox's forwards
// with it and leaves no listener.
TEST_P(Forward, StopAndDeleteLeaveNoListener) {
  const uint16_t port = free_port();
  const std::string p = std::to_string(port);
  echo_sandbox("gone", port);
  ASSERT_EQ(os({"forward", "start", "-d", p, "gone"}).status, 0);
  ASSERT_TRUE(served(port));
  Result stop = os({"forward", "stop", p, "gone"});
  EXPECT_EQ(stop.status, 0) << stop.err;
  EXPECT_EQ(stop.out, "Stopped forwarding 127.0.0.1:" + p + " -> sandbox 'gone' port " + p + "\n");
  EXPECT_EQ(connect_to(port), -ECONNREFUSED);
  EXPECT_EQ(list_line(port), "");
  Result again = os({"forward", "stop", p, "gone"});
  EXPECT_EQ(again.status, 125);
  EXPECT_THAT(again.err, HasSubstr("sandbox 'gone' has no forward of port " + p));
  // The name left out: the last sandbox named.
  ASSERT_EQ(os({"forward", "start", "-d", p}).status, 0);
  EXPECT_TRUE(served(port));
  ASSERT_EQ(os({"sandbox", "delete", "gone"}).status, 0);
  EXPECT_EQ(connect_to(port), -ECONNREFUSED);
  Result list = os({"forward", "list", "-o", "json"});
  EXPECT_EQ(list.out, "[]\n");
}

// What cannot work is said at once, and nothing is kept of it.
TEST_P(Forward, ConflictsAndBadInputAreRefused) {
  const uint16_t port = free_port();
  const std::string p = std::to_string(port);
  echo_sandbox("one", port);
  ASSERT_EQ(os({"sandbox", "create", "--name", "two", "--from", rootfs()}).status, 0);
  ASSERT_EQ(os({"forward", "start", "-d", p, "one"}).status, 0);
  Result twice = os({"forward", "start", "-d", p, "two"});
  EXPECT_EQ(twice.status, 125);
  EXPECT_THAT(twice.err, HasSubstr("127.0.0.1:" + p + " is forwarded already (to sandbox 'one')"));
  Result same = os({"forward", "start", "-d", "127.0.0.2:" + p, "one"});
  EXPECT_EQ(same.status, 125);
  EXPECT_THAT(same.err, HasSubstr("sandbox 'one' forwards port " + p + " already"));
  // A port another program holds: the bind's failure, from the supervisor.
  RefusedPort taken;
  const std::string t = std::to_string(taken.port());
  Result busy = os({"forward", "start", "-d", t, "two"});
  EXPECT_EQ(busy.status, 125);
  EXPECT_THAT(busy.err, HasSubstr("cannot forward to sandbox 'two': 127.0.0.1:" + t +
                                  ": Address already in use"));
  EXPECT_EQ(list_line(taken.port()), "") << "a forward that cannot bind is not kept";
  for (const auto& [args, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"forward", "start", "http", "one"}, "PORT 'http' is not a number from 1 to 65535"},
           {{"forward", "start", "0", "one"}, "PORT '0' is not a number from 1 to 65535"},
           {{"forward", "start", "example.test:80", "one"}, "BIND 'example.test' is not an IP"},
           {{"forward", "stop", "70000", "one"}, "PORT is not a number from 1 to 65535"},
           {{"forward", "start", "-d", "8080", "nosuch"}, "no sandbox named 'nosuch'"},
       }) {
    Result r = os(args);
    EXPECT_EQ(r.status, 125) << args[2];
    EXPECT_THAT(r.err, HasSubstr(message));
  }
}

// Without -d, forward start stays until SIGTERM (or Ctrl-C), then stops
// the forward; a forward stopped elsewhere ends it too.
TEST_P(Forward, InTheForegroundUntilASignal) {
  const uint16_t port = free_port();
  const std::string p = std::to_string(port);
  echo_sandbox("fg", port);
  Options term;
  term.signal_when = "Ctrl-C stops it";
  term.signal = SIGTERM;
  Result r = os({"forward", "start", p, "fg"}, term);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "Forwarding 127.0.0.1:" + p + " -> sandbox 'fg' port " + p +
                       " (Ctrl-C stops it)\nStopped forwarding 127.0.0.1:" + p +
                       " -> sandbox 'fg' port " + p + "\n");
  EXPECT_EQ(list_line(port), "");
  EXPECT_EQ(connect_to(port), -ECONNREFUSED);
  Result foreground;
  Options long_run;
  long_run.timeout_s = 120;
  std::thread t([&] { foreground = os({"forward", "start", p, "fg"}, long_run); });
  bool carried = served(port);
  Result stop = os({"forward", "stop", p, "fg"});
  t.join();
  EXPECT_TRUE(carried) << "the foreground's forward carried nothing";
  EXPECT_EQ(stop.status, 0) << stop.err;
  EXPECT_EQ(foreground.status, 0) << foreground.err;
  EXPECT_THAT(foreground.out,
              HasSubstr("The forward of port " + p + " to sandbox 'fg' was stopped elsewhere\n"));
}

TEST_P(Forward, CreateWithForwards) {
  const uint16_t port = free_port(), other = free_port();
  echo_sandbox(
      "made", port,
      {"--forward", std::to_string(port), "--forward", "127.0.0.1:" + std::to_string(other)});
  EXPECT_TRUE(served(port));
  EXPECT_THAT(list_line(port), HasSubstr("made      127.0.0.1   " + std::to_string(port)));
  // Nothing serves the other port inside: the host's side is closed, not reset or left open.
  EXPECT_EQ(round_trip(other, "x"), "");
  EXPECT_THAT(list_line(other), HasSubstr("listening"));
  // From inside, the host's listener is not there: the port is the
  // sandbox's own loopback, where nothing listens (one way, host to sandbox).
  Result inside = os({"sandbox", "exec", "made", "--", "osh-probe", "connect", "127.0.0.1",
                      std::to_string(other)});
  EXPECT_EQ(inside.status, 1) << inside.out << inside.err;
  EXPECT_THAT(inside.out, HasSubstr("denied: ECONNREFUSED"));
  Result taken = os({"sandbox", "create", "--name", "late", "--from", rootfs(), "--forward",
                     std::to_string(port)});
  EXPECT_EQ(taken.status, 125);
  EXPECT_THAT(taken.err, HasSubstr("is forwarded already"));
  EXPECT_THAT(os({"sandbox", "list"}).out, Not(HasSubstr("late")));
}

}  // namespace
}  // namespace e2e
