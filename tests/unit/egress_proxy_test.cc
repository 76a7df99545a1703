// The egress proxy on a loopback listener of this process: its limit on
// open connections, and live updates that close what they refuse; and as a
// micro-VM's guest uses it, with connections handed over as fds whose
// caller is known or named by their first line.
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
#include "proxy_harness.h"
#include "supervisor/network_rules.h"

namespace openshell::egress {
namespace {

using ::testing::HasSubstr;
namespace asio = boost::asio;

using testing::connect_loopback;
using testing::loopback_listener;
UniqueFd connect_to(uint16_t port) { return connect_loopback(port); }

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

Proxy::Options harness_options(size_t max_connections, std::chrono::milliseconds head_timeout,
                               bool guest) {
  Proxy::Options options;
  options.head_timeout = head_timeout;
  options.sandbox = "unit";
  options.init_pid = guest ? 0 : ::getpid();
  options.max_connections = max_connections;
  return options;
}

// A proxy served on a thread, with its audit lines.
class ProxyHarness : public testing::ProxyHarness {
 public:
  // guest: as a micro-VM's sandbox has it: no listener, no identity search
  // (init_pid 0), only connections handed over.
  explicit ProxyHarness(size_t max_connections,
                        std::chrono::milliseconds head_timeout = std::chrono::seconds(30),
                        bool guest = false)
      : testing::ProxyHarness(harness_options(max_connections, head_timeout, guest), !guest) {}

  // A connection handed to the proxy as a guest's (`line` first, as the
  // guest init writes it, then `bytes`, in one write), or, without a line,
  // as one of `caller`: the test's end of the socket pair.
  UniqueFd guest(const std::string& line, const std::string& bytes = {}) {
    int pair[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    UniqueFd theirs(pair[1]);
    on_thread([&] { proxy().serve_guest_connection(std::move(theirs)); });
    const std::string all = line + bytes;
    EXPECT_EQ(::send(pair[0], all.data(), all.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(all.size()));
    return UniqueFd(pair[0]);
  }
  UniqueFd identified(Caller caller, const std::string& bytes = {}) {
    int pair[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    UniqueFd theirs(pair[1]);
    on_thread([&] { proxy().serve_identified(std::move(theirs), caller); });
    if (!bytes.empty())
      EXPECT_EQ(::send(pair[0], bytes.data(), bytes.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(bytes.size()));
    return UniqueFd(pair[0]);
  }
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
  UniqueFd server_a = loopback_listener(&port_a), server_b = loopback_listener(&port_b);
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

// ---- a guest's connections -------------------------------------------------------

// Rules that let only /usr/bin/curl reach 127.0.0.1:port.
std::shared_ptr<NetworkRules> curl_only(uint16_t port) {
  return std::make_shared<NetworkRules>(supervisor::network_rules(policy::parse(
      "version = 1\n[network_policies.local]\nbinaries = [ { path = \"/usr/bin/curl\" } ]\n"
      "endpoints = [ { host = \"127.0.0.1\", port = " +
          std::to_string(port) + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n",
      "test.toml")));
}

std::string connect_request(uint16_t port) {
  return "CONNECT 127.0.0.1:" + std::to_string(port) + " HTTP/1.1\r\n\r\n";
}

// Whether a connection to the server's listener is waiting within `ms`.
bool dialled(int server, int ms) {
  pollfd p{server, POLLIN, 0};
  return ::poll(&p, 1, ms) == 1;
}

// What the server's side of the next connection receives within `ms`, up
// to what ends with `last`; *kept: that side, when asked for.
std::string received(int server, int ms, const std::string& last, UniqueFd* kept = nullptr) {
  UniqueFd upstream(::accept4(server, nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(upstream) << "the proxy did not dial";
  std::string got;
  while (upstream && !got.ends_with(last)) {
    pollfd p{upstream.get(), POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) break;
    char buf[4096];
    ssize_t n = ::read(upstream.get(), buf, sizeof buf);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  if (kept) *kept = std::move(upstream);
  return got;
}

TEST(ProxyGuest, ACallerTheLineNamesIsAllowedByABinaryRuleAndTheTunnelKeepsTheBytesAfterIt) {
  uint16_t port = 0;
  UniqueFd server = loopback_listener(&port);
  ProxyHarness h(8, std::chrono::seconds(30), /*guest=*/true);
  h.on_thread([&] { h.proxy().set_rules(curl_only(port), 1); });
  // The line, the request and the tunnel's first bytes, all in one write.
  UniqueFd client = h.guest("{\"pid\":42,\"exe\":\"/usr/bin/curl\",\"untrusted\":\"\"}\n",
                            connect_request(port) + "hello");
  EXPECT_THAT(read_for(client.get(), 5000), HasSubstr("HTTP/1.1 200 Connection established"));
  UniqueFd upstream;
  EXPECT_EQ(received(server.get(), 5000, "hello", &upstream), "hello");
  // Both ways, through the guest's Unix socket as through a TCP client.
  auto next_bytes = [](int fd) {
    char buf[64] = {};
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) return std::string("(nothing in 5 s)");
    ssize_t n = ::read(fd, buf, sizeof buf);
    return std::string(buf, static_cast<size_t>(n > 0 ? n : 0));
  };
  ASSERT_EQ(::write(upstream.get(), "world", 5), 5);
  EXPECT_EQ(next_bytes(client.get()), "world");
  ASSERT_EQ(::write(client.get(), "again", 5), 5);
  EXPECT_EQ(next_bytes(upstream.get()), "again");
  std::string audit = h.audit();
  EXPECT_THAT(audit, HasSubstr("\"binary\":\"/usr/bin/curl\""));
  EXPECT_THAT(audit, HasSubstr("\"pid\":42"));
  EXPECT_THAT(audit, HasSubstr("\"decision\":\"allow\""));
}

TEST(ProxyGuest, APlainRequestAndItsBodyInTheLinesReadAreForwardedWhole) {
  uint16_t port = 0;
  UniqueFd server = loopback_listener(&port);
  ProxyHarness h(8, std::chrono::seconds(30), /*guest=*/true);
  h.on_thread([&] { h.proxy().set_rules(curl_only(port), 1); });
  const std::string request = "POST http://127.0.0.1:" + std::to_string(port) +
                              "/upload HTTP/1.1\r\nContent-Length: 4\r\n\r\nbody";
  UniqueFd client = h.guest("{\"pid\":7,\"exe\":\"/usr/bin/curl\",\"untrusted\":\"\"}\n", request);
  std::string got = received(server.get(), 5000, "body");
  EXPECT_THAT(got, ::testing::StartsWith("POST /upload HTTP/1.1\r\nHost: 127.0.0.1:"));
  EXPECT_THAT(got, ::testing::EndsWith("\r\n\r\nbody"));
}

TEST(ProxyGuest, ABinaryTheRuleDoesNotNameIsRefused) {
  uint16_t port = 0;
  UniqueFd server = loopback_listener(&port);
  ProxyHarness h(8, std::chrono::seconds(30), /*guest=*/true);
  h.on_thread([&] { h.proxy().set_rules(curl_only(port), 1); });
  UniqueFd client =
      h.guest("{\"pid\":43,\"exe\":\"/usr/bin/wget\",\"untrusted\":\"\"}\n", connect_request(port));
  EXPECT_THAT(read_for(client.get(), 5000), ::testing::StartsWith("HTTP/1.1 403 Forbidden\r\n"));
  EXPECT_FALSE(dialled(server.get(), 100));
  std::string audit = h.audit();
  EXPECT_THAT(audit, HasSubstr("\"binary\":\"/usr/bin/wget\""));
  EXPECT_THAT(audit, HasSubstr("\"pid\":43"));
  EXPECT_THAT(audit, HasSubstr("\"decision\":\"deny\""));
}

TEST(ProxyGuest, AnUntrustedCallerIsNotCreditedAsItsBinary) {
  uint16_t port = 0;
  UniqueFd server = loopback_listener(&port);
  ProxyHarness h(8, std::chrono::seconds(30), /*guest=*/true);
  h.on_thread([&] { h.proxy().set_rules(curl_only(port), 1); });
  UniqueFd client = h.guest(
      "{\"pid\":44,\"exe\":\"/usr/bin/curl\",\"untrusted\":\"LD_PRELOAD in its "
      "environment\"}\n",
      connect_request(port));
  std::string reply = read_for(client.get(), 5000);
  EXPECT_THAT(reply, ::testing::StartsWith("HTTP/1.1 403 Forbidden\r\n"));
  EXPECT_THAT(reply, HasSubstr("/usr/bin/curl (pid 44) is not credited as itself: LD_PRELOAD in "
                               "its environment"));
  EXPECT_FALSE(dialled(server.get(), 100));
  EXPECT_THAT(h.audit(), HasSubstr("\"decision\":\"deny\""));
}

TEST(ProxyGuest, AMalformedLineIsRefusedAndAuditedAndCreditsNoOne) {
  uint16_t port = 0;
  UniqueFd server = loopback_listener(&port);
  ProxyHarness h(8, std::chrono::seconds(30), /*guest=*/true);
  // Rules that name no binary: even a connection any caller may make is
  // refused when the line is wrong.
  h.on_thread([&] { h.proxy().set_rules(rules_for_port(port), 1); });
  for (const std::string& line :
       {std::string("not json\n"), std::string("{\"pid\":1,\"exe\":\"/usr/bin/curl\"}\n"),
        std::string("{\"pid\":1,\"exe\":\"/usr/bin/curl\",\"untrusted\":\"\",\"uid\":0}\n"),
        std::string("{\"pid\":-1,\"exe\":\"\",\"untrusted\":\"\"}\n"), std::string("\n"),
        "{\"pid\":1,\"exe\":\"" + std::string(5000, 'a') + "\"}\n"}) {
    std::string before = h.audit();
    UniqueFd client = h.guest(line, connect_request(port));
    std::string reply = read_for(client.get(), 5000);
    EXPECT_THAT(reply, ::testing::StartsWith("HTTP/1.1 400 Bad Request\r\n")) << line;
    EXPECT_THAT(reply, HasSubstr("a malformed identity line")) << line;
    std::string audit = h.audit().substr(before.size());
    EXPECT_THAT(audit, HasSubstr("the guest's identity line is malformed")) << line;
    EXPECT_THAT(audit, HasSubstr("\"decision\":\"deny\"")) << line;
  }
  EXPECT_FALSE(dialled(server.get(), 100)) << "a refused connection went on";
  // A line that does not end within 4 KiB is refused without waiting for more.
  UniqueFd endless = h.guest(std::string(4096, ' '));
  EXPECT_THAT(read_for(endless.get(), 5000), HasSubstr("no newline in its first 4096 bytes"));
}

TEST(ProxyGuest, AGuestThatSendsNoLineIsClosedAfterTheHeadTimeout) {
  ProxyHarness h(8, std::chrono::milliseconds(300), /*guest=*/true);
  UniqueFd client = h.guest("{\"pid\":1,");
  bool eof = false;
  EXPECT_EQ(read_for(client.get(), 20000, &eof), "");
  EXPECT_TRUE(eof) << "still open 20 s after a 300 ms head timeout";
}

TEST(ProxyGuest, AnIdentifiedCallerIsJudgedAsGivenAndHeldToTheLimit) {
  uint16_t port = 0;
  UniqueFd server = loopback_listener(&port);
  ProxyHarness h(2, std::chrono::seconds(30), /*guest=*/true);
  h.on_thread([&] { h.proxy().set_rules(curl_only(port), 1); });
  Caller curl{9, "/usr/bin/curl", ""};
  UniqueFd allowed = h.identified(curl, connect_request(port));
  EXPECT_THAT(read_for(allowed.get(), 5000), HasSubstr("HTTP/1.1 200 Connection established"));
  UniqueFd upstream(::accept4(server.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(upstream);
  UniqueFd refused = h.identified(Caller{10, "/bin/sh", ""}, connect_request(port));
  EXPECT_THAT(read_for(refused.get(), 5000), ::testing::StartsWith("HTTP/1.1 403 Forbidden"));
  refused.reset();
  // Two open (the tunnel and one waiting for its head): a third is over the limit.
  UniqueFd waiting = h.identified(curl);
  UniqueFd over;
  std::string reply;
  // The refused one may not have closed yet on the proxy's side: ask again.
  for (int i = 0; i < 300 && reply.find(" 503 ") == std::string::npos; ++i) {
    if (i > 0) ::usleep(10000);
    over = h.identified(curl);
    reply = read_for(over.get(), 100);
  }
  EXPECT_THAT(reply, HasSubstr("HTTP/1.1 503 Service Unavailable"));
  // A new policy without the rule closes the tunnel.
  h.on_thread([&] { h.proxy().set_rules(rules_for_port(1), 2); });
  bool eof = false;
  read_for(allowed.get(), 5000, &eof);
  EXPECT_TRUE(eof) << "the refused tunnel stayed open";
  EXPECT_THAT(h.audit(), HasSubstr("\"decision\":\"closed\""));
}

TEST(ProxyGuest, AfterCloseAConnectionHandedOverIsClosedUnserved) {
  ProxyHarness h(8, std::chrono::seconds(30), /*guest=*/true);
  h.on_thread([&] { h.proxy().close(); });
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd ours(pair[0]), theirs(pair[1]);
  h.on_thread([&] { h.proxy().serve_guest_connection(std::move(theirs)); });
  bool eof = false;
  EXPECT_EQ(read_for(ours.get(), 5000, &eof), "");
  EXPECT_TRUE(eof) << "the proxy kept the fd";
}

TEST(ProxyGuest, AnFdThatIsNotAStreamSocketIsClosedNotServed) {
  ProxyHarness h(8, std::chrono::seconds(30), /*guest=*/true);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair), 0);
  UniqueFd ours(pair[0]), theirs(pair[1]);
  h.on_thread([&] { h.proxy().serve_guest_connection(std::move(theirs)); });
  EXPECT_EQ(::send(ours.get(), "x", 1, MSG_NOSIGNAL), -1) << "the proxy kept the fd";
  EXPECT_EQ(h.audit(), "");
}

}  // namespace
}  // namespace openshell::egress
