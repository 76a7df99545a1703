// Layer-7 egress in gateway sandboxes of the Debian base image: the proxy
// terminates TLS with the sandbox's CA (which curl, python3, git and node
// trust), judges each request by the endpoint's rules and audits it, puts a
// provider's secret in place of its placeholder only for the provider's
// endpoints (the sandbox never holds the secret), takes a rotated secret
// at the next request, and relays a WebSocket once its upgrade is allowed.
//
// The upstream is an HTTPS server of the test's own on 127.0.0.1, with a CA
// of its own named in the endpoints' ca_file; it echoes what it received as
// JSON. Names resolve through a hosts file and a test DNS server: no traffic
// leaves the host.
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>
#include <openssl/evp.h>
#include <openssl/sha.h>
#include <openssl/ssl.h>

#include "../tls_certs.h"
#include "harness.h"
#include "image_helpers.h"

using testing::HasSubstr;
using testing::Not;
using testing::StartsWith;

namespace e2e {
namespace {

using nlohmann::json;

// The names the policy's endpoints use; all resolve to 127.0.0.1 and are in
// the upstream's certificate.
constexpr const char* kApi = "api.l7.test";      // protocol = "rest", every request allowed
constexpr const char* kRo = "ro.l7.test";        // protocol = "rest", access = "read-only"
constexpr const char* kOther = "other.l7.test";  // protocol = "rest", not the provider's
constexpr const char* kWs = "ws.l7.test";        // protocol = "websocket"

// What the upstream received: one request.
struct Received {
  std::string sni;  // the TLS server name the client (the proxy) sent
  std::string method, target, path, query;
  std::vector<std::pair<std::string, std::string>> headers;  // names in lower case, in order
  std::string body;

  std::string header(const std::string& name) const {
    for (const auto& [n, v] : headers)
      if (n == name) return v;
    return "";
  }
  json to_json() const {
    json h = json::object();
    for (const auto& [n, v] : headers) h[n] = v;
    return {{"sni", sni},     {"method", method},        {"path", path},
            {"query", query}, {"headers", std::move(h)}, {"body", body}};
  }
};

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

std::string base64(const unsigned char* data, size_t size) {
  std::string out(4 * ((size + 2) / 3) + 1, '\0');
  int n =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(size));
  out.resize(static_cast<size_t>(n));
  return out;
}

// The Sec-WebSocket-Accept of a Sec-WebSocket-Key (RFC 6455, 4.2.2).
std::string websocket_accept(const std::string& key) {
  const std::string text = key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
  unsigned char digest[SHA_DIGEST_LENGTH];
  SHA1(reinterpret_cast<const unsigned char*>(text.data()), text.size(), digest);
  return base64(digest, sizeof digest);
}

// A git pkt-line: four hex digits of its length (themselves included), then the data.
std::string pkt_line(const std::string& data) {
  char length[5];
  std::snprintf(length, sizeof length, "%04zx", data.size() + 4);
  return length + data;
}

constexpr const char* kRepoHead = "8d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e";

// The HTTPS upstream, on 127.0.0.1 with a certificate of the test's CA.
// Each connection: TLS, then HTTP/1.1 requests, keep-alive. A request
// gets 200 with JSON of what arrived (Received::to_json); GET
// /repo.git/info/refs?service=git-upload-pack gets a smart-HTTP ref
// advertisement of one branch; an upgrade to websocket gets 101, and then
// each frame comes back unmasked. Every request is recorded.
class EchoUpstream {
 public:
  explicit EchoUpstream(const openshell::testing::TestCert& leaf)
      : ctx_(SSL_CTX_new(TLS_server_method()), SSL_CTX_free),
        server_([this](int fd) { serve(fd); }) {
    // A peer (the proxy) may close while an answer is written: an error
    // for that connection, not a signal that ends the test run.
    ::signal(SIGPIPE, SIG_IGN);
    SSL_CTX_use_certificate(ctx_.get(), leaf.cert.get());
    SSL_CTX_use_PrivateKey(ctx_.get(), leaf.key.get());
  }
  uint16_t port() const { return server_.port(); }
  std::vector<Received> received() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return received_;
  }
  // The requests whose target starts with prefix.
  std::vector<Received> to(const std::string& prefix) const {
    std::vector<Received> out;
    for (auto& r : received())
      if (r.target.rfind(prefix, 0) == 0) out.push_back(r);
    return out;
  }
  // Every recorded byte (head fields, targets, bodies), to search for a value.
  std::string everything() const {
    std::string all;
    for (const auto& r : received()) all += r.to_json().dump() + "\n";
    return all;
  }

 private:
  // Reads some bytes into *data; false at the end, an error, or when the
  // server stops or the peer is silent for 30 s.
  bool read_more(SSL* ssl, int fd, std::string* data) {
    for (int idle_ms = 0; SSL_pending(ssl) == 0;) {
      if (server_.stopping() || idle_ms >= 30000) return false;
      pollfd p{fd, POLLIN, 0};
      int ready = ::poll(&p, 1, 100);
      if (ready > 0) break;
      idle_ms += 100;
    }
    char buf[16384];
    int n = SSL_read(ssl, buf, sizeof buf);
    if (n <= 0) return false;
    data->append(buf, static_cast<size_t>(n));
    return true;
  }
  static bool send(SSL* ssl, const std::string& bytes) {
    return bytes.empty() || SSL_write(ssl, bytes.data(), static_cast<int>(bytes.size())) > 0;
  }
  static Received parse_head(const std::string& head) {
    Received r;
    std::istringstream in(head);
    std::string line;
    std::getline(in, line);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::istringstream request_line(line);
    request_line >> r.method >> r.target;
    size_t question = r.target.find('?');
    r.path = r.target.substr(0, question);
    if (question != std::string::npos) r.query = r.target.substr(question + 1);
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      size_t colon = line.find(':');
      if (line.empty() || colon == std::string::npos) continue;
      std::string value = line.substr(colon + 1);
      value.erase(0, value.find_first_not_of(" \t"));
      r.headers.emplace_back(lower(line.substr(0, colon)), value);
    }
    return r;
  }
  // After a 101: each client frame (masked, short) back unmasked, until the
  // peer closes or sends a close frame.
  void echo_frames(SSL* ssl, int fd, std::string data) {
    for (;;) {
      while (data.size() < 2)
        if (!read_more(ssl, fd, &data)) return;
      const unsigned opcode = static_cast<unsigned char>(data[0]) & 0x0f;
      const bool masked = static_cast<unsigned char>(data[1]) & 0x80;
      size_t length = static_cast<unsigned char>(data[1]) & 0x7f;
      if (length > 125) return;  // this test's frames are short
      const size_t head = 2 + (masked ? 4 : 0);
      while (data.size() < head + length)
        if (!read_more(ssl, fd, &data)) return;
      std::string payload = data.substr(head, length);
      if (masked)
        for (size_t i = 0; i < length; ++i) payload[i] ^= data[2 + i % 4];
      data.erase(0, head + length);
      std::string frame;
      frame += static_cast<char>(0x80 | opcode);
      frame += static_cast<char>(length);
      frame += payload;
      if (!send(ssl, frame) || opcode == 0x8) return;
    }
  }
  void serve(int fd) {
    timeval timeout{30, 0};  // a handshake that never comes does not hold the server
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    std::unique_ptr<SSL, decltype(&SSL_free)> ssl(SSL_new(ctx_.get()), SSL_free);
    SSL_set_fd(ssl.get(), fd);
    if (SSL_accept(ssl.get()) == 1) {
      const char* name = SSL_get_servername(ssl.get(), TLSEXT_NAMETYPE_host_name);
      const std::string sni = name ? name : "";
      std::string data;
      for (bool open = true; open;) {
        size_t end;
        while ((end = data.find("\r\n\r\n")) == std::string::npos)
          if (data.size() > 65536 || !read_more(ssl.get(), fd, &data)) {
            open = false;
            break;
          }
        if (!open) break;
        Received r = parse_head(data.substr(0, end + 4));
        r.sni = sni;
        size_t next = 0;
        while (!take_http_body(data, end + 4, lower(r.header("transfer-encoding")) == "chunked",
                               std::strtoul(r.header("content-length").c_str(), nullptr, 10),
                               &r.body, &next))
          if (!read_more(ssl.get(), fd, &data)) {
            open = false;
            break;
          }
        if (!open) break;
        data.erase(0, next);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          received_.push_back(r);
        }
        if (lower(r.header("upgrade")) == "websocket") {
          const std::string reply =
              "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: "
              "Upgrade\r\nSec-WebSocket-Accept: " +
              websocket_accept(r.header("sec-websocket-key")) + "\r\n\r\n";
          if (send(ssl.get(), reply)) echo_frames(ssl.get(), fd, std::move(data));
          break;
        }
        std::string type = "application/json", body;
        if (r.path == "/repo.git/info/refs" && r.query == "service=git-upload-pack") {
          type = "application/x-git-upload-pack-advertisement";
          body = pkt_line("# service=git-upload-pack\n") + "0000" +
                 pkt_line(std::string(kRepoHead) + " HEAD" + std::string(1, '\0') +
                          "symref=HEAD:refs/heads/main agent=osh-e2e\n") +
                 pkt_line(std::string(kRepoHead) + " refs/heads/main\n") + "0000";
        } else {
          body = r.to_json().dump() + "\n";
        }
        const bool close = lower(r.header("connection")) == "close";
        const std::string reply =
            "HTTP/1.1 200 OK\r\nContent-Type: " + type +
            "\r\nCache-Control: no-cache\r\nContent-Length: " + std::to_string(body.size()) +
            "\r\n" + (close ? "Connection: close\r\n" : "") + "\r\n" + body;
        if (!send(ssl.get(), reply) || close) break;
      }
      SSL_shutdown(ssl.get());
    }
    ::close(fd);
  }

  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx_;
  mutable std::mutex mutex_;
  std::vector<Received> received_;
  LoopbackTcpServer server_;  // last: its threads end before the rest goes
};

// A field of a JSON object as text: a string as it is, another value as
// JSON; "" when absent (or not an object), so that a test fails on it
// rather than on an exception.
std::string text_of(const json& object, const std::string& key) {
  if (!object.is_object() || !object.contains(key)) return "";
  const json& value = object[key];
  return value.is_string() ? value.get<std::string>() : value.dump();
}

// The JSON lines of a text ("" lines skipped, others that are not JSON skipped too).
std::vector<json> json_lines(const std::string& text) {
  std::vector<json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    json parsed = json::parse(line, nullptr, false);
    if (!parsed.is_discarded()) lines.push_back(std::move(parsed));
  }
  return lines;
}

// The JSON body before curl's "-w '\n%{http_code}'" line, and the code.
struct CurlAnswer {
  std::string body;
  std::string code;
};
CurlAnswer curl_answer(const std::string& out) {
  size_t last = out.rfind('\n', out.empty() ? 0 : out.size() - 2);
  if (last == std::string::npos) return {"", out};
  std::string code = out.substr(last + 1);
  while (!code.empty() && code.back() == '\n') code.pop_back();
  return {out.substr(0, last), code};
}

// A random secret; a regular expression that matches it and is not it (so
// that a search's own command line does not hold what it looks for).
std::string random_secret(const std::string& prefix) {
  std::random_device random;
  return prefix + std::to_string(random()) + std::to_string(random());
}
std::string pattern_of(const std::string& secret) {
  return secret.substr(0, 1) + "[" + secret.substr(1, 1) + "]" + secret.substr(2);
}

// In the sandbox (bash): every process's environment and command line
// holding the pattern, then every file of the root (what the sandbox's
// user can read; /proc, /sys and /dev left out) holding it, one a line.
// The directories are named: the sandbox's user may not list / itself.
constexpr const char* kScan =
    "p=$1\n"
    "for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do\n"
    "  tr '\\0' '\\n' 2>/dev/null < \"$f\" | grep -q -e \"$p\" && echo \"$f\"\n"
    "done\n"
    "for d in /bin /boot /etc /home /lib /lib64 /media /mnt /opt /root /run /sandbox /srv /tmp "
    "/usr /var; do\n"
    "  [ -d \"$d\" ] && grep -rls -e \"$p\" \"$d\" 2>/dev/null\n"
    "done\n"
    "echo scanned\n";

// Python's urllib in the sandbox: GET or POST (with a body) through the
// proxy of https_proxy; prints the status and the body.
constexpr const char* kPythonFetch =
    "import sys, urllib.request, urllib.error\n"
    "url, data = sys.argv[1], (sys.argv[2].encode() if len(sys.argv) > 2 else None)\n"
    "try:\n"
    "    r = urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=60)\n"
    "    print(r.status); print(r.read().decode())\n"
    "except urllib.error.HTTPError as e:\n"
    "    print(e.code); print(e.read().decode())\n";

// Node in the sandbox (node 20 has no proxy support of its own): CONNECT
// through the proxy of HTTPS_PROXY, then an https GET over that tunnel,
// trusting what NODE_EXTRA_CA_CERTS adds; prints the status and the body.
constexpr const char* kNodeFetch = R"(
const http = require('http'), https = require('https'), tls = require('tls');
const [host, port, path] = process.argv.slice(1);
const proxy = new URL(process.env.HTTPS_PROXY);
const fail = (what) => { console.log('error: ' + what); process.exit(1); };
const tunnel = http.request({ host: proxy.hostname, port: proxy.port, method: 'CONNECT',
                              path: host + ':' + port, headers: { host: host + ':' + port } });
tunnel.on('connect', (res, socket) => {
  if (res.statusCode !== 200) fail('proxy answered ' + res.statusCode);
  const req = https.request({ host, port, path, method: 'GET',
      createConnection: () => tls.connect({ socket, servername: host }) }, (answer) => {
    let body = '';
    answer.on('data', (d) => body += d);
    answer.on('end', () => { console.log(answer.statusCode); console.log(body); process.exit(0); });
  });
  req.on('error', (e) => fail(e.message));
  req.end();
});
tunnel.on('error', (e) => fail(e.message));
tunnel.end();
)";

// A WebSocket client in the sandbox over raw sockets: CONNECT through the
// proxy, TLS (the sandbox's bundle, via SSL_CERT_FILE), the upgrade, one
// masked text frame, and the frame that comes back.
constexpr const char* kPythonWebSocket = R"(
import base64, hashlib, os, socket, ssl, sys
host, port, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
proxy = os.environ['HTTPS_PROXY'].split('//', 1)[1].rstrip('/')
proxy_host, proxy_port = proxy.rsplit(':', 1)
def head_of(s):
    data = b''
    while b'\r\n\r\n' not in data:
        c = s.recv(1)
        if not c:
            break
        data += c
    return data.decode(errors='replace')
def exactly(s, n):
    data = b''
    while len(data) < n:
        c = s.recv(n - len(data))
        if not c:
            raise SystemExit('closed after %d of %d bytes' % (len(data), n))
        data += c
    return data
raw = socket.create_connection((proxy_host, int(proxy_port)), timeout=60)
raw.sendall(('CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n' % (host, port, host, port)).encode())
answer = head_of(raw)
print('proxy: ' + answer.split('\r\n')[0])
if not answer.startswith('HTTP/1.1 200'):
    print(answer + raw.recv(65536).decode(errors='replace'))
    sys.exit(1)
t = ssl.create_default_context().wrap_socket(raw, server_hostname=host)
key = base64.b64encode(os.urandom(16)).decode()
t.sendall(('GET %s HTTP/1.1\r\nHost: %s:%d\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n'
           'Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n' % (path, host, port, key)).encode())
head = head_of(t)
print('upgrade: ' + head.split('\r\n')[0])
want = base64.b64encode(hashlib.sha1((key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
print('accept: ' + ('ok' if ('Sec-WebSocket-Accept: ' + want) in head else 'wrong'))
if not head.startswith('HTTP/1.1 101'):
    print(head)
    sys.exit(1)
payload = b'hello over layer 7'
mask = os.urandom(4)
t.sendall(bytes([0x81, 0x80 | len(payload)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))
first = exactly(t, 2)
print('echo: opcode=%d %s' % (first[0] & 0x0f, exactly(t, first[1] & 0x7f).decode()))
)";

class L7 : public GatewayTest {
 protected:
  L7() : GatewayTest("l7home", /*check_sandbox_files=*/false) {}

  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    if (image_helpers::base_layout_source().empty())
      GTEST_SKIP() << "OSH_BASE_LAYOUT is not set: these tests run curl, python3 and git of the "
                      "Debian base image (scripts/test builds it with openshell image build-base "
                      "--output)";
    static int counter = 0;
    dir_ = make_dir(mode(), "l7files-" + mode_name(mode()) + "-" + std::to_string(++counter), 0755);
    ca_ = openshell::testing::make_cert(
        {.common_name = "l7 upstream CA", .unit = "", .sans = {}, .ca = true});
    leaf_ = openshell::testing::make_cert(
        {.common_name = kApi,
         .unit = "",
         .sans = {std::string("DNS:") + kApi, std::string("DNS:") + kRo,
                  std::string("DNS:") + kOther, std::string("DNS:") + kWs}},
        &ca_);
    // The supervisor (the mode's user) reads it.
    ca_file_ = write_file(dir_ + "/upstream-ca.pem", ca_.cert_pem(), 0644);
    hosts_ = write_file(dir_ + "/hosts", std::string("127.0.0.1 localhost ") + kApi + " " + kRo +
                                             " " + kOther + " " + kWs + "\n");
    upstream_ = std::make_unique<EchoUpstream>(leaf_);
  }
  void TearDown() override {
    GatewayTest::TearDown();  // the sandboxes go first, and their connections with them
    upstream_.reset();
  }

  Result os(const std::vector<std::string>& args, Options o = {}) override {
    o.env.push_back("OPENSHELL_HOSTS_FILE=" + hosts_);
    o.env.push_back("OPENSHELL_DNS_SERVERS=127.0.0.1:" + std::to_string(dns_.port()));
    if (o.timeout_s < 120) o.timeout_s = 120;
    return GatewayTest::os(args, std::move(o));
  }

  std::string port() const { return std::to_string(upstream_->port()); }
  std::string url(const std::string& host, const std::string& target) const {
    return "https://" + host + ":" + port() + target;
  }
  std::string endpoint(const std::string& host, const std::string& extra) const {
    return "  { host = \"" + host + "\", port = " + port() +
           ", allowed_ips = [\"127.0.0.1/32\"], ca_file = \"" + ca_file_ + "\"" + extra + " },\n";
  }
  // The policy of every test: the four endpoints.
  std::string policy() {
    return write_file(dir_ + "/policy.toml",
                      "version = 1\n[network_policies.l7]\nendpoints = [\n" +
                          endpoint(kApi, ", protocol = \"rest\"") +
                          endpoint(kRo, ", protocol = \"rest\", access = \"read-only\"") +
                          endpoint(kOther, ", protocol = \"rest\"") +
                          endpoint(kWs, ", protocol = \"websocket\"") + "]\n");
  }

  // The base image in this gateway's store, once a test.
  void import_base() {
    const std::string& readable = image_helpers::readable_base_layout();
    ASSERT_FALSE(readable.empty())
        << "cannot copy " << image_helpers::base_layout_source() << " into " << scratch();
    Options slow;
    slow.timeout_s = 300;
    Result imp = os({"image", "import", readable, "base"}, slow);
    ASSERT_EQ(imp.status, 0) << imp.err;
  }
  // A running sandbox of the base image with the policy (and more create
  // arguments).
  void create(const std::string& name, const std::vector<std::string>& more = {}) {
    import_base();
    if (HasFatalFailure()) return;
    std::vector<std::string> args = {"sandbox", "create", "--name",   name,
                                     "--from",  "base",   "--policy", policy()};
    args.insert(args.end(), more.begin(), more.end());
    for (const char* tail : {"-d", "--", "sleep", "infinity"}) args.push_back(tail);
    Result r = os(args);
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  Result exec(const std::string& name, std::vector<std::string> command) {
    std::vector<std::string> args = {"sandbox", "exec", name, "--"};
    args.insert(args.end(), command.begin(), command.end());
    return os(args);
  }
  // curl in the sandbox: the body, then a line of the status code.
  CurlAnswer curl(const std::string& name, std::vector<std::string> more) {
    std::vector<std::string> command = {"curl", "-sS", "-w", "\\n%{http_code}\\n"};
    command.insert(command.end(), more.begin(), more.end());
    Result r = exec(name, command);
    EXPECT_NE(r.status, 125) << r.err;
    EXPECT_NE(r.status, 127) << r.err;
    return curl_answer(r.out);
  }

  // The network log's lines of kind "request".
  std::vector<json> requests_audited(const std::string& name) {
    Result r = os({"logs", name, "--source", "network", "-o", "json"});
    EXPECT_EQ(r.status, 0) << r.err;
    std::vector<json> requests;
    for (auto& line : json_lines(r.out))
      if (text_of(line, "kind") == "request") requests.push_back(std::move(line));
    return requests;
  }
  // The audit line of a request (its host, method and path); null when none.
  // The supervisor writes it as it judges the request: waited on, 30 s at most.
  json audited(const std::string& name, const std::string& host, const std::string& method,
               const std::string& path) {
    for (int i = 0; i < 150; ++i) {
      if (i > 0) ::usleep(200000);
      for (auto& line : requests_audited(name))
        if (text_of(line, "host") == host && text_of(line, "method") == method &&
            text_of(line, "path") == path)
          return line;
    }
    return nullptr;
  }

  std::string dir_, ca_file_, hosts_;
  openshell::testing::TestCert ca_, leaf_;
  TestDnsServer dns_;
  std::unique_ptr<EchoUpstream> upstream_;
};
E2E_ALL_MODES(L7);

// The echo of one request, parsed; a failure when it is not JSON.
json echo_of(const std::string& body) {
  json parsed = json::parse(body, nullptr, false);
  EXPECT_FALSE(parsed.is_discarded()) << "not the upstream's JSON: " << body;
  return parsed.is_discarded() ? json::object() : parsed;
}

// (1) curl, python3 and git trust the sandbox's CA: each reaches the
// upstream through an inspected endpoint, and each request is judged and
// audited as a request (its method and path, never the query).
TEST_P(L7, CurlPythonAndGitTrustTheSandboxCaAndEachRequestIsAudited) {
  GatewayGuard gateway(mode(), home_);
  create("trust");
  if (HasFatalFailure()) return;

  CurlAnswer c = curl("trust", {"-H", "X-Probe: from-curl", url(kApi, "/curl/path?a=1&b=two")});
  EXPECT_EQ(c.code, "200") << c.body;
  json echo = echo_of(c.body);
  EXPECT_EQ(text_of(echo, "method"), "GET");
  EXPECT_EQ(text_of(echo, "path"), "/curl/path");
  EXPECT_EQ(text_of(echo, "query"), "a=1&b=two");
  EXPECT_EQ(text_of(echo.value("headers", json::object()), "x-probe"), "from-curl");
  EXPECT_EQ(text_of(echo, "sni"), kApi) << "the proxy names the host upstream";
  json line = audited("trust", kApi, "GET", "/curl/path");
  ASSERT_TRUE(line.is_object()) << "no audit line for curl's request";
  EXPECT_EQ(text_of(line, "decision"), "allow") << line.dump();
  EXPECT_EQ(text_of(line, "port"), port()) << line.dump();
  EXPECT_EQ(text_of(line, "binary"), "/usr/bin/curl") << line.dump();
  EXPECT_THAT(line.dump(), Not(HasSubstr("b=two"))) << "the query is never audited";

  Result py = exec("trust", {"python3", "-c", kPythonFetch, url(kApi, "/python?x=1"), "posted"});
  EXPECT_EQ(py.status, 0) << py.out << py.err;
  EXPECT_THAT(py.out, StartsWith("200\n")) << py.err;
  json py_echo = echo_of(py.out.substr(py.out.find('\n') + 1));
  EXPECT_EQ(text_of(py_echo, "method"), "POST");
  EXPECT_EQ(text_of(py_echo, "path"), "/python");
  EXPECT_EQ(text_of(py_echo, "body"), "posted");
  json py_line = audited("trust", kApi, "POST", "/python");
  ASSERT_TRUE(py_line.is_object()) << "no audit line for python's request";
  EXPECT_EQ(text_of(py_line, "decision"), "allow") << py_line.dump();

  Result git = exec("trust", {"git", "ls-remote", url(kApi, "/repo.git")});
  EXPECT_EQ(git.status, 0) << git.out << git.err;
  EXPECT_EQ(git.out, std::string(kRepoHead) + "\tHEAD\n" + kRepoHead + "\trefs/heads/main\n")
      << git.err;
  std::vector<Received> refs = upstream_->to("/repo.git/info/refs");
  ASSERT_FALSE(refs.empty()) << "git's request did not reach the upstream";
  EXPECT_THAT(refs.back().header("user-agent"), StartsWith("git/"));
  json git_line = audited("trust", kApi, "GET", "/repo.git/info/refs");
  ASSERT_TRUE(git_line.is_object()) << "no audit line for git's request";
  EXPECT_EQ(text_of(git_line, "decision"), "allow") << git_line.dump();

  // Each was a TLS connection the proxy opened with the sandbox's CA: a
  // client told to trust only the upstream's own CA refuses it.
  Result strict = exec("trust", {"sh", "-c",
                                 "printf '%s' \"$0\" > /tmp/upstream-ca.pem && curl -sS --cacert "
                                 "/tmp/upstream-ca.pem " +
                                     url(kApi, "/strict"),
                                 ca_.cert_pem()});
  EXPECT_EQ(strict.status, 60) << strict.out << strict.err;
  EXPECT_THAT(strict.err, HasSubstr("SSL certificate problem"));
}

// (1) node trusts the sandbox's CA through NODE_EXTRA_CA_CERTS. Node is not
// in the base image: the host's, uploaded, where it runs there.
TEST_P(L7, NodeTrustsTheSandboxCa) {
  GatewayGuard gateway(mode(), home_);
  std::string node;
  for (const char* candidate : {"/usr/bin/node", "/usr/local/bin/node", "/usr/bin/nodejs"})
    if (::access(candidate, X_OK) == 0) {
      node = candidate;
      break;
    }
  if (node.empty()) GTEST_SKIP() << "no node binary on this host to bring into the sandbox";
  // Uploaded under a directory of the test's, readable by the mode's user.
  const std::string carry = make_dir(mode(), "l7node-" + mode_name(mode()), 0755);
  ASSERT_EQ(image_helpers::sh("cp " + image_helpers::q(node) + " " + carry +
                              "/node && chmod 0755 " + carry + "/node")
                .status,
            0);
  create("nodejs");
  if (HasFatalFailure()) return;
  Result up = os({"sandbox", "upload", "nodejs", carry + "/node", "/sandbox"});
  ASSERT_EQ(up.status, 0) << up.out << up.err;
  Result version = exec("nodejs", {"/sandbox/node", "--version"});
  if (version.status != 0)
    GTEST_SKIP() << node << " does not run in the base image's root (status " << version.status
                 << "): " << version.err;

  Result r = exec("nodejs", {"/sandbox/node", "-e", kNodeFetch, "--", kApi, port(), "/node?n=1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  ASSERT_THAT(r.out, StartsWith("200\n")) << r.err;
  json echo = echo_of(r.out.substr(4));
  EXPECT_EQ(text_of(echo, "method"), "GET");
  EXPECT_EQ(text_of(echo, "path"), "/node");
  json line = audited("nodejs", kApi, "GET", "/node");
  ASSERT_TRUE(line.is_object()) << "no audit line for node's request";
  EXPECT_EQ(text_of(line, "decision"), "allow") << line.dump();
  EXPECT_EQ(text_of(line, "binary"), "/sandbox/node") << line.dump();
}

// (2) A read-only endpoint: GET passes; POST is answered 403 with the JSON
// denial, never reaches the upstream, and is audited as a denial.
TEST_P(L7, ReadOnlyEndpointRefusesAPostThatNeverReachesTheServer) {
  GatewayGuard gateway(mode(), home_);
  create("ro");
  if (HasFatalFailure()) return;
  CurlAnswer get = curl("ro", {url(kRo, "/items?page=2")});
  EXPECT_EQ(get.code, "200") << get.body;
  EXPECT_EQ(text_of(echo_of(get.body), "path"), "/items");

  CurlAnswer post = curl("ro", {"-X", "POST", "-H", "Content-Type: application/json", "--data",
                                "{\"drop\":\"everything\"}", url(kRo, "/items/7?force=1")});
  EXPECT_EQ(post.code, "403") << post.body;
  json denial = json::parse(post.body, nullptr, false);
  ASSERT_FALSE(denial.is_discarded()) << "the 403's body is not JSON: " << post.body;
  EXPECT_EQ(text_of(denial, "error"), "policy_denied") << post.body;
  EXPECT_EQ(text_of(denial, "method"), "POST") << post.body;
  EXPECT_EQ(text_of(denial, "path"), "/items/7") << post.body;
  EXPECT_EQ(text_of(denial, "host"), kRo) << post.body;
  EXPECT_EQ(text_of(denial, "port"), port()) << post.body;
  EXPECT_THAT(text_of(denial, "rule"), StartsWith("l7")) << post.body;
  EXPECT_FALSE(text_of(denial, "reason").empty()) << post.body;
  EXPECT_THAT(text_of(denial, "hint"),
              HasSubstr(std::string("openshell policy update ro --add-allow ") + kRo + ":" +
                        port() + ":POST:/items/7"))
      << post.body;
  EXPECT_EQ(upstream_->to("/items/7").size(), 0u) << "the refused POST reached the upstream";
  json line = audited("ro", kRo, "POST", "/items/7");
  ASSERT_TRUE(line.is_object()) << "no audit line for the refused POST";
  EXPECT_EQ(text_of(line, "decision"), "deny") << line.dump();
  json allowed = audited("ro", kRo, "GET", "/items");
  ASSERT_TRUE(allowed.is_object()) << "no audit line for the GET";
  EXPECT_EQ(text_of(allowed, "decision"), "allow") << allowed.dump();
}

// (3) and (4): a provider's secret reaches only its endpoint, in place of
// the placeholder; anywhere else the placeholder is refused; the secret is
// nowhere inside the sandbox nor in the gateway's files, answers and logs;
// a rotated secret goes with the next request, without a restart.
TEST_P(L7, AProvidersSecretGoesOnlyToItsEndpointAndRotatesWithoutARestart) {
  GatewayGuard gateway(mode(), home_);
  const std::string secret = random_secret("l7-secret-");
  Result made = os({"provider", "create", "--name", "svc", "--type", "generic", "--credential",
                    "SVC_KEY=" + secret, "--endpoint", std::string(kApi) + ":" + port()});
  ASSERT_EQ(made.status, 0) << made.out << made.err;
  create("cred", {"--provider", "svc"});
  if (HasFatalFailure()) return;
  const std::string placeholder = "openshell:resolve:env:SVC_KEY";

  Result env = exec("cred", {"sh", "-c", "echo \"$SVC_KEY\""});
  EXPECT_EQ(env.out, placeholder + "\n") << env.err;

  // To its endpoint, in a header: the upstream gets the secret. (The
  // answer, which echoes it, is not kept: the sandbox is to hold no copy.)
  Result through = exec("cred", {"sh", "-c",
                                 "curl -sS -o /dev/null -w '%{http_code}' -H \"Authorization: "
                                 "Bearer $SVC_KEY\" " +
                                     url(kApi, "/auth")});
  EXPECT_EQ(through.out, "200") << through.err;
  std::vector<Received> auth = upstream_->to("/auth");
  ASSERT_FALSE(auth.empty()) << "the request did not reach the upstream";
  EXPECT_EQ(auth.back().header("authorization"), "Bearer " + secret);
  json line = audited("cred", kApi, "GET", "/auth");
  ASSERT_TRUE(line.is_object()) << "no audit line for the request with the credential";
  EXPECT_EQ(text_of(line, "decision"), "allow") << line.dump();

  // The same placeholder to another allowed endpoint: in a header, and in
  // the query. Each refused with 403 credential_endpoint_mismatch, and
  // neither reaches the upstream.
  Result header = exec("cred", {"sh", "-c",
                                "curl -sS -w '\\n%{http_code}\\n' -H \"Authorization: Bearer "
                                "$SVC_KEY\" " +
                                    url(kOther, "/elsewhere")});
  CurlAnswer h = curl_answer(header.out);
  EXPECT_EQ(h.code, "403") << header.out << header.err;
  EXPECT_EQ(text_of(json::parse(h.body, nullptr, false), "error"), "credential_endpoint_mismatch")
      << h.body;
  Result query = exec(
      "cred", {"sh", "-c",
               "curl -sS -w '\\n%{http_code}\\n' \"" + url(kOther, "/q?token=") + "$SVC_KEY\""});
  CurlAnswer q = curl_answer(query.out);
  EXPECT_EQ(q.code, "403") << query.out << query.err;
  EXPECT_EQ(text_of(json::parse(q.body, nullptr, false), "error"), "credential_endpoint_mismatch")
      << q.body;
  EXPECT_EQ(upstream_->to("/elsewhere").size(), 0u) << "a refused request reached the upstream";
  EXPECT_EQ(upstream_->to("/q").size(), 0u) << "a refused request reached the upstream";
  EXPECT_THAT(upstream_->everything(), Not(HasSubstr(placeholder)))
      << "a placeholder went upstream";
  json refused = audited("cred", kOther, "GET", "/elsewhere");
  ASSERT_TRUE(refused.is_object()) << "no audit line for the refused header";
  EXPECT_EQ(text_of(refused, "decision"), "deny") << refused.dump();
  json refused_query = audited("cred", kOther, "GET", "/q");
  ASSERT_TRUE(refused_query.is_object()) << "no audit line for the refused query";
  EXPECT_EQ(text_of(refused_query, "decision"), "deny") << refused_query.dump();

  // Nowhere inside: no process's environment or command line, no file the
  // sandbox can read. A file holding the placeholder shows the scan finds
  // what is there.
  ASSERT_EQ(exec("cred", {"sh", "-c", "echo \"$SVC_KEY\" > /tmp/placeholder.txt"}).status, 0);
  Result control = exec("cred", {"bash", "-c", kScan, "scan", pattern_of(placeholder)});
  EXPECT_THAT(control.out, HasSubstr("/tmp/placeholder.txt\n")) << control.err;
  EXPECT_THAT(control.out, HasSubstr("/environ\n")) << control.err;
  Result scan = exec("cred", {"bash", "-c", kScan, "scan", pattern_of(secret)});
  EXPECT_EQ(scan.out, "scanned\n") << "the secret is inside the sandbox: " << scan.err;

  // Nor in the gateway's files (gateway.db holds it sealed), its answers or logs.
  EXPECT_EQ(files_holding(home_, secret), std::vector<std::string>{});
  for (const std::vector<std::string>& ask : std::vector<std::vector<std::string>>{
           {"sandbox", "get", "cred", "-o", "json"},
           {"sandbox", "get", "cred"},
           {"provider", "get", "svc", "-o", "json"},
           {"logs", "cred"},
           {"logs", "cred", "--source", "network", "-o", "json"},
           {"logs", "cred", "--source", "network", "-o", "ocsf"}}) {
    Result r = os(ask);
    EXPECT_EQ(r.status, 0) << ask[0] << " " << ask[1] << ": " << r.err;
    EXPECT_THAT(r.out + r.err, Not(HasSubstr(secret))) << ask[0] << " " << ask[1];
  }

  // Rotation: the next request carries the new value; the sandbox keeps
  // running (the same main process) and its placeholder.
  const std::vector<std::string> main_process = {"ps", "-o", "pid=,lstart=", "-C", "sleep"};
  const std::string before = exec("cred", main_process).out;
  EXPECT_NE(before, "");
  const std::string rotated = random_secret("l7-rotated-");
  Result update = os({"provider", "update", "svc", "--credential", "SVC_KEY=" + rotated});
  ASSERT_EQ(update.status, 0) << update.out << update.err;
  // The supervisor gets the new set over its session: asked until a request
  // carries it, 30 s at most.
  std::string carried;
  for (int i = 0; i < 60; ++i) {
    if (i > 0) ::usleep(500000);
    Result again = exec("cred", {"sh", "-c",
                                 "curl -sS -o /dev/null -w '%{http_code}' -H \"Authorization: "
                                 "Bearer $SVC_KEY\" " +
                                     url(kApi, "/rotated/" + std::to_string(i))});
    EXPECT_EQ(again.out, "200") << again.err;
    std::vector<Received> got = upstream_->to("/rotated/" + std::to_string(i));
    if (got.empty()) continue;
    carried = got.back().header("authorization");
    if (carried != "Bearer " + secret) break;
  }
  EXPECT_EQ(carried, "Bearer " + rotated) << "the rotated secret never went";
  Result after = exec("cred", {"sh", "-c",
                               "curl -sS -o /dev/null -w '%{http_code}' -H \"Authorization: "
                               "Bearer $SVC_KEY\" " +
                                   url(kApi, "/after")});
  EXPECT_EQ(after.out, "200") << after.err;
  std::vector<Received> last = upstream_->to("/after");
  ASSERT_FALSE(last.empty());
  EXPECT_EQ(last.back().header("authorization"), "Bearer " + rotated);
  EXPECT_EQ(exec("cred", {"sh", "-c", "echo \"$SVC_KEY\""}).out, placeholder + "\n");
  EXPECT_EQ(exec("cred", main_process).out, before) << "the sandbox was restarted";
  EXPECT_EQ(files_holding(home_, rotated), std::vector<std::string>{});
  Result rescan = exec("cred", {"bash", "-c", kScan, "scan", pattern_of(rotated)});
  EXPECT_EQ(rescan.out, "scanned\n") << "the rotated secret is inside the sandbox: " << rescan.err;
}

// (5) A WebSocket through a protocol = "websocket" endpoint: the upgrade is
// judged (and audited) as a request, then frames go both ways.
TEST_P(L7, AWebSocketIsRelayedOnceItsUpgradeIsAllowed) {
  GatewayGuard gateway(mode(), home_);
  create("ws");
  if (HasFatalFailure()) return;
  Result r = exec("ws", {"python3", "-c", kPythonWebSocket, kWs, port(), "/socket?room=1"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("proxy: HTTP/1.1 200")) << r.err;
  EXPECT_THAT(r.out, HasSubstr("upgrade: HTTP/1.1 101")) << r.err;
  EXPECT_THAT(r.out, HasSubstr("accept: ok")) << r.err;
  EXPECT_THAT(r.out, HasSubstr("echo: opcode=1 hello over layer 7\n")) << r.err;
  std::vector<Received> up = upstream_->to("/socket");
  ASSERT_EQ(up.size(), 1u) << "the upgrade did not reach the upstream once";
  EXPECT_EQ(lower(up[0].header("upgrade")), "websocket");
  EXPECT_EQ(up[0].sni, kWs);
  json line = audited("ws", kWs, "GET", "/socket");
  ASSERT_TRUE(line.is_object()) << "no audit line for the upgrade";
  EXPECT_EQ(text_of(line, "decision"), "allow") << line.dump();
}

}  // namespace
}  // namespace e2e
