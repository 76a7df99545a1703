// The egress proxy at layer 7, driven in this process over loopback: a
// client that CONNECTs through the proxy and speaks TLS trusting the
// sandbox's CA, and an HTTPS server of the test's own (its CA written to a
// temporary ca_file) that records what reaches it. Each request is judged
// by its endpoint's HTTP rules; refusals are JSON; smuggling attempts get
// 400 and reach nothing; credentials are filled in for their endpoint only;
// the audit has one line per request and never a secret or a query value.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/address.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "egress/credentials.h"
#include "egress/http_rules.h"
#include "egress/proxy.h"
#include "egress/rules.h"
#include "egress/tls.h"
#include "policy/policy.h"
#include "proxy_harness.h"
#include "supervisor/network_rules.h"
#include "test_util.h"

namespace openshell::egress {
namespace {

using nlohmann::json;
using openshell::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;
namespace asio = boost::asio;

struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
using Ssl = std::unique_ptr<SSL, SslFree>;

constexpr const char* kPlaceholder = "openshell:resolve:env:API_TOKEN";
constexpr const char* kSecret = "s3cret-first-4711";
constexpr const char* kRotated = "s3cret-second-0815";

// ---- sockets ---------------------------------------------------------------------

using testing::loopback_listener;

// A blocking read gives up after `seconds`, so that a proxy that never
// answers fails the test instead of hanging it.
void read_timeout(int fd, int seconds) {
  timeval tv{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

UniqueFd connect_to(uint16_t port) {
  UniqueFd fd = testing::connect_loopback(port);
  read_timeout(fd.get(), 10);
  return fd;
}

// A literal's bytes, NULs included, without its terminating one.
template <size_t N>
std::string bytes_of(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The values of a field in a message head, in order (names compared in any case).
std::vector<std::string> fields(const std::string& head, const std::string& name) {
  std::vector<std::string> out;
  size_t at = head.find("\r\n");
  while (at != std::string::npos && at + 2 < head.size()) {
    const size_t start = at + 2;
    const size_t end = head.find("\r\n", start);
    if (end == std::string::npos || end == start) break;
    const std::string line = head.substr(start, end - start);
    const size_t colon = line.find(':');
    if (colon != std::string::npos && lower(line.substr(0, colon)) == lower(name)) {
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      out.push_back(line.substr(v));
    }
    at = end;
  }
  return out;
}
std::string field(const std::string& head, const std::string& name) {
  auto all = fields(head, name);
  return all.empty() ? "" : all.front();
}

// ---- a byte stream, in TLS or not ---------------------------------------------------

class Stream {
 public:
  explicit Stream(UniqueFd fd) : fd_(std::move(fd)) {}
  int fd() const { return fd_.get(); }
  SSL* ssl() const { return ssl_.get(); }

  // Client side: verifies the peer for the address 127.0.0.1, sends `sni`
  // when not empty, offers `alpn` (wire form) when not empty.
  bool start_client(SSL_CTX* ctx, const std::string& sni, const std::string& alpn,
                    std::string* error) {
    ssl_.reset(SSL_new(ctx));
    SSL_set_fd(ssl_.get(), fd_.get());
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl_.get()), "127.0.0.1");
    if (!sni.empty()) SSL_set_tlsext_host_name(ssl_.get(), sni.c_str());
    if (!alpn.empty())
      SSL_set_alpn_protos(ssl_.get(), reinterpret_cast<const unsigned char*>(alpn.data()),
                          static_cast<unsigned>(alpn.size()));
    if (SSL_connect(ssl_.get()) == 1) return true;
    char text[256] = "";
    ERR_error_string_n(ERR_get_error(), text, sizeof text);
    *error = std::string("TLS handshake with the proxy failed: ") + text +
             " (verify: " + X509_verify_cert_error_string(SSL_get_verify_result(ssl_.get())) + ")";
    ERR_clear_error();
    return false;
  }
  bool start_server(SSL_CTX* ctx) {
    ssl_.reset(SSL_new(ctx));
    SSL_set_fd(ssl_.get(), fd_.get());
    const bool ok = SSL_accept(ssl_.get()) == 1;
    ERR_clear_error();
    return ok;
  }

  bool write(const std::string& bytes) {
    size_t done = 0;
    while (done < bytes.size()) {
      int n =
          ssl_ ? SSL_write(ssl_.get(), bytes.data() + done, static_cast<int>(bytes.size() - done))
               : static_cast<int>(
                     ::send(fd_.get(), bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL));
      if (n <= 0) {
        ERR_clear_error();
        return false;
      }
      done += static_cast<size_t>(n);
    }
    return true;
  }

  // More bytes into the buffer; false at the end, on an error or a timeout.
  bool fill() {
    char buf[16384];
    int n = ssl_ ? SSL_read(ssl_.get(), buf, sizeof buf)
                 : static_cast<int>(::read(fd_.get(), buf, sizeof buf));
    if (n <= 0) {
      ERR_clear_error();
      return false;
    }
    buffer_.append(buf, static_cast<size_t>(n));
    return true;
  }

  // A message head, up to and including its empty line.
  std::optional<std::string> read_head() {
    for (;;) {
      const size_t end = buffer_.find("\r\n\r\n");
      if (end != std::string::npos) {
        std::string head = buffer_.substr(0, end + 4);
        buffer_.erase(0, end + 4);
        return head;
      }
      if (!fill()) return std::nullopt;
    }
  }
  bool read_exact(size_t n, std::string* out) {
    while (buffer_.size() < n)
      if (!fill()) return false;
    *out = buffer_.substr(0, n);
    buffer_.erase(0, n);
    return true;
  }
  // Up to the end of the stream.
  std::string read_all() {
    while (fill()) {
    }
    std::string out = std::move(buffer_);
    buffer_.clear();
    return out;
  }
  // Whatever arrives within `ms` (at least one read's worth, when any).
  std::string read_some(int ms) {
    if (buffer_.empty() && !(ssl_ && SSL_pending(ssl_.get()) > 0)) {
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, ms) != 1) return "";
      fill();
    }
    std::string out = std::move(buffer_);
    buffer_.clear();
    return out;
  }
  // Whether the peer closed (or reset) the connection within `ms`; bytes
  // that arrive instead stay in the buffer.
  bool closed_within(int ms) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    for (;;) {
      const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                            deadline - std::chrono::steady_clock::now())
                                            .count());
      if (left <= 0) return false;
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, left) != 1) return false;
      if (!fill()) return true;
    }
  }
  void shutdown() { ::shutdown(fd_.get(), SHUT_RDWR); }

 private:
  UniqueFd fd_;
  Ssl ssl_;
  std::string buffer_;
};

std::string alpn_of(SSL* ssl) {
  const unsigned char* data = nullptr;
  unsigned int len = 0;
  SSL_get0_alpn_selected(ssl, &data, &len);
  return data ? std::string(reinterpret_cast<const char*>(data), len) : std::string();
}

// ---- HTTP messages ------------------------------------------------------------------

struct Response {
  int status = 0;
  std::string head;
  std::string body;
  std::string error;  // why there is none
  json body_json() const {
    json j = json::parse(body, nullptr, false);
    return j.is_discarded() ? json() : j;
  }
};

bool read_chunked(Stream& s, std::string* body) {
  for (;;) {
    std::string line;
    // A chunk-size line.
    for (;;) {
      std::string c;
      if (!s.read_exact(1, &c)) return false;
      line += c;
      if (line.ends_with("\r\n")) break;
    }
    const size_t size = std::stoul(line, nullptr, 16);
    if (size == 0) {
      std::string end;
      return s.read_exact(2, &end);  // no trailers in these tests
    }
    std::string data, crlf;
    if (!s.read_exact(size, &data) || !s.read_exact(2, &crlf)) return false;
    *body += data;
  }
}

Response read_response(Stream& s) {
  Response r;
  auto head = s.read_head();
  if (!head) {
    r.error = "no response: the connection closed or nothing came within 10 s";
    return r;
  }
  r.head = *head;
  if (!r.head.starts_with("HTTP/1.1 ") || r.head.size() < 12) {
    r.error = "not a response: " + r.head;
    return r;
  }
  r.status = std::stoi(r.head.substr(9, 3));
  if (r.status == 101 || r.status == 204 || r.status == 304) return r;
  const std::string length = field(r.head, "Content-Length");
  if (!length.empty()) {
    if (!s.read_exact(std::stoul(length), &r.body)) r.error = "the body ended early";
  } else if (lower(field(r.head, "Transfer-Encoding")) == "chunked") {
    if (!read_chunked(s, &r.body)) r.error = "the chunked body ended early";
  } else {
    r.body = s.read_all();
  }
  return r;
}

std::string describe(const Response& r) { return r.error.empty() ? r.head + r.body : r.error; }

// A request to 127.0.0.1:port in origin form.
std::string request(const std::string& method, const std::string& target, uint16_t port,
                    const std::string& more_fields = "", const std::string& body = "") {
  std::string out = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                    "\r\n" + more_fields;
  if (!body.empty() || method == "POST" || method == "PUT")
    out += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  return out + "\r\n" + body;
}

// ---- the upstream server ------------------------------------------------------------

// A server on 127.0.0.1, in TLS with `ctx` (or in the clear without one).
// kHttp: answers each request, kept alive, with 200 and "served METHOD
// TARGET", or an upgrade request with 101 and then echoes every chunk of
// bytes back as "echo:BYTES". kEcho: echoes bytes from the start.
class Upstream {
 public:
  enum class Mode { kHttp, kEcho };
  explicit Upstream(std::shared_ptr<SSL_CTX> ctx, Mode mode = Mode::kHttp)
      : ctx_(std::move(ctx)), mode_(mode) {
    listener_ = loopback_listener(&port_);
    accepter_ = std::thread([this] { accept_loop(); });
  }
  ~Upstream() {
    stop_ = true;
    accepter_.join();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (Stream* s : open_) s->shutdown();
    }
    for (auto& t : threads_) t.join();
  }
  Upstream(const Upstream&) = delete;
  Upstream& operator=(const Upstream&) = delete;

  uint16_t port() const { return port_; }
  // Each request as it arrived (head and body).
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }
  // Every byte received in kEcho mode or after an upgrade.
  std::string relayed() {
    std::lock_guard<std::mutex> lock(mutex_);
    return relayed_;
  }
  int connections() const { return connections_; }
  // Waits up to `ms` for `n` requests.
  std::vector<std::string> wait_requests(size_t n, int ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return requests_.size() >= n; });
    return requests_;
  }

 private:
  void accept_loop() {
    while (!stop_) {
      pollfd p{listener_.get(), POLLIN, 0};
      if (::poll(&p, 1, 20) != 1) continue;
      UniqueFd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!fd) continue;
      ++connections_;
      read_timeout(fd.get(), 30);
      auto stream = std::make_shared<Stream>(std::move(fd));
      {
        std::lock_guard<std::mutex> lock(mutex_);
        open_.push_back(stream.get());
      }
      threads_.emplace_back([this, stream] {
        serve(*stream);
        std::lock_guard<std::mutex> lock(mutex_);
        open_.erase(std::find(open_.begin(), open_.end(), stream.get()));
      });
    }
  }

  void echo(Stream& s) {
    for (;;) {
      std::string bytes = s.read_some(30000);
      if (bytes.empty()) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        relayed_ += bytes;
      }
      if (!s.write("echo:" + bytes)) return;
    }
  }

  void serve(Stream& s) {
    if (ctx_ && !s.start_server(ctx_.get())) return;
    if (mode_ == Mode::kEcho) return echo(s);
    for (;;) {
      auto head = s.read_head();
      if (!head) return;
      std::string body;
      const std::string length = field(*head, "Content-Length");
      if (!length.empty()) {
        if (!s.read_exact(std::stoul(length), &body)) return;
      } else if (lower(field(*head, "Transfer-Encoding")).find("chunked") != std::string::npos) {
        // Kept as it came: the chunks up to the last one.
        while (body.find("0\r\n\r\n") == std::string::npos) {
          std::string c;
          if (!s.read_exact(1, &c)) return;
          body += c;
        }
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        requests_.push_back(*head + body);
      }
      changed_.notify_all();
      const std::string line = head->substr(0, head->find("\r\n"));
      const std::string method = line.substr(0, line.find(' '));
      const std::string target =
          line.substr(line.find(' ') + 1, line.rfind(' ') - line.find(' ') - 1);
      if (!field(*head, "Upgrade").empty()) {
        if (!s.write("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: "
                     "Upgrade\r\nSec-WebSocket-Accept: dGVzdA==\r\n\r\n"))
          return;
        return echo(s);
      }
      const std::string answer = "served " + method + " " + target;
      if (!s.write("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: " +
                   std::to_string(answer.size()) + "\r\n\r\n" + answer))
        return;
      if (lower(field(*head, "Connection")) == "close") return;
    }
  }

  std::shared_ptr<SSL_CTX> ctx_;
  Mode mode_;
  UniqueFd listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<int> connections_{0};
  std::thread accepter_;
  std::vector<std::thread> threads_;  // touched by the accepter, then by the destructor
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<Stream*> open_;
  std::vector<std::string> requests_;
  std::string relayed_;
};

// ---- the proxy ----------------------------------------------------------------------

Proxy::Options inspecting_options(tls::SandboxCa* ca) {
  Proxy::Options options;
  options.sandbox = "unit";
  options.init_pid = ::getpid();
  options.max_connections = 64;
  options.ca = ca;
  return options;
}

class ProxyHarness : public testing::ProxyHarness {
 public:
  explicit ProxyHarness(tls::SandboxCa* ca) : testing::ProxyHarness(inspecting_options(ca)) {}
  // The audit's lines of this kind ("" for all), parsed.
  std::vector<json> lines(const std::string& kind = "") {
    std::vector<json> out;
    std::string all = audit();
    size_t at = 0;
    while (at < all.size()) {
      size_t end = all.find('\n', at);
      json j = json::parse(all.substr(at, end - at), nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << "an audit line is not JSON: " << all.substr(at, end - at);
      if (!j.is_discarded() && (kind.empty() || j.value("kind", "") == kind)) out.push_back(j);
      at = end + 1;
    }
    return out;
  }
  // Waits up to 5 s for `n` lines of kind "request".
  std::vector<json> request_lines(size_t n) {
    for (int i = 0; i < 500; ++i) {
      auto got = lines("request");
      if (got.size() >= n) return got;
      ::usleep(10000);
    }
    return lines("request");
  }
  void set_rules(std::shared_ptr<const NetworkRules> rules, int64_t revision) {
    on_thread([&] { proxy().set_rules(std::move(rules), revision); });
  }
  void set_credentials(std::vector<Credential> credentials) {
    on_thread([&] { proxy().set_credentials(std::move(credentials)); });
  }
};

// ---- rules --------------------------------------------------------------------------

constexpr const char* kPolicy = "inspected";

struct EndpointSpec {
  uint16_t port = 0;
  std::shared_ptr<const Inspection> inspect;  // null: layer 4
};

std::shared_ptr<const NetworkRules> rules_for(const std::vector<EndpointSpec>& endpoints) {
  NetworkRules::Rule rule;
  rule.name = kPolicy;
  for (const auto& e : endpoints) {
    NetworkRules::Endpoint endpoint;
    endpoint.host = "127.0.0.1";
    endpoint.ports = {e.port};
    endpoint.allowed_ips = {*Cidr::parse("127.0.0.1/32")};
    endpoint.inspect = e.inspect;
    rule.endpoints.push_back(std::move(endpoint));
  }
  return std::make_shared<NetworkRules>(std::vector<NetworkRules::Rule>{rule});
}

HttpRules::Spec preset(const std::string& access) {
  HttpRules::Spec spec;
  spec.access = access;
  return spec;
}

// ---- the fixture --------------------------------------------------------------------

class Inspect : public ::testing::Test {
 protected:
  Inspect() : upstream_ca_("upstream-test"), sandbox_ca_("unit") {
    // OpenSSL writes with write(2): a peer that closed first (as the proxy
    // does after a refusal) must fail the write, not kill the test process.
    old_sigpipe_ = ::signal(SIGPIPE, SIG_IGN);
    ca_file_ = dir_.path() + "/upstream-ca.pem";
    files::write_atomically(ca_file_, upstream_ca_.cert_pem(), 0644);
    client_ctx_.reset(SSL_CTX_new(TLS_client_method()));
    X509_STORE_add_cert(SSL_CTX_get_cert_store(client_ctx_.get()), sandbox_ca_.cert());
    SSL_CTX_set_verify(client_ctx_.get(), SSL_VERIFY_PEER, nullptr);
  }

  std::shared_ptr<const Inspection> inspection(HttpRules::Spec spec,
                                               const std::string& protocol = "rest") {
    auto i = std::make_shared<Inspection>();
    i->policy = kPolicy;
    i->protocol = protocol;
    i->rules = HttpRules(spec);
    i->ca_file = ca_file_;
    return i;
  }

  // An HTTPS server whose certificate the endpoint's ca_file vouches for,
  // for 127.0.0.1.
  std::unique_ptr<Upstream> https_server() {
    return std::make_unique<Upstream>(upstream_ca_.leaf_for("127.0.0.1"));
  }

  // CONNECT 127.0.0.1:port through the proxy; the reply in *reply.
  UniqueFd tunnel(ProxyHarness& h, uint16_t port, std::string* reply) {
    UniqueFd fd = connect_to(h.port());
    const std::string connect = "CONNECT 127.0.0.1:" + std::to_string(port) +
                                " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) + "\r\n\r\n";
    EXPECT_EQ(::send(fd.get(), connect.data(), connect.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(connect.size()));
    // Byte by byte, so that nothing after the reply's head is taken from
    // the stream the TLS handshake reads next.
    reply->clear();
    char c;
    while (!reply->ends_with("\r\n\r\n") && ::read(fd.get(), &c, 1) == 1) *reply += c;
    return fd;
  }

  // A TLS connection to 127.0.0.1:port through the proxy, or null and *error.
  std::unique_ptr<Stream> open(ProxyHarness& h, uint16_t port, std::string* error,
                               const std::string& alpn = bytes_of("\x08http/1.1"),
                               const std::string& sni = "") {
    std::string reply;
    UniqueFd fd = tunnel(h, port, &reply);
    if (!reply.starts_with("HTTP/1.1 200 ")) {
      *error = "CONNECT was answered: " + reply;
      return nullptr;
    }
    auto s = std::make_unique<Stream>(std::move(fd));
    if (!s->start_client(client_ctx_.get(), sni, alpn, error)) return nullptr;
    return s;
  }

  // One request on a new connection.
  Response once(ProxyHarness& h, uint16_t port, const std::string& bytes) {
    std::string error;
    auto s = open(h, port, &error);
    if (!s) {
      Response r;
      r.error = error;
      return r;
    }
    if (!s->write(bytes)) {
      Response r;
      r.error = "the request could not be written";
      return r;
    }
    return read_response(*s);
  }

  // A 403 of the policy, as the contract writes it.
  void expect_denied(const Response& r, const std::string& rule, const std::string& method,
                     const std::string& path, uint16_t port) {
    ASSERT_EQ(r.status, 403) << describe(r);
    EXPECT_THAT(r.head, StartsWith("HTTP/1.1 403 Forbidden\r\n"));
    EXPECT_EQ(field(r.head, "Content-Type"), "application/json") << r.head;
    json body = r.body_json();
    ASSERT_TRUE(body.is_object()) << "the 403's body is not JSON: " << r.body;
    EXPECT_EQ(body.value("error", ""), "policy_denied") << r.body;
    EXPECT_EQ(body.value("rule", ""), rule) << r.body;
    EXPECT_EQ(body.value("method", ""), method) << r.body;
    EXPECT_EQ(body.value("path", ""), path) << r.body;
    EXPECT_EQ(body.value("host", ""), "127.0.0.1") << r.body;
    EXPECT_EQ(body.value("port", 0), port) << r.body;
    EXPECT_FALSE(body.value("reason", "").empty()) << r.body;
    EXPECT_EQ(body.value("hint", ""), "openshell policy update unit --add-allow 127.0.0.1:" +
                                          std::to_string(port) + ":" + method + ":" + path)
        << r.body;
  }

  void expect_malformed(const Response& r, const std::string& what) {
    ASSERT_EQ(r.status, 400) << what << ": " << describe(r);
    EXPECT_THAT(r.head, StartsWith("HTTP/1.1 400 Bad Request\r\n")) << what;
    EXPECT_EQ(field(r.head, "Content-Type"), "application/json") << what << ": " << r.head;
    json body = r.body_json();
    ASSERT_TRUE(body.is_object()) << what << ": the 400's body is not JSON: " << r.body;
    EXPECT_EQ(body.value("error", ""), "malformed_request") << what << ": " << r.body;
    EXPECT_FALSE(body.value("reason", "").empty()) << what << ": " << r.body;
  }

  ~Inspect() override { ::signal(SIGPIPE, old_sigpipe_); }

  sighandler_t old_sigpipe_ = SIG_DFL;
  TempDir dir_;
  tls::SandboxCa upstream_ca_;  // the test server's CA, in ca_file_
  tls::SandboxCa sandbox_ca_;   // the proxy's: the client trusts it
  std::string ca_file_;
  std::unique_ptr<SSL_CTX, tls::SslCtxFree> client_ctx_;
};

// ---- the rules judge each request ---------------------------------------------------

TEST_F(Inspect, ReadOnlyAllowsGetAndRefusesPostWithTheJsonBodyAndThePostNeverArrives) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("read-only"))}}), 1);

  Response get = once(h, server->port(), request("GET", "/items/1", server->port()));
  ASSERT_EQ(get.status, 200) << describe(get);
  EXPECT_EQ(get.body, "served GET /items/1");

  std::string error;
  auto s = open(h, server->port(), &error);
  ASSERT_TRUE(s) << error;
  ASSERT_TRUE(s->write(request("POST", "/items", server->port(), "", "{\"a\":1}")));
  Response post = read_response(*s);
  expect_denied(post, "inspected: access read-only", "POST", "/items", server->port());
  EXPECT_TRUE(s->closed_within(5000)) << "the connection stayed open after the 403";

  ::usleep(200000);
  auto seen = server->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_THAT(seen[0], StartsWith("GET /items/1 HTTP/1.1\r\n"));
}

TEST_F(Inspect, ThePolicyTextBuildsTheInspectionToo) {
  // supervisor::network_rules() turns protocol = "rest" into an Inspection.
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  const std::string port = std::to_string(server->port());
  auto rules = std::make_shared<NetworkRules>(supervisor::network_rules(policy::parse(
      "version = 1\n[network_policies.api]\nendpoints = [ { host = \"127.0.0.1\", port = " + port +
          ", allowed_ips = [\"127.0.0.1/32\"], protocol = \"rest\", access = \"read-only\", "
          "ca_file = \"" +
          ca_file_ + "\" } ]\n",
      "test.toml")));
  h.set_rules(rules, 1);
  Response get = once(h, server->port(), request("GET", "/", server->port()));
  EXPECT_EQ(get.status, 200) << describe(get);
  Response del = once(h, server->port(), request("DELETE", "/x", server->port()));
  expect_denied(del, "api: access read-only", "DELETE", "/x", server->port());
}

TEST_F(Inspect, PathGlobs) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  HttpRules::Spec spec;
  spec.rules = {{"GET", "/repos/*/issues", {}}, {"GET", "/api/**", {}}};
  h.set_rules(rules_for({{server->port(), inspection(spec)}}), 1);
  struct Case {
    std::string target;
    bool allowed;
  };
  for (const Case& c : {Case{"/repos/octo/issues", true}, Case{"/repos/octo/x/issues", false},
                        Case{"/repos//issues", false}, Case{"/api", true}, Case{"/api/a/b/c", true},
                        Case{"/apiary", false}, Case{"/other", false}}) {
    Response r = once(h, server->port(), request("GET", c.target, server->port()));
    if (c.allowed) {
      EXPECT_EQ(r.status, 200) << c.target << ": " << describe(r);
      EXPECT_EQ(r.body, "served GET " + c.target);
    } else {
      // "//" is malformed (400) rather than denied; the others are 403.
      EXPECT_TRUE(r.status == 403 || (c.target == "/repos//issues" && r.status == 400))
          << c.target << ": " << describe(r);
    }
  }
  ::usleep(200000);
  EXPECT_EQ(server->requests().size(), 3u);
}

TEST_F(Inspect, AQueryAllowNeedsEveryValueToMatchAndADenyNeedsOne) {
  auto allow_server = https_server();
  auto deny_server = https_server();
  ProxyHarness h(&sandbox_ca_);
  HttpRules::Spec allow;
  allow.rules = {{"GET", "/search", {{"q", {"foo*"}}}}};
  HttpRules::Spec deny;
  deny.access = "full";
  deny.deny_rules = {{"GET", "/search", {{"debug", {"true"}}}}};
  h.set_rules(rules_for({{allow_server->port(), inspection(allow)},
                         {deny_server->port(), inspection(deny)}}),
              1);
  const uint16_t a = allow_server->port(), d = deny_server->port();
  EXPECT_EQ(once(h, a, request("GET", "/search?q=foo1", a)).status, 200);
  EXPECT_EQ(once(h, a, request("GET", "/search?q=foo1&other=x", a)).status, 200);
  EXPECT_EQ(once(h, a, request("GET", "/search?q=foo1&q=bar", a)).status, 403)
      << "a second value that does not match passed";
  EXPECT_EQ(once(h, a, request("GET", "/search", a)).status, 403) << "a missing key passed";
  EXPECT_EQ(once(h, a, request("GET", "/search?q=bar", a)).status, 403);

  EXPECT_EQ(once(h, d, request("GET", "/search?debug=false", d)).status, 200);
  Response hidden = once(h, d, request("GET", "/search?debug=false&debug=true", d));
  expect_denied(hidden, "inspected: deny_rules[0]", "GET", "/search", d);
  ::usleep(200000);
  EXPECT_EQ(allow_server->requests().size(), 2u);
  EXPECT_EQ(deny_server->requests().size(), 1u);
}

TEST_F(Inspect, DenyWinsOverAccessAndOverAnAllowRule) {
  auto server = https_server();
  auto other = https_server();
  ProxyHarness h(&sandbox_ca_);
  HttpRules::Spec full = preset("full");
  full.deny_rules = {{"DELETE", "/admin/**", {}}};
  HttpRules::Spec allow_all;
  allow_all.rules = {{"*", "/admin/**", {}}};
  allow_all.deny_rules = {{"", "/admin/secrets/*", {}}};
  h.set_rules(
      rules_for({{server->port(), inspection(full)}, {other->port(), inspection(allow_all)}}), 1);
  const uint16_t p = server->port(), o = other->port();
  EXPECT_EQ(once(h, p, request("GET", "/admin/x", p)).status, 200);
  expect_denied(once(h, p, request("DELETE", "/admin/x", p)), "inspected: deny_rules[0]", "DELETE",
                "/admin/x", p);
  // A deny rule's method matches in any case.
  EXPECT_EQ(once(h, p, request("delete", "/admin/x", p)).status, 403);
  EXPECT_EQ(once(h, o, request("PUT", "/admin/users", o)).status, 200);
  expect_denied(once(h, o, request("GET", "/admin/secrets/k", o)), "inspected: deny_rules[0]",
                "GET", "/admin/secrets/k", o);
  ::usleep(200000);
  EXPECT_EQ(server->requests().size(), 1u);
  EXPECT_EQ(other->requests().size(), 1u);
}

TEST_F(Inspect, AuditModeForwardsWhatItWouldRefuseAndAuditsItAsAudit) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  HttpRules::Spec spec = preset("read-only");
  spec.audit = true;
  h.set_rules(rules_for({{server->port(), inspection(spec)}}), 1);
  Response post = once(h, server->port(), request("POST", "/items", server->port(), "", "x"));
  ASSERT_EQ(post.status, 200) << describe(post);
  EXPECT_EQ(post.body, "served POST /items");
  ASSERT_EQ(server->requests().size(), 1u);
  auto lines = h.request_lines(1);
  ASSERT_EQ(lines.size(), 1u) << h.audit();
  EXPECT_EQ(lines[0].value("decision", ""), "audit") << lines[0].dump();
  EXPECT_EQ(lines[0].value("method", ""), "POST");
  EXPECT_EQ(lines[0].value("path", ""), "/items");
  // A request the rules allow is "allow" still.
  EXPECT_EQ(once(h, server->port(), request("GET", "/items", server->port())).status, 200);
  lines = h.request_lines(2);
  ASSERT_EQ(lines.size(), 2u) << h.audit();
  EXPECT_EQ(lines[1].value("decision", ""), "allow") << lines[1].dump();
}

TEST_F(Inspect, PlainHttpProxyRequestsAreJudgedToo) {
  auto server = std::make_unique<Upstream>(nullptr);  // in the clear
  ProxyHarness h(nullptr);                            // and no CA: judged all the same
  h.set_rules(rules_for({{server->port(), inspection(preset("read-only"))}}), 1);
  const std::string base = "http://127.0.0.1:" + std::to_string(server->port());
  auto plain = [&](const std::string& method, const std::string& path) {
    Stream s(connect_to(h.port()));
    std::string req = method + " " + base + path +
                      " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(server->port()) + "\r\n";
    if (method == "POST") req += "Content-Length: 0\r\n";
    EXPECT_TRUE(s.write(req + "\r\n"));
    return read_response(s);
  };
  Response get = plain("GET", "/a");
  EXPECT_EQ(get.status, 200) << describe(get);
  expect_denied(plain("POST", "/a"), "inspected: access read-only", "POST", "/a", server->port());
  ::usleep(200000);
  EXPECT_EQ(server->requests().size(), 1u);
}

TEST_F(Inspect, WithoutACaAConnectToALayer7EndpointIsRefused) {
  auto server = https_server();
  ProxyHarness h(nullptr);
  h.set_rules(rules_for({{server->port(), inspection(preset("full"))}}), 1);
  std::string reply;
  UniqueFd fd = tunnel(h, server->port(), &reply);
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 403 Forbidden\r\n"));
  EXPECT_THAT(h.audit(), HasSubstr("\"decision\":\"deny\""));
  EXPECT_THAT(h.audit(), HasSubstr("CA"));
  EXPECT_EQ(server->connections(), 0);
}

// ---- one connection, many requests --------------------------------------------------

TEST_F(Inspect, KeptAliveEachRequestIsJudgedAndAnswered) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  HttpRules::Spec spec;
  spec.rules = {{"GET", "/ok/*", {}}};
  h.set_rules(rules_for({{server->port(), inspection(spec)}}), 1);
  std::string error;
  auto s = open(h, server->port(), &error);
  ASSERT_TRUE(s) << error;
  for (const std::string target : {"/ok/1", "/ok/2", "/ok/3"}) {
    ASSERT_TRUE(s->write(request("GET", target, server->port())));
    Response r = read_response(*s);
    ASSERT_EQ(r.status, 200) << target << ": " << describe(r);
    EXPECT_EQ(r.body, "served GET " + target);
    EXPECT_NE(lower(field(r.head, "Connection")), "close") << r.head;
  }
  // And the fourth, refused, on the same connection.
  ASSERT_TRUE(s->write(request("GET", "/not-ok", server->port())));
  expect_denied(read_response(*s), "inspected: rules", "GET", "/not-ok", server->port());
  EXPECT_TRUE(s->closed_within(5000));
  auto lines = h.request_lines(4);
  ASSERT_EQ(lines.size(), 4u) << h.audit();
  EXPECT_EQ(lines[2].value("path", ""), "/ok/3");
  EXPECT_EQ(lines[3].value("decision", ""), "deny");
  EXPECT_EQ(server->requests().size(), 3u);
}

TEST_F(Inspect, TwoRequestsInOneWriteAreEachJudged) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("read-only"))}}), 1);
  std::string error;
  auto s = open(h, server->port(), &error);
  ASSERT_TRUE(s) << error;
  ASSERT_TRUE(s->write(request("GET", "/first", server->port()) +
                       request("POST", "/second", server->port(), "", "smuggled")));
  Response first = read_response(*s);
  ASSERT_EQ(first.status, 200) << describe(first);
  EXPECT_EQ(first.body, "served GET /first");
  expect_denied(read_response(*s), "inspected: access read-only", "POST", "/second",
                server->port());
  ::usleep(200000);
  auto seen = server->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_THAT(seen[0], Not(HasSubstr("smuggled")));
  EXPECT_THAT(seen[0], Not(HasSubstr("POST")));
}

TEST_F(Inspect, ARulesChangeAppliesToTheNextRequestOnAnOpenConnection) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("full"))}}), 1);
  std::string error;
  auto s = open(h, server->port(), &error);
  ASSERT_TRUE(s) << error;
  ASSERT_TRUE(s->write(request("GET", "/a", server->port())));
  ASSERT_EQ(read_response(*s).status, 200);
  HttpRules::Spec narrower = preset("full");
  narrower.deny_rules = {{"GET", "/a", {}}};
  h.set_rules(rules_for({{server->port(), inspection(narrower)}}), 2);
  ASSERT_TRUE(s->write(request("GET", "/a", server->port())));
  expect_denied(read_response(*s), "inspected: deny_rules[0]", "GET", "/a", server->port());
  ::usleep(200000);
  EXPECT_EQ(server->requests().size(), 1u);
}

// ---- smuggling ----------------------------------------------------------------------

TEST_F(Inspect, AmbiguousRequestsGet400AndReachNothing) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("full"))}}), 1);
  const std::string host = "Host: 127.0.0.1:" + std::to_string(server->port()) + "\r\n";
  struct Case {
    std::string what;
    std::string bytes;
  };
  const std::vector<Case> cases = {
      {"Content-Length and Transfer-Encoding",
       "POST /x HTTP/1.1\r\n" + host +
           "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"},
      {"Transfer-Encoding gzip, chunked",
       "POST /x HTTP/1.1\r\n" + host + "Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n"},
      {"two different Content-Lengths",
       "POST /x HTTP/1.1\r\n" + host + "Content-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"},
      {"a Host naming another host",
       "GET /x HTTP/1.1\r\nHost: evil.example:" + std::to_string(server->port()) + "\r\n\r\n"},
      {"a Host naming another port", "GET /x HTTP/1.1\r\nHost: 127.0.0.1:1\r\n\r\n"},
      {"an absolute-form target for another host",
       "GET http://evil.example/x HTTP/1.1\r\n" + host + "\r\n"},
      {"no Host", "GET /x HTTP/1.1\r\n\r\n"},
      {"two Hosts", "GET /x HTTP/1.1\r\n" + host + host + "\r\n"},
  };
  for (const Case& c : cases) {
    std::string error;
    auto s = open(h, server->port(), &error);
    ASSERT_TRUE(s) << c.what << ": " << error;
    ASSERT_TRUE(s->write(c.bytes)) << c.what;
    expect_malformed(read_response(*s), c.what);
    EXPECT_TRUE(s->closed_within(5000)) << c.what << ": the connection stayed open";
  }
  ::usleep(200000);
  EXPECT_EQ(server->requests().size(), 0u) << server->requests().front();
}

// ---- credentials --------------------------------------------------------------------

TEST_F(Inspect, APlaceholderIsFilledInForItsEndpointAndRefusedForAnother) {
  auto own = https_server();
  auto other = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{own->port(), inspection(preset("full"))},
                         {other->port(), inspection(preset("full"))}}),
              1);
  h.set_credentials(std::vector<Credential>{
      {"API_TOKEN", kSecret, {"127.0.0.1:" + std::to_string(own->port())}, false, false}});
  const std::string bearer = std::string("Authorization: Bearer ") + kPlaceholder + "\r\n";

  Response ok = once(h, own->port(), request("GET", "/me", own->port(), bearer));
  ASSERT_EQ(ok.status, 200) << describe(ok);
  auto seen = own->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(field(seen[0], "Authorization"), std::string("Bearer ") + kSecret);
  EXPECT_THAT(seen[0], Not(HasSubstr(kPlaceholder)));

  auto expect_mismatch = [&](const Response& r, const std::string& what) {
    ASSERT_EQ(r.status, 403) << what << ": " << describe(r);
    EXPECT_EQ(field(r.head, "Content-Type"), "application/json") << what;
    json body = r.body_json();
    ASSERT_TRUE(body.is_object()) << what << ": " << r.body;
    EXPECT_EQ(body.value("error", ""), "credential_endpoint_mismatch") << what << ": " << r.body;
    EXPECT_THAT(body.value("reason", ""), HasSubstr("API_TOKEN")) << what << ": " << r.body;
    EXPECT_THAT(r.body, Not(HasSubstr(kSecret))) << what;
  };
  expect_mismatch(once(h, other->port(), request("GET", "/me", other->port(), bearer)),
                  "a header to another endpoint");
  expect_mismatch(once(h, other->port(),
                       request("GET", std::string("/q?token=") + kPlaceholder, other->port())),
                  "a query to another endpoint");
  ::usleep(200000);
  EXPECT_EQ(other->requests().size(), 0u);
  auto lines = h.request_lines(3);
  ASSERT_EQ(lines.size(), 3u) << h.audit();
  EXPECT_EQ(lines[1].value("decision", ""), "deny");
  EXPECT_EQ(lines[2].value("decision", ""), "deny");
  EXPECT_THAT(h.audit(), Not(HasSubstr(kSecret)));
}

// A body to an endpoint with credentials is read whole before it goes on
// (a placeholder may be filled into it, or hide in it): one over 1 MiB is
// refused with 413 and never reaches the server; a small one goes on.
TEST_F(Inspect, ABodyTooBigToHoldForCredentialsGets413) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("full"))}}), 1);
  h.set_credentials(std::vector<Credential>{
      {"API_TOKEN", kSecret, {"127.0.0.1:" + std::to_string(server->port())}, false, false}});
  Response small = once(h, server->port(), request("POST", "/up", server->port(), "", "tiny"));
  EXPECT_EQ(small.status, 200) << describe(small);
  Response big =
      once(h, server->port(),
           request("POST", "/up", server->port(), "", std::string(1024 * 1024 + 1, 'x')));
  ASSERT_EQ(big.status, 413) << describe(big);
  EXPECT_EQ(big.body_json().value("error", ""), "body_too_large") << big.body;
  ::usleep(100000);
  EXPECT_EQ(server->requests().size(), 1u) << "the big body reached the server";
}

TEST_F(Inspect, RotationAppliesToTheNextRequestOnTheSameConnection) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("full"))}}), 1);
  const std::string endpoint = "127.0.0.1:" + std::to_string(server->port());
  h.set_credentials(std::vector<Credential>{{"API_TOKEN", kSecret, {endpoint}, false, false}});
  const std::string header = std::string("X-Api-Key: ") + kPlaceholder + "\r\n";
  std::string error;
  auto s = open(h, server->port(), &error);
  ASSERT_TRUE(s) << error;
  ASSERT_TRUE(s->write(request("GET", "/1", server->port(), header)));
  ASSERT_EQ(read_response(*s).status, 200);
  h.set_credentials(std::vector<Credential>{{"API_TOKEN", kRotated, {endpoint}, false, false}});
  ASSERT_TRUE(s->write(request("GET", "/2", server->port(), header)));
  Response second = read_response(*s);
  ASSERT_EQ(second.status, 200) << describe(second);
  auto seen = server->requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(field(seen[0], "X-Api-Key"), kSecret);
  EXPECT_EQ(field(seen[1], "X-Api-Key"), kRotated);
  EXPECT_THAT(h.audit(), Not(HasSubstr(kSecret)));
  EXPECT_THAT(h.audit(), Not(HasSubstr(kRotated)));
}

// ---- the upstream's certificate -----------------------------------------------------

TEST_F(Inspect, AnUpstreamCertificateThatDoesNotVerifyGets502) {
  tls::SandboxCa stranger("stranger");
  struct Case {
    std::string what;
    std::shared_ptr<SSL_CTX> ctx;
    std::string reason;
  };
  const std::vector<Case> cases = {
      {"a certificate for another name", upstream_ca_.leaf_for("other.test"),
       "the server's certificate is not for 127.0.0.1"},
      {"a certificate of an unknown CA", stranger.leaf_for("127.0.0.1"),
       "signed by a CA this host does not trust"},
  };
  for (const Case& c : cases) {
    Upstream server(c.ctx);
    ProxyHarness h(&sandbox_ca_);
    h.set_rules(rules_for({{server.port(), inspection(preset("full"))}}), 1);
    Response r = once(h, server.port(), request("GET", "/", server.port()));
    ASSERT_EQ(r.status, 502) << c.what << ": " << describe(r);
    EXPECT_THAT(r.head, StartsWith("HTTP/1.1 502 Bad Gateway\r\n")) << c.what;
    EXPECT_EQ(field(r.head, "Content-Type"), "application/json") << c.what;
    json body = r.body_json();
    ASSERT_TRUE(body.is_object()) << c.what << ": " << r.body;
    EXPECT_EQ(body.value("error", ""), "upstream_certificate") << c.what << ": " << r.body;
    EXPECT_THAT(body.value("reason", ""), HasSubstr(c.reason)) << c.what << ": " << r.body;
    EXPECT_EQ(server.requests().size(), 0u) << c.what;
    auto lines = h.request_lines(1);
    ASSERT_FALSE(lines.empty()) << c.what << ": " << h.audit();
    EXPECT_EQ(lines.back().value("decision", ""), "deny") << c.what;
  }
}

// ---- TLS towards the client ---------------------------------------------------------

TEST_F(Inspect, AnH2OnlyClientGetsNoH2) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("full"))}}), 1);
  std::string error;
  auto s = open(h, server->port(), &error, bytes_of("\x02h2"));
  ASSERT_TRUE(s) << error;
  const std::string alpn = alpn_of(s->ssl());
  EXPECT_TRUE(alpn.empty() || alpn == "http/1.1") << alpn;
  ASSERT_TRUE(s->write(request("GET", "/", server->port())));
  EXPECT_EQ(read_response(*s).status, 200);
  // And a client that offers both gets http/1.1.
  auto both = open(h, server->port(), &error, bytes_of("\x02h2\x08http/1.1"));
  ASSERT_TRUE(both) << error;
  EXPECT_EQ(alpn_of(both->ssl()), "http/1.1");
}

TEST_F(Inspect, AnSniForAnotherHostIsRefused) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("full"))}}), 1);
  std::string error;
  auto s = open(h, server->port(), &error, bytes_of("\x08http/1.1"), "evil.example");
  if (s) {
    // A handshake that completed must not carry a request anywhere.
    s->write(request("GET", "/", server->port()));
    EXPECT_TRUE(s->closed_within(5000)) << "a connection whose SNI is another host stayed open";
  }
  ::usleep(200000);
  EXPECT_EQ(server->requests().size(), 0u);
  auto all = h.lines();
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const json& j) {
    return j.value("decision", "") == "deny";
  })) << h.audit();
}

// ---- opaque relays ------------------------------------------------------------------

TEST_F(Inspect, ATlsSkipEndpointRelaysOpaqueBytes) {
  Upstream server(nullptr, Upstream::Mode::kEcho);
  ProxyHarness h(&sandbox_ca_);
  // Through the policy text, as a user writes it.
  auto rules = std::make_shared<NetworkRules>(supervisor::network_rules(policy::parse(
      "version = 1\n[network_policies.db]\nendpoints = [ { host = \"127.0.0.1\", port = " +
          std::to_string(server.port()) +
          ", allowed_ips = [\"127.0.0.1/32\"], protocol = \"rest\", tls = \"skip\" } ]\n",
      "test.toml")));
  h.set_rules(rules, 1);
  std::string reply;
  Stream s(tunnel(h, server.port(), &reply));
  ASSERT_THAT(reply, StartsWith("HTTP/1.1 200 "));
  // A first byte of 0x16 (a TLS record), then bytes that are no TLS at all:
  // an inspecting proxy would fail the handshake; a relay passes them.
  const std::string opaque = bytes_of("\x16\x03\x01 not a handshake \x00\xff");
  ASSERT_TRUE(s.write(opaque));
  std::string back;
  for (int i = 0; i < 50 && back.size() < opaque.size() + 5; ++i) back += s.read_some(100);
  EXPECT_EQ(back, "echo:" + opaque);
  EXPECT_EQ(server.relayed(), opaque);
  EXPECT_TRUE(h.lines("request").empty()) << h.audit();
}

TEST_F(Inspect, ALayer4TunnelIsClosedWhenItsEndpointBecomesLayer7) {
  Upstream server(nullptr, Upstream::Mode::kEcho);
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server.port(), nullptr}}), 1);
  std::string reply;
  Stream s(tunnel(h, server.port(), &reply));
  ASSERT_THAT(reply, StartsWith("HTTP/1.1 200 "));
  ASSERT_TRUE(s.write("ping"));
  std::string back;
  for (int i = 0; i < 50 && back.size() < 9; ++i) back += s.read_some(100);
  ASSERT_EQ(back, "echo:ping");
  h.set_rules(rules_for({{server.port(), inspection(preset("full"))}}), 2);
  EXPECT_TRUE(s.closed_within(5000)) << "the layer-4 tunnel stayed open";
  auto all = h.lines();
  EXPECT_TRUE(std::any_of(all.begin(), all.end(), [](const json& j) {
    return j.value("decision", "") == "closed" &&
           j.value("reason", "").starts_with("policy revision 2");
  })) << h.audit();
}

// ---- WebSocket ----------------------------------------------------------------------

TEST_F(Inspect, AnUpgradeIsJudgedAndThenRelaysBytesBothWays) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  HttpRules::Spec spec;
  spec.rules = {{"GET", "/ws", {}}};
  h.set_rules(rules_for({{server->port(), inspection(spec, "websocket")}}), 1);
  const std::string upgrade =
      "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
  // Refused elsewhere.
  expect_denied(once(h, server->port(), request("GET", "/other", server->port(), upgrade)),
                "inspected: rules", "GET", "/other", server->port());
  std::string error;
  auto s = open(h, server->port(), &error);
  ASSERT_TRUE(s) << error;
  ASSERT_TRUE(s->write(request("GET", "/ws", server->port(), upgrade)));
  Response r = read_response(*s);
  ASSERT_EQ(r.status, 101) << describe(r);
  EXPECT_EQ(lower(field(r.head, "Upgrade")), "websocket");
  // Frames are opaque to the proxy from here: any bytes, both ways.
  const std::string frame = bytes_of("\x81\x85\x01\x02\x03\x04hello not http\r\n\r\n");
  ASSERT_TRUE(s->write(frame));
  std::string back;
  for (int i = 0; i < 50 && back.size() < frame.size() + 5; ++i) back += s->read_some(100);
  EXPECT_EQ(back, "echo:" + frame);
  EXPECT_EQ(server->relayed(), frame);
  auto seen = server->requests();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_THAT(seen[0], StartsWith("GET /ws HTTP/1.1\r\n"));
  EXPECT_EQ(lower(field(seen[0], "Upgrade")), "websocket");
}

// ---- the audit ----------------------------------------------------------------------

TEST_F(Inspect, EveryRequestIsOneAuditLineWithItsPathAndNeverAQueryValueOrASecret) {
  auto server = https_server();
  ProxyHarness h(&sandbox_ca_);
  h.set_rules(rules_for({{server->port(), inspection(preset("read-only"))}}), 1);
  h.set_credentials(std::vector<Credential>{
      {"API_TOKEN", kSecret, {"127.0.0.1:" + std::to_string(server->port())}, false, false}});
  const std::string auth = std::string("Authorization: Bearer ") + kPlaceholder + "\r\n";
  std::string error;
  auto s = open(h, server->port(), &error);
  ASSERT_TRUE(s) << error;
  ASSERT_TRUE(s->write(request("GET", "/a/./b?color=vermilion-77&n=1", server->port(), auth)));
  ASSERT_EQ(read_response(*s).status, 200);
  ASSERT_TRUE(s->write(request("OPTIONS", "/c?shade=cobalt-12", server->port())));
  ASSERT_EQ(read_response(*s).status, 200);
  ASSERT_TRUE(s->write(request("POST", "/d?tint=ultramarine-88", server->port(), auth, "x")));
  ASSERT_EQ(read_response(*s).status, 403);

  auto lines = h.request_lines(3);
  ::usleep(200000);
  lines = h.lines("request");
  ASSERT_EQ(lines.size(), 3u) << h.audit();
  struct Want {
    std::string method, path, decision;
  };
  const Want want[] = {
      {"GET", "/a/b", "allow"}, {"OPTIONS", "/c", "allow"}, {"POST", "/d", "deny"}};
  for (size_t i = 0; i < 3; ++i) {
    const json& l = lines[i];
    EXPECT_EQ(l.value("method", ""), want[i].method) << l.dump();
    EXPECT_EQ(l.value("path", ""), want[i].path) << l.dump();
    EXPECT_EQ(l.value("decision", ""), want[i].decision) << l.dump();
    EXPECT_EQ(l.value("host", ""), "127.0.0.1") << l.dump();
    EXPECT_EQ(l.value("port", 0), server->port()) << l.dump();
    EXPECT_EQ(l.value("sandbox", ""), "unit") << l.dump();
    EXPECT_THAT(l.value("rule", ""), HasSubstr(kPolicy)) << l.dump();
    EXPECT_TRUE(l.contains("binary") && l.contains("pid") && l.contains("reason")) << l.dump();
  }
  const std::string audit = h.audit();
  for (const char* never : {"vermilion-77", "cobalt-12", "ultramarine-88", kSecret})
    EXPECT_THAT(audit, Not(HasSubstr(never)));
}

}  // namespace
}  // namespace openshell::egress
