// The API over TCP: TLS 1.3 with client certificates, plain TCP on loopback,
// and every way a client fails to reach one, each with its own line.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../tls_certs.h"
#include "base/error.h"
#include "net/http.h"
#include "test_util.h"

namespace openshell::net {
namespace {

using namespace std::chrono_literals;
using openshell::testing::CertSpec;
using openshell::testing::make_cert;
using openshell::testing::read_file;
using openshell::testing::TempDir;
using openshell::testing::TestCert;
using openshell::testing::TestPki;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A TCP port bound and not listening, so that nothing can listen there
// while the test runs: a connection to it is refused.
class RefusedPort {
 public:
  RefusedPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
      throw std::runtime_error("bind");
    socklen_t length = sizeof address;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~RefusedPort() { ::close(fd_); }
  uint16_t port() const { return port_; }

 private:
  int fd_ = -1;
  uint16_t port_ = 0;
};

// Sends bytes to 127.0.0.1:PORT and reads until the server closes.
std::string raw_exchange(const std::string& host_port, const std::string& bytes) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port =
      htons(static_cast<uint16_t>(std::stoi(host_port.substr(host_port.rfind(':') + 1))));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    throw std::runtime_error("connect");
  }
  timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

class Tls : public ::testing::Test {
 protected:
  Tls() { pki.write(dir.path()); }
  ~Tls() override {
    server.reset();
    io.restart();
    io.poll();
  }

  TlsFiles server_files() const { return {dir / "ca.crt", dir / "server.crt", dir / "server.key"}; }

  // Serves handler over TLS on 127.0.0.1 (or the address given); the URL.
  std::string serve_tls(Server::Handler handler, const std::string& address = "127.0.0.1:0") {
    server = std::make_unique<Server>(io, std::move(handler));
    return "https://" + server->listen_tls(address, server_files());
  }

  // A handler that answers with who the peer is.
  Server::Handler whoami() {
    return [this](std::shared_ptr<Exchange> exchange) {
      seen_peer = exchange->peer();
      exchange->respond({200, "{\"subject\":\"" + exchange->peer().subject + "\"}"});
    };
  }

  // An endpoint with the test's client credentials (cert may be left out).
  Endpoint endpoint(const std::string& url, const TestCert* client = nullptr,
                    const std::string& ca_path = "") {
    Endpoint e = Endpoint::parse(url);
    e.tls.ca = ca_path.empty() ? dir / "ca.crt" : ca_path;
    if (client) {
      std::string name = "client" + std::to_string(++clients_written);
      client->write(dir / (name + ".crt"), dir / (name + ".key"));
      e.tls.cert = dir / (name + ".crt");
      e.tls.key = dir / (name + ".key");
    }
    return e;
  }

  // Runs the loop until done() or the limit; false on timeout.
  bool run_until(const std::function<bool()>& done, std::chrono::milliseconds limit = 30s) {
    auto deadline = std::chrono::steady_clock::now() + limit;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      io.restart();
      if (io.run_for(10ms) == 0) std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  // Runs a blocking client on a thread while this thread runs the loop;
  // returns what it threw ("" when nothing).
  std::string beside(const std::function<void()>& work) {
    std::atomic<bool> finished{false};
    std::string error;
    std::thread thread([&] {
      try {
        work();
      } catch (const std::exception& e) {
        error = e.what();
        if (error.empty()) error = "<empty error>";
      }
      finished = true;
    });
    bool ok = run_until([&] { return finished.load(); }, 60s);
    if (!ok) {
      server.reset();
      run_until([&] { return finished.load(); }, 5s);
    }
    thread.join();
    EXPECT_TRUE(ok) << "the client did not finish";
    return error;
  }

  // One GET with a fresh client: its answer's body, or the error's line.
  std::string get(const Endpoint& e) {
    std::string body;
    std::string error = beside([&] {
      Client client(e);
      body = client.request("GET", "/v1/whoami").body;
    });
    return error.empty() ? body : "error: " + error;
  }

  struct Connected {
    std::shared_ptr<WebSocket> ws;
    std::string error;
    bool done = false;
  };
  std::shared_ptr<Connected> connect_ws(const Endpoint& e, const std::string& target) {
    auto state = std::make_shared<Connected>();
    WebSocket::connect(io, e, target, [state](std::shared_ptr<WebSocket> ws, std::string error) {
      state->ws = std::move(ws);
      state->error = std::move(error);
      state->done = true;
    });
    EXPECT_TRUE(run_until([&] { return state->done; })) << "connect timed out";
    return state;
  }

  TempDir dir;
  TestPki pki;
  asio::io_context io;
  std::unique_ptr<Server> server;
  PeerCredentials seen_peer;
  int clients_written = 0;
};

TEST_F(Tls, RequestCarriesTheCertificatesSubjectAndAdmin) {
  std::string url = serve_tls(whoami());
  ASSERT_THAT(url, StartsWith("https://127.0.0.1:"));
  EXPECT_EQ(get(endpoint(url, &pki.client)), "{\"subject\":\"owner\"}");
  EXPECT_EQ(seen_peer.transport, PeerCredentials::Transport::kTls);
  EXPECT_EQ(seen_peer.subject, "owner");
  EXPECT_TRUE(seen_peer.admin);
  EXPECT_THAT(seen_peer.address, StartsWith("127.0.0.1:"));
  // Never read as root: a TLS peer has no uid.
  EXPECT_NE(seen_peer.uid, 0u);

  TestCert alice = pki.issue_client("alice");
  EXPECT_EQ(get(endpoint(url, &alice)), "{\"subject\":\"alice\"}");
  EXPECT_EQ(seen_peer.subject, "alice");
  EXPECT_FALSE(seen_peer.admin);
}

TEST_F(Tls, KeepAliveServesManyRequestsOnOneConnection) {
  int connections = 0;
  std::string url = serve_tls([&](std::shared_ptr<Exchange> exchange) {
    static std::string last;
    if (exchange->peer().address != last) ++connections;
    last = exchange->peer().address;
    exchange->respond({200, "{}"});
  });
  Endpoint e = endpoint(url, &pki.client);
  EXPECT_EQ(beside([&] {
              Client client(e);
              for (int i = 0; i < 20; ++i)
                if (client.request("GET", "/").status != 200) throw Error("not 200");
            }),
            "");
  EXPECT_EQ(connections, 1);
}

TEST_F(Tls, ServesIPv6) {
  server = std::make_unique<Server>(io, whoami());
  std::string bound;
  try {
    bound = server->listen_tls("[::1]:0", server_files());
  } catch (const Error& e) {
    GTEST_SKIP() << "no IPv6 loopback here: " << e.what();
  }
  ASSERT_THAT(bound, StartsWith("[::1]:"));
  EXPECT_EQ(get(endpoint("https://" + bound, &pki.client)), "{\"subject\":\"owner\"}");
  EXPECT_THAT(seen_peer.address, StartsWith("[::1]:"));
}

TEST_F(Tls, ServerCertificateFromAnotherCaIsRefused) {
  std::string url = serve_tls(whoami());
  TestPki other("another CA");
  TestCert::write_text(dir / "other-ca.crt", other.ca.cert_pem());
  EXPECT_THAT(get(endpoint(url, &pki.client, dir / "other-ca.crt")),
              StartsWith("error: the gateway's certificate at " + url +
                         " is not signed by the CA in " + (dir / "other-ca.crt") + " ("));
}

TEST_F(Tls, ServerCertificateForAnotherNameIsRefused) {
  TestCert elsewhere = make_cert({.common_name = "gw", .sans = {"DNS:elsewhere.example"}}, &pki.ca);
  elsewhere.write(dir / "server.crt", dir / "server.key");
  std::string url = serve_tls(whoami());
  EXPECT_EQ(get(endpoint(url, &pki.client)),
            "error: the gateway's certificate at " + url +
                " is not issued for 127.0.0.1 (its subject alternative names do not include it)");
}

TEST_F(Tls, ClientCertificateFromAnotherCaIsRefused) {
  std::string url = serve_tls(whoami());
  TestPki other("another CA");
  EXPECT_EQ(get(endpoint(url, &other.client)),
            "error: the gateway at " + url +
                " refused our certificate: it is not signed by a CA the gateway trusts");
}

TEST_F(Tls, ExpiredClientCertificateIsRefused) {
  std::string url = serve_tls(whoami());
  TestCert expired = pki.issue_client("alice", "", -3600, -7200);
  EXPECT_EQ(get(endpoint(url, &expired)),
            "error: the gateway at " + url + " refused our certificate: it has expired");
}

TEST_F(Tls, NoClientCertificateIsRefused) {
  std::string url = serve_tls(whoami());
  EXPECT_EQ(get(endpoint(url)),
            "error: the gateway at " + url +
                " refused the connection: it requires a client certificate and we gave none");
}

TEST_F(Tls, CertificateWithoutCommonNameIsRefused) {
  std::string url = serve_tls(whoami());
  TestCert nameless = make_cert({.common_name = ""}, &pki.ca);
  std::string body = get(endpoint(url, &nameless));
  EXPECT_THAT(body, HasSubstr("\"code\":\"no_subject\""));
}

TEST_F(Tls, NothingListening) {
  RefusedPort port;
  std::string url = "https://127.0.0.1:" + std::to_string(port.port());
  EXPECT_EQ(get(endpoint(url, &pki.client)), "error: nothing listens at " + url);
}

TEST_F(Tls, PlainHttpOnTheTlsPortIsToldToUseHttps) {
  std::string url = serve_tls(whoami());
  std::string host_port = url.substr(std::strlen("https://"));
  EXPECT_EQ(get(endpoint("http://" + host_port)), "error: the gateway at http://" + host_port +
                                                      " speaks TLS on that port: use https://" +
                                                      host_port);
  // What curl would see.
  std::string raw;
  EXPECT_EQ(beside([&] { raw = raw_exchange(host_port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); }),
            "");
  EXPECT_THAT(raw, StartsWith("HTTP/1.1 400 Bad Request\r\n"));
  EXPECT_THAT(raw, HasSubstr("{\"error\":{\"code\":\"tls_required\",\"message\":\"this port "
                             "speaks TLS: use https://" +
                             host_port + " (with a client certificate)\"}}"));
}

TEST_F(Tls, TlsToAPlainPortSaysItAnsweredPlainHttp) {
  server = std::make_unique<Server>(io, whoami());
  std::string bound = server->listen_tcp("127.0.0.1:0");
  EXPECT_EQ(get(endpoint("https://" + bound, &pki.client)),
            "error: the server at " + bound +
                " answered in plain HTTP where TLS was expected (an --insecure-listen port is "
                "reached with http://" +
                bound + ")");
}

TEST_F(Tls, PlainTcpServesLoopbackAndNamesTheAddress) {
  server = std::make_unique<Server>(io, whoami());
  std::string bound = server->listen_tcp("127.0.0.1:0");
  EXPECT_EQ(get(endpoint("http://" + bound)), "{\"subject\":\"\"}");
  EXPECT_EQ(seen_peer.transport, PeerCredentials::Transport::kTcp);
  EXPECT_THAT(seen_peer.address, StartsWith("127.0.0.1:"));
  EXPECT_NE(seen_peer.uid, 0u);
}

TEST_F(Tls, PlainTcpRefusesANonLoopbackAddress) {
  server = std::make_unique<Server>(io, whoami());
  try {
    server->listen_tcp("0.0.0.0:0");
    ADD_FAILURE() << "listened in plain TCP on every address";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "refusing to listen in plain TCP on 0.0.0.0:0: without TLS only a loopback "
                 "address (127.0.0.1, ::1) may be served");
  }
}

TEST_F(Tls, ListenNamesAMissingFile) {
  server = std::make_unique<Server>(io, whoami());
  TlsFiles files = server_files();
  files.key = dir / "missing.key";
  try {
    server->listen_tls("127.0.0.1:0", files);
    ADD_FAILURE() << "listened without a key";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), StartsWith("load the key " + files.key + ": "));
  }
}

// Connections that never finish their handshake count against the cap of
// their address, so that they cannot hold the listener for the others.
TEST_F(Tls, HandshakesUnderWayCountPerAddress) {
  ServerLimits limits;
  limits.max_connections_per_uid = 2;
  // Far past the test's own wait: a silent connection is not closed for it.
  limits.header_timeout = std::chrono::minutes(10);
  server = std::make_unique<Server>(io, whoami(), limits);
  std::string bound = server->listen_tls("127.0.0.1:0", server_files());
  const uint16_t port = static_cast<uint16_t>(std::stoi(bound.substr(bound.rfind(':') + 1)));
  auto silent = [&] {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
    return fd;
  };
  int first = silent(), second = silent();
  // The third from the same address is closed at once: its read ends.
  std::string third;
  EXPECT_EQ(beside([&] {
              int fd = silent();
              timeval timeout{30, 0};
              ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
              char byte;
              third = ::recv(fd, &byte, 1, 0) == 0 ? "closed" : "open";
              ::close(fd);
            }),
            "");
  EXPECT_EQ(third, "closed");
  ::close(first);
  ::close(second);
  // Their end frees the address's share: a client gets through again.
  std::string answer;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  do {
    answer = get(endpoint("https://" + bound, &pki.client));
  } while (answer != "{\"subject\":\"owner\"}" && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(answer, "{\"subject\":\"owner\"}");
}

TEST_F(Tls, ListenersAreListed) {
  server = std::make_unique<Server>(io, whoami());
  std::string tls = server->listen_tls("127.0.0.1:0", server_files());
  std::string tcp = server->listen_tcp("127.0.0.1:0");
  auto listeners = server->listeners();
  ASSERT_EQ(listeners.size(), 2u);
  EXPECT_EQ(listeners[0].kind, "tls");
  EXPECT_EQ(listeners[0].address, tls);
  EXPECT_EQ(listeners[1].kind, "tcp");
  EXPECT_EQ(listeners[1].address, tcp);
}

// A WebSocket over TLS, upgraded in place or handed over as the exec relay
// is (release() gives a socketpair's end; the pump carries both ways).
class TlsWebSocket : public Tls {
 protected:
  void serve_echo() {
    url = serve_tls([this](std::shared_ptr<Exchange> exchange) {
      std::shared_ptr<WebSocket> ws;
      if (exchange->request().path == "/v1/handover") {
        int fd = exchange->release();
        std::string error;
        ws = WebSocket::accept_handed_over(io, fd, exchange->request().raw, &error);
        if (!ws) {
          handover_error = error;
          return;
        }
      } else {
        ws = exchange->upgrade();
      }
      server_ws = ws;
      ws->start([ws](std::string data, bool binary) { ws->send("echo " + data, binary); },
                [this](const std::string& reason) { server_closed = reason; });
    });
  }

  void echo_through(const std::string& target) {
    auto state = connect_ws(endpoint(url, &pki.client), target);
    ASSERT_TRUE(state->ws) << state->error;
    std::vector<std::string> got;
    std::string client_closed;
    state->ws->start([&](std::string data, bool) { got.push_back(data); },
                     [&](const std::string& reason) { client_closed = reason; });
    std::string big(3u << 20, 'x');
    state->ws->send("one", false);
    state->ws->send(big, true);
    state->ws->send("two", false);
    ASSERT_TRUE(run_until([&] { return got.size() == 3; }));
    EXPECT_EQ(got[0], "echo one");
    EXPECT_EQ(got[1], "echo " + big);
    EXPECT_EQ(got[2], "echo two");
    EXPECT_EQ(state->ws->peer().transport, PeerCredentials::Transport::kTls);
    state->ws->close("bye");
    ASSERT_TRUE(run_until([&] { return !client_closed.empty() && !server_closed.empty(); }));
    EXPECT_EQ(client_closed, "bye");
    EXPECT_EQ(server_closed, "bye");
  }

  std::string url;
  std::shared_ptr<WebSocket> server_ws;
  std::string server_closed;
  std::string handover_error;
};

TEST_F(TlsWebSocket, UpgradeEchoesBothWays) {
  serve_echo();
  echo_through("/v1/echo");
}

TEST_F(TlsWebSocket, ReleasedConnectionIsPumpedBothWays) {
  serve_echo();
  echo_through("/v1/handover");
  EXPECT_EQ(handover_error, "");
}

TEST_F(TlsWebSocket, RefusedCertificateIsTheConnectError) {
  serve_echo();
  TestPki other("another CA");
  auto state = connect_ws(endpoint(url, &other.client), "/v1/echo");
  EXPECT_FALSE(state->ws);
  EXPECT_EQ(state->error, "the gateway at " + url +
                              " refused our certificate: it is not signed by a CA the gateway "
                              "trusts");
}

TEST_F(TlsWebSocket, NothingListening) {
  RefusedPort port;
  std::string refused = "https://127.0.0.1:" + std::to_string(port.port());
  auto state = connect_ws(endpoint(refused, &pki.client), "/v1/echo");
  EXPECT_FALSE(state->ws);
  EXPECT_EQ(state->error, "nothing listens at " + refused);
}

// The server's log goes to stderr: a test that waits for a line of it
// points stderr at a file for a while.
class CapturedStderr {
 public:
  explicit CapturedStderr(const std::string& path) : path_(path) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    ::dup2(fd, 2);
    ::close(fd);
  }
  ~CapturedStderr() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
  }
  std::string text() const { return read_file(path_); }

 private:
  std::string path_;
  int saved_ = -1;
};

TEST_F(Tls, ChangedCertificatesServeNewConnectionsWithoutARestart) {
  std::string url = serve_tls(whoami());
  ASSERT_EQ(get(endpoint(url, &pki.client)), "{\"subject\":\"owner\"}");

  // A rotation to a new CA: its files replace the old ones.
  TestPki rotated("rotated CA");
  rotated.write(dir.path());
  TestCert::write_text(dir / "old-ca.crt", pki.ca.cert_pem());
  TestCert::write_text(dir / "new-ca.crt", rotated.ca.cert_pem());
  // The server looks at most once a second: poll until it has.
  std::string answer;
  auto deadline = std::chrono::steady_clock::now() + 30s;
  do {
    answer = get(endpoint(url, &rotated.client, dir / "new-ca.crt"));
    if (answer != "{\"subject\":\"owner\"}") std::this_thread::sleep_for(50ms);  // between polls
  } while (answer != "{\"subject\":\"owner\"}" && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(answer, "{\"subject\":\"owner\"}");
  // The old CA's client is no longer trusted, and the old CA does not sign the new server.
  EXPECT_EQ(get(endpoint(url, &pki.client, dir / "new-ca.crt")),
            "error: the gateway at " + url +
                " refused our certificate: it is not signed by a CA the gateway trusts");
  EXPECT_THAT(get(endpoint(url, &rotated.client, dir / "old-ca.crt")),
              StartsWith("error: the gateway's certificate at " + url + " is not signed by"));
}

TEST_F(Tls, ABrokenNewSetKeepsTheOldOne) {
  std::string url = serve_tls(whoami());
  ASSERT_EQ(get(endpoint(url, &pki.client)), "{\"subject\":\"owner\"}");
  std::string log;
  {
    CapturedStderr captured(dir / "stderr");
    TestCert::write_text(dir / "server.key", "not a key\n");
    auto deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      // Each connection makes the server look (at most once a second).
      ASSERT_EQ(get(endpoint(url, &pki.client)), "{\"subject\":\"owner\"}");
      log = captured.text();
      if (log.find("do not load") != std::string::npos) break;
    }
  }
  EXPECT_THAT(log, HasSubstr("API: the changed TLS files do not load, still serving the previous "
                             "ones: load the key " +
                             (dir / "server.key")));
  // Said once, not at every look.
  EXPECT_EQ(log.find("do not load"), log.rfind("do not load"));
  EXPECT_EQ(get(endpoint(url, &pki.client)), "{\"subject\":\"owner\"}");
}

}  // namespace
}  // namespace openshell::net
