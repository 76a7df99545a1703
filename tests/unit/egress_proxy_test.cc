// The egress proxy on a loopback listener of this process: its limit on
// open connections, and live updates that close what they refuse.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "egress/proxy.h"
#include "policy/policy.h"
#include "supervisor/network_rules.h"

namespace openshell::egress {
namespace {

using ::testing::HasSubstr;
namespace asio = boost::asio;

// A listening TCP socket on 127.0.0.1 and its port.
UniqueFd listener(uint16_t* port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::listen(fd.get(), 64), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

UniqueFd connect_to(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// What arrives on fd within `ms` (until EOF, or nothing more comes).
std::string read_for(int fd, int ms, bool* eof = nullptr) {
  std::string out;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return out;
    char buf[1024];
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) {
      if (eof) *eof = true;
      return out;
    }
    out.append(buf, static_cast<size_t>(n));
    if (out.find("\r\n\r\n") != std::string::npos && !eof) return out;
  }
}

std::shared_ptr<NetworkRules> rules_for_port(uint16_t port) {
  return std::make_shared<NetworkRules>(supervisor::network_rules(policy::parse(
      "version = 1\n[network_policies.local]\nendpoints = [ { host = \"127.0.0.1\", port = " +
          std::to_string(port) + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n",
      "test.toml")));
}

// A proxy served on a thread, with its audit lines.
class ProxyHarness {
 public:
  explicit ProxyHarness(size_t max_connections,
                        std::chrono::milliseconds head_timeout = std::chrono::seconds(30)) {
    Proxy::Options options;
    options.head_timeout = head_timeout;
    options.sandbox = "unit";
    options.init_pid = ::getpid();
    options.max_connections = max_connections;
    options.audit = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      audit_ += line + "\n";
    };
    proxy_ = std::make_unique<Proxy>(io_, options);
    proxy_->serve(listener(&port_), UniqueFd(), UniqueFd());
    work_.emplace(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ProxyHarness() {
    on_thread([this] { proxy_->close(); });
    work_.reset();
    io_.stop();
    thread_.join();
  }
  uint16_t port() const { return port_; }
  std::string audit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return audit_;
  }
  void on_thread(std::function<void()> f) {
    std::promise<void> done;
    asio::post(io_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }
  Proxy& proxy() { return *proxy_; }

 private:
  asio::io_context io_;
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  std::unique_ptr<Proxy> proxy_;
  uint16_t port_ = 0;
  std::mutex mutex_;
  std::string audit_;
  std::thread thread_;
};

TEST(ProxyLimits, ConnectionsBeyondTheLimitGet503AndAnAuditLine) {
  ProxyHarness h(3);
  std::vector<UniqueFd> held;
  for (int i = 0; i < 3; ++i) held.push_back(connect_to(h.port()));
  UniqueFd extra = connect_to(h.port());
  std::string reply = read_for(extra.get(), 30000);
  EXPECT_THAT(reply, HasSubstr("HTTP/1.1 503 Service Unavailable\r\n"));
  EXPECT_THAT(reply, HasSubstr("too many connections to the proxy (the limit is 3)"));
  EXPECT_THAT(h.audit(),
              HasSubstr("\"reason\":\"too many connections to the proxy (the limit is 3)\""));
  // The held ones are waiting for their request, not refused.
  for (auto& fd : held) EXPECT_EQ(read_for(fd.get(), 50), "");
  // Once one closes, a new one is served again.
  held.pop_back();
  // The proxy may take the next connection before it reads the close: asked
  // again until it is served (and not refused), 30 s at most.
  std::string answer;
  for (int i = 0; i < 300 && answer.find(" 400 ") == std::string::npos; ++i) {
    if (i > 0) ::usleep(100000);
    UniqueFd again = connect_to(h.port());
    const std::string bad = "NONSENSE\r\n\r\n";
    ssize_t sent = ::write(again.get(), bad.data(), bad.size());
    (void)sent;
    answer = read_for(again.get(), 30000);
    if (answer.find(" 400 ") == std::string::npos) {
      EXPECT_THAT(answer, HasSubstr(" 503 "));
    }
  }
  EXPECT_THAT(answer, HasSubstr("HTTP/1.1 400 Bad Request"));
}

TEST(ProxyLimits, AnOverlongRequestHeadGets431) {
  ProxyHarness h(8);
  UniqueFd client = connect_to(h.port());
  std::string head = "CONNECT 127.0.0.1:1 HTTP/1.1\r\nX: " + std::string(20000, 'a');
  (void)!::write(client.get(), head.data(), head.size());
  EXPECT_THAT(read_for(client.get(), 2000),
              HasSubstr("HTTP/1.1 431 Request Header Fields Too Large"));
}

TEST(ProxyLimits, AHeadOfExactly16KiBIsReadAndOneByteMoreGets431) {
  ProxyHarness h(8);
  // A plain-HTTP request with a head of exactly 16384 bytes: read whole (and
  // refused for what it asks, not for its size).
  const std::string start = "GET http://127.0.0.1:1/ HTTP/1.1\r\nX: ";
  const std::string fits = start + std::string(16 * 1024 - start.size() - 4, 'a') + "\r\n\r\n";
  ASSERT_EQ(fits.size(), 16u * 1024);
  UniqueFd ok = connect_to(h.port());
  ASSERT_EQ(::write(ok.get(), fits.data(), fits.size()), static_cast<ssize_t>(fits.size()));
  std::string reply = read_for(ok.get(), 5000);
  EXPECT_THAT(reply, ::testing::StartsWith("HTTP/1.1 403 Forbidden\r\n"));
  // One byte more, sent in one write with its end: 431 all the same.
  UniqueFd over = connect_to(h.port());
  const std::string longer = start + std::string(16 * 1024 - start.size() - 3, 'a') + "\r\n\r\n";
  ASSERT_EQ(::write(over.get(), longer.data(), longer.size()), static_cast<ssize_t>(longer.size()));
  EXPECT_THAT(read_for(over.get(), 5000),
              HasSubstr("HTTP/1.1 431 Request Header Fields Too Large"));
}

TEST(ProxyLimits, AClientThatNeverFinishesItsHeadIsClosedAfterTheHeadTimeout) {
  ProxyHarness h(8, std::chrono::milliseconds(300));
  auto before = std::chrono::steady_clock::now();
  UniqueFd client = connect_to(h.port());
  const std::string partial = "GET http://127.0.0.1:1/ HTTP/1.1\r\nHost: 127.0.0.1";
  ASSERT_EQ(::write(client.get(), partial.data(), partial.size()),
            static_cast<ssize_t>(partial.size()));
  bool eof = false;
  std::string reply = read_for(client.get(), 20000, &eof);
  EXPECT_TRUE(eof) << "still open 20 s after a 300 ms head timeout";
  EXPECT_EQ(reply, "");
  EXPECT_GE(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(300))
      << "closed before the head timeout";
}

TEST(ProxyLimits, TheDefaultHeadTimeoutIsThirtySeconds) {
  EXPECT_EQ(Proxy::Options().head_timeout, std::chrono::seconds(30));
}

TEST(ProxyLiveUpdate, ANewPolicyClosesTheTunnelsItRefuses) {
  // Two echo servers; tunnels to both; the new rules allow only the second.
  uint16_t port_a = 0, port_b = 0;
  UniqueFd server_a = listener(&port_a), server_b = listener(&port_b);
  ProxyHarness h(8);
  auto both = std::make_shared<NetworkRules>(supervisor::network_rules(policy::parse(
      "version = 1\n[network_policies.local]\nendpoints = [ { host = \"127.0.0.1\", port = " +
          std::to_string(port_a) +
          ", allowed_ips = [\"127.0.0.1/32\"] }, { host = \"127.0.0.1\", port = " +
          std::to_string(port_b) + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n",
      "test.toml")));
  h.on_thread([&] { h.proxy().set_rules(both, 1); });
  auto tunnel = [&](uint16_t port) {
    UniqueFd fd = connect_to(h.port());
    std::string request = "CONNECT 127.0.0.1:" + std::to_string(port) + " HTTP/1.1\r\n\r\n";
    (void)!::write(fd.get(), request.data(), request.size());
    EXPECT_THAT(read_for(fd.get(), 3000), HasSubstr("200 Connection established"));
    return fd;
  };
  UniqueFd a = tunnel(port_a), b = tunnel(port_b);
  UniqueFd upstream_b(::accept4(server_b.get(), nullptr, nullptr, SOCK_CLOEXEC));
  h.on_thread([&] { h.proxy().set_rules(rules_for_port(port_b), 2); });
  bool eof = false;
  read_for(a.get(), 1000, &eof);
  EXPECT_TRUE(eof) << "the refused tunnel stayed open";
  // The other still carries bytes.
  ASSERT_EQ(::write(b.get(), "ping", 4), 4);
  char buf[8] = {};
  pollfd p{upstream_b.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 2000), 1);
  EXPECT_EQ(::read(upstream_b.get(), buf, sizeof buf), 4);
  std::string audit = h.audit();
  EXPECT_THAT(audit, HasSubstr("\"decision\":\"closed\""));
  EXPECT_THAT(audit, HasSubstr("\"reason\":\"policy revision 2: no rule allows 127.0.0.1:" +
                               std::to_string(port_a)));
  EXPECT_EQ(audit.find("\"decision\":\"closed\""), audit.rfind("\"decision\":\"closed\"")) << audit;
}

}  // namespace
}  // namespace openshell::egress
