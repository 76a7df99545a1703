#include "egress/http_session.h"

#include <array>
#include <atomic>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/json_text.h"
#include "base/text.h"
#include "egress/tls.h"

namespace openshell::egress {

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using ClientSocket = asio::generic::stream_protocol::socket;
using asio::ip::tcp;

constexpr size_t kMaxHead = 16 * 1024;
constexpr size_t kMaxResponseHead = 64 * 1024;
constexpr size_t kBodyChunk = 64 * 1024;
// A body is read whole, before it goes on, only where a credential may be
// filled into it or may hide in it; a bigger one is refused (413).
constexpr uint64_t kMaxBufferedBody = 1024 * 1024;
// And all the bodies held at once, by every session of this process (one
// sandbox's proxy): a sandbox that opens many connections cannot make its
// supervisor hold more. A body beyond it gets 503.
constexpr uint64_t kBufferedBudget = 32 * 1024 * 1024;
std::atomic<uint64_t> buffered_bytes{0};
constexpr auto kCloseNotifyWait = std::chrono::milliseconds(200);
// After a refusal, what the client still sends of its request is read and
// dropped, for this long and this much at most: a close with bytes unread
// resets the connection, and the client would lose the response with it.
constexpr auto kDrainWait = std::chrono::seconds(2);
constexpr size_t kMaxDrain = 8 * 1024 * 1024;

// A socket, or TLS over it: one stream type for Beast either way.
template <class Socket>
class Stream {
 public:
  using executor_type = typename Socket::executor_type;
  explicit Stream(Socket& socket) : socket_(socket) {}
  executor_type get_executor() { return socket_.get_executor(); }

  void use_tls(SSL_CTX* ctx) {
    SSL_CTX_up_ref(ctx);
    asio::ssl::context context(ctx);  // gives back its reference; the stream's SSL holds one
    tls_.emplace(socket_, context);
  }
  asio::ssl::stream<Socket&>* tls() { return tls_ ? &*tls_ : nullptr; }

  template <class Buffers, class Handler>
  void async_read_some(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      tls_->async_read_some(buffers, std::forward<Handler>(handler));
    else
      socket_.async_read_some(buffers, std::forward<Handler>(handler));
  }
  template <class Buffers, class Handler>
  void async_write_some(const Buffers& buffers, Handler&& handler) {
    if (tls_)
      tls_->async_write_some(buffers, std::forward<Handler>(handler));
    else
      socket_.async_write_some(buffers, std::forward<Handler>(handler));
  }

 private:
  Socket& socket_;
  std::optional<asio::ssl::stream<Socket&>> tls_;
};

// Beast (1.74) speaks boost::string_view.
std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

std::string lower_host(std::string_view host) {
  std::string out = text::lower(host);
  if (!out.empty() && out.back() == '.') out.pop_back();
  return out;
}

// host[:port] (IPv6 in brackets) -> host without brackets, and the port or
// `default_port`; false when malformed.
bool parse_authority(std::string_view authority, uint16_t default_port, std::string* host,
                     uint16_t* port) {
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return false;
    *host = lower_host(authority.substr(1, close - 1));
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      port_text = rest.substr(1);
    }
  } else {
    size_t colon = authority.rfind(':');
    if (colon != std::string_view::npos) {
      if (authority.find(':') != colon) return false;  // IPv6 without brackets
      port_text = authority.substr(colon + 1);
      authority = authority.substr(0, colon);
    }
    *host = lower_host(authority);
  }
  if (host->empty()) return false;
  *port = default_port;
  if (port_text.empty()) return true;
  auto value = text::parse_uint(port_text, 65535);
  if (!value || *value == 0) return false;
  *port = static_cast<uint16_t>(*value);
  return true;
}

bool is_hop_by_hop(const std::string& name, const std::vector<std::string>& named) {
  static const char* const kHopByHop[] = {
      "connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate",
      "te",         "trailer",    "upgrade",          "transfer-encoding",   "content-length"};
  for (const char* h : kHopByHop)
    if (name == h) return true;
  for (const auto& n : named)
    if (name == n) return true;
  return false;
}

// The tokens of every Connection field, lower case.
template <class Fields>
std::vector<std::string> connection_options(const Fields& fields) {
  std::vector<std::string> out;
  for (const auto& f : fields) {
    if (!text::iequals(sv(f.name_string()), "connection")) continue;
    for (auto token : text::split(std::string(sv(f.value())), ','))
      if (auto t = text::lower(text::trim(token)); !t.empty()) out.push_back(t);
  }
  return out;
}

bool has_line_break(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos;
}

std::string hex(size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  do {
    out.insert(out.begin(), digits[n & 15]);
    n >>= 4;
  } while (n);
  return out;
}

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<HttpSessionOwner> owner, ClientSocket& client, tcp::socket& upstream,
          HttpSessionOptions options)
      : owner_(std::move(owner)),
        client_socket_(client),
        upstream_socket_(upstream),
        cs_(client),
        us_(upstream),
        o_(std::move(options)),
        timer_(client.get_executor()) {}

  ~Session() { release(); }

  void start() {
    arm(o_.head_timeout);
    if (!o_.initial.empty()) {
      auto b = cbuf_.prepare(o_.initial.size());
      std::memcpy(b.data(), o_.initial.data(), o_.initial.size());
      cbuf_.commit(o_.initial.size());
      std::string().swap(o_.initial);
    }
    if (o_.single_request || cbuf_.size() > 0) return detected();
    auto self = shared_from_this();
    client_socket_.async_read_some(cbuf_.prepare(4096),
                                   [self](const boost::system::error_code& ec, size_t n) {
                                     if (ec) return self->end();
                                     self->cbuf_.commit(n);
                                     self->detected();
                                   });
  }

 private:
  // The first bytes tell: a TLS handshake record (0x16), or HTTP.
  void detected() {
    const bool tls =
        !o_.single_request && static_cast<const unsigned char*>(cbuf_.data().data())[0] == 0x16;
    scheme_port_ = 80;
    if (!tls) return read_request();
    scheme_port_ = 443;
    if (!o_.client_tls || !o_.upstream_tls) {
      owner_->audit_request("", "", "deny", "",
                            "the client speaks TLS to a layer-7 endpoint, and this sandbox has no "
                            "CA to inspect it with");
      return end();
    }
    cs_.use_tls(o_.client_tls.get());
    us_.use_tls(o_.upstream_tls.get());
    try {
      tls::prepare_upstream(us_.tls()->native_handle(), o_.host, o_.port);
    } catch (const std::exception& e) {
      upstream_error_ = e.what();
    }
    // Both handshakes at once: the server's round trip overlaps the client's.
    auto self = shared_from_this();
    handshakes_ = upstream_error_.empty() ? 2 : 1;
    cs_.tls()->async_handshake(
        asio::ssl::stream_base::server, cbuf_.data(),
        [self](const boost::system::error_code& ec, size_t used) {
          if (self->ended_) return;
          if (ec) {
            self->owner_->audit_request("", "", "deny", "",
                                        "the TLS handshake with the sandbox's client failed (" +
                                            ec.message() + "): does it trust the sandbox's CA?");
            return self->end();
          }
          self->cbuf_.consume(used);
          const char* sni =
              SSL_get_servername(self->cs_.tls()->native_handle(), TLSEXT_NAMETYPE_host_name);
          if (sni && lower_host(sni) != self->o_.host) {
            self->owner_->audit_request("", "", "deny", "",
                                        "the client's TLS names " + std::string(sni) +
                                            " inside a tunnel to " + self->o_.host);
            return self->end();
          }
          self->handshake_done();
        });
    if (!upstream_error_.empty()) return;
    us_.tls()->async_handshake(
        asio::ssl::stream_base::client, [self](const boost::system::error_code& ec) {
          if (self->ended_) return;
          if (ec) {
            std::string why = tls::verify_failure(self->us_.tls()->native_handle(), self->o_.host);
            self->upstream_error_ =
                why.empty() ? "the TLS handshake with the server failed (" + ec.message() + ")"
                            : why;
          }
          self->handshake_done();
        });
  }

  void handshake_done() {
    if (--handshakes_ == 0) read_request();
  }

  void read_request() {
    if (ended_) return;
    req_.emplace();
    req_->header_limit(kMaxHead);
    req_->body_limit(std::numeric_limits<std::uint64_t>::max());
    auto self = shared_from_this();
    http::async_read_header(cs_, cbuf_, *req_, [self](const beast::error_code& ec, size_t) {
      self->on_request_head(ec);
    });
  }

  void on_request_head(const beast::error_code& ec) {
    if (ended_) return;
    timer_.cancel();
    if (ec) {
      if (ec == http::error::header_limit)
        return malformed(431, "Request Header Fields Too Large",
                         "a request head longer than " + std::to_string(kMaxHead) + " bytes");
      if (ec == http::error::end_of_stream || ec == http::error::partial_message ||
          ec.category() != http::make_error_code(http::error::end_of_stream).category())
        return end();  // the client left, or its connection failed
      return malformed(400, "Bad Request",
                       "not a well-formed HTTP/1.1 request (" + ec.message() + ")");
    }
    auto& m = req_->get();
    method_ = std::string(sv(m.method_string()));
    upgrade_ = req_->upgrade();
    keep_ = req_->keep_alive() && !o_.single_request;

    // Framing and routing that another reader could take otherwise.
    const size_t lengths = m.count(http::field::content_length);
    const size_t codings = m.count(http::field::transfer_encoding);
    if (lengths && codings)
      return malformed(400, "Bad Request",
                       "both Content-Length and Transfer-Encoding (their reading is ambiguous)");
    if (lengths > 1) return malformed(400, "Bad Request", "Content-Length given more than once");
    if (codings > 1 ||
        (codings && !text::iequals(text::trim(sv(m[http::field::transfer_encoding])), "chunked")))
      return malformed(400, "Bad Request", "a Transfer-Encoding other than \"chunked\"");
    const size_t hosts = m.count(http::field::host);
    if (hosts > 1) return malformed(400, "Bad Request", "Host given more than once");
    if (hosts == 0 && !o_.single_request) return malformed(400, "Bad Request", "no Host field");
    if (hosts == 1) {
      std::string host;
      uint16_t port = 0;
      if (!parse_authority(text::trim(sv(m[http::field::host])), scheme_port_, &host, &port))
        return malformed(400, "Bad Request", "a malformed Host field");
      if (host != o_.host || port != o_.port)
        return malformed(400, "Bad Request",
                         "its Host names another server than the connection's (" + o_.host + ":" +
                             std::to_string(o_.port) + ")");
    }
    std::string_view target = sv(m.target());
    if (!target.empty() && target.front() == '/') {
      target_ = std::string(target);
    } else {
      const bool https = target.rfind("https://", 0) == 0;
      if (!https && target.rfind("http://", 0) != 0)
        return malformed(400, "Bad Request", "a request target that is not a path or a URL");
      std::string_view rest = target.substr(https ? 8 : 7);
      size_t end = rest.find_first_of("/?");
      std::string host;
      uint16_t port = 0;
      if (!parse_authority(rest.substr(0, end), https ? 443 : 80, &host, &port) ||
          host != o_.host || port != o_.port)
        return malformed(400, "Bad Request",
                         "its URL names another server than the connection's (" + o_.host + ":" +
                             std::to_string(o_.port) + ")");
      target_ = end == std::string_view::npos ? "/" : std::string(rest.substr(end));
      if (target_.front() == '?') target_.insert(0, "/");
    }
    if (!upstream_error_.empty()) {
      owner_->audit_request(method_, "", "deny", "", upstream_error_);
      nlohmann::json body = {{"error", "upstream_certificate"},
                             {"reason", upstream_error_},
                             {"host", o_.host},
                             {"port", o_.port}};
      return respond(502, "Bad Gateway", json_text(body));
    }

    judgement_ = owner_->judge_request(method_, target_);
    const HttpVerdict& v = judgement_.verdict;
    if (judgement_.close) {
      owner_->audit_request(method_, v.path, "closed", "", judgement_.close_reason);
      return end();
    }
    if (v.malformed) {
      owner_->audit_request(method_, "", "deny", v.rule, v.reason);
      return respond(400, "Bad Request", http_malformed_body(v, o_.host, o_.port, method_));
    }
    if (!v.allowed) {
      owner_->audit_request(method_, v.path, "deny", v.rule, v.reason);
      return respond(403, "Forbidden",
                     http_denial_body(v, owner_->sandbox_name(), o_.host, o_.port, method_));
    }

    credentials_ = owner_->credentials();
    const bool has_body =
        req_->chunked() || (req_->content_length() && *req_->content_length() > 0);
    buffered_ = has_body && !credentials_->empty();
    if (!buffered_) return send_request();
    if (req_->content_length() && *req_->content_length() > kMaxBufferedBody) return too_large();
    if (text::iequals(sv(m[http::field::expect]), "100-continue")) {
      // The body is read here before the server sees the request: the
      // client is told to send it.
      auto self = shared_from_this();
      return send(cs_, "HTTP/1.1 100 Continue\r\n\r\n", [self] { self->read_body(); });
    }
    read_body();
  }

  // Room for `n` more bytes of a held body under kBufferedBudget.
  bool reserve(size_t n) {
    if (buffered_bytes.fetch_add(n) + n > kBufferedBudget) {
      buffered_bytes.fetch_sub(n);
      return false;
    }
    reserved_ += n;
    return true;
  }
  void release() {
    buffered_bytes.fetch_sub(reserved_);
    reserved_ = 0;
  }

  void over_budget() {
    const std::string why = "the proxy holds " + std::to_string(kBufferedBudget) +
                            " bytes of request bodies to endpoints with credentials already";
    owner_->audit_request(method_, judgement_.verdict.path, "deny", "", why);
    nlohmann::json body = {
        {"error", "proxy_busy"}, {"reason", why}, {"host", o_.host}, {"port", o_.port}};
    respond(503, "Service Unavailable", json_text(body));
  }

  void too_large() {
    owner_->audit_request(method_, judgement_.verdict.path, "deny", "",
                          "a body over " + std::to_string(kMaxBufferedBody) +
                              " bytes to an endpoint with credentials is not inspected");
    nlohmann::json body = {{"error", "body_too_large"},
                           {"reason",
                            "a request body to an endpoint with credentials may be at "
                            "most " +
                                std::to_string(kMaxBufferedBody) + " bytes"},
                           {"host", o_.host},
                           {"port", o_.port}};
    respond(413, "Content Too Large", json_text(body));
  }

  // The request upstream: its head (credentials filled in), then its body,
  // while the response is read.
  void send_request() {
    auto& m = req_->get();
    const auto named = connection_options(m);
    CredentialRequest request;
    request.host = o_.host;
    request.port = o_.port;
    request.method = method_;
    request.target = target_;
    bool placeholder = target_.find(kPlaceholderPrefix) != std::string::npos;
    for (const auto& f : m) {
      std::string name = text::lower(sv(f.name_string()));
      if (is_hop_by_hop(name, named)) continue;
      if (name == "expect" && buffered_) continue;
      placeholder = placeholder || sv(f.value()).find(kPlaceholderPrefix) != std::string_view::npos;
      request.headers.emplace_back(std::string(sv(f.name_string())), std::string(sv(f.value())));
    }
    request.content_type = std::string(sv(m[http::field::content_type]));
    if (buffered_) {
      request.body = std::move(body_);
      std::string().swap(body_);
      placeholder = true;
    }
    if (placeholder || !credentials_->empty()) {
      CredentialResult filled = credentials_->fill(std::move(request));
      if (filled.refused) {
        owner_->audit_request(method_, judgement_.verdict.path, "deny", "credentials",
                              filled.reason);
        nlohmann::json body = {{"error", kCredentialRefusal},
                               {"reason", filled.reason},
                               {"host", o_.host},
                               {"port", o_.port},
                               {"method", method_},
                               {"path", judgement_.verdict.path}};
        return respond(403, "Forbidden", json_text(body));
      }
      request = std::move(filled.request);
    }
    const HttpVerdict& v = judgement_.verdict;
    owner_->audit_request(method_, v.path, v.audit_only ? "audit" : "allow", v.rule,
                          v.audit_only ? v.reason : "");

    std::string head = request.method + " " + request.target + " HTTP/1.1\r\n";
    for (const auto& [name, value] : request.headers) {
      if (has_line_break(name) || has_line_break(value)) {
        nlohmann::json body = {{"error", "malformed_request"},
                               {"reason",
                                "a field holds a line break after its credentials were "
                                "filled in"}};
        return respond(400, "Bad Request", json_text(body));
      }
      head += name;
      head += ": ";
      head += value;
      head += "\r\n";
    }
    if (o_.single_request && m.count(http::field::host) == 0)
      head += "Host: " + authority() + "\r\n";
    chunked_in_ = false;
    if (buffered_) {
      head += "Content-Length: " + std::to_string(request.body.size()) + "\r\n";
    } else if (req_->chunked()) {
      chunked_in_ = true;
      head += "Transfer-Encoding: chunked\r\n";
    } else if (req_->content_length()) {
      head += "Content-Length: " + std::to_string(*req_->content_length()) + "\r\n";
    }
    if (upgrade_)
      head +=
          "Connection: Upgrade\r\nUpgrade: " + std::string(sv(m[http::field::upgrade])) + "\r\n";
    else if (!keep_)
      head += "Connection: close\r\n";
    head += "\r\n";
    if (buffered_) head += request.body;

    request_done_ = response_done_ = false;
    read_response();
    auto self = shared_from_this();
    send(us_, std::move(head), [self] {
      if (self->buffered_) return self->request_sent();
      self->read_body();
    });
  }

  std::string authority() const {
    std::string host = o_.host.find(':') != std::string::npos ? "[" + o_.host + "]" : o_.host;
    return o_.port == scheme_port_ ? host : host + ":" + std::to_string(o_.port);
  }

  // The client's body: read whole before the request goes on (buffered_:
  // credentials may be filled into it, or hide in it), or sent on as it
  // comes, chunked again when it came chunked.
  void read_body() {
    if (req_->is_done()) return buffered_ ? send_request() : request_sent();
    if (!body_buf_) body_buf_ = std::make_unique<char[]>(kBodyChunk);
    req_->get().body().data = body_buf_.get();
    req_->get().body().size = kBodyChunk;
    auto self = shared_from_this();
    http::async_read(cs_, cbuf_, *req_, [self](beast::error_code ec, size_t) {
      if (ec == http::error::need_buffer) ec = {};
      if (ec || self->ended_) return self->end();
      const size_t got = kBodyChunk - self->req_->get().body().size;
      if (self->buffered_) {
        if (self->body_.size() + got > kMaxBufferedBody) return self->too_large();
        if (!self->reserve(got)) return self->over_budget();
        self->body_.append(self->body_buf_.get(), got);
        return self->read_body();
      }
      self->write_body(self->us_, self->body_buf_.get(), got, self->chunked_in_,
                       self->req_->is_done(), [self] { self->read_body(); });
    });
  }

  // `bytes` to `to`, then `then` (unless the session has ended).
  template <class To>
  void send(To& to, std::string bytes, std::function<void()> then) {
    write_body(to, nullptr, 0, false, false, std::move(then), std::move(bytes));
  }

  // `n` bytes of a body to `to`, framed as a chunk when `chunked` (and the
  // last chunk after them when `last`); `pending` (a head) goes first.
  template <class To>
  void write_body(To& to, const char* data, size_t n, bool chunked, bool last,
                  std::function<void()> then, std::string pending = {}) {
    auto frame = std::make_shared<std::array<std::string, 2>>();
    (*frame)[0] = std::move(pending);
    if (chunked && n > 0) (*frame)[0] += hex(n) + "\r\n";
    if (chunked && n > 0) (*frame)[1] = "\r\n";
    if (chunked && last) (*frame)[1] += "0\r\n\r\n";
    std::array<asio::const_buffer, 3> buffers = {asio::buffer((*frame)[0]), asio::buffer(data, n),
                                                 asio::buffer((*frame)[1])};
    auto self = shared_from_this();
    asio::async_write(
        to, buffers,
        [self, frame, then = std::move(then)](const boost::system::error_code& ec, size_t) {
          if (ec || self->ended_) return self->end();
          then();
        });
  }

  void request_sent() {
    request_done_ = true;
    next();
  }

  void read_response() {
    res_.emplace();
    res_->header_limit(kMaxResponseHead);
    res_->body_limit(std::numeric_limits<std::uint64_t>::max());
    if (method_ == "HEAD") res_->skip(true);
    auto self = shared_from_this();
    http::async_read_header(us_, ubuf_, *res_, [self](const beast::error_code& ec, size_t) {
      self->on_response_head(ec);
    });
  }

  void on_response_head(const beast::error_code& ec) {
    if (ended_) return;
    if (ec) {
      owner_->audit_request(method_, judgement_.verdict.path, "deny", "",
                            "the server sent no response (" + ec.message() + ")");
      nlohmann::json body = {
          {"error", "upstream_failed"},
          {"reason", "the server sent no well-formed response (" + ec.message() + ")"},
          {"host", o_.host},
          {"port", o_.port}};
      return respond(502, "Bad Gateway", json_text(body));
    }
    auto& r = res_->get();
    const unsigned status = r.result_int();
    const auto named = connection_options(r);
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " +
                       (sv(r.reason()).empty() ? std::string(sv(http::obsolete_reason(r.result())))
                                               : std::string(sv(r.reason()))) +
                       "\r\n";
    const bool interim = status >= 100 && status < 200 && status != 101;
    const bool switching = status == 101;
    if (switching && !upgrade_) return end();  // 101 to a request that asked for none
    // A body that ends when the server closes is chunked for the client
    // (so it can tell a whole body from a cut one, and keep the connection).
    const bool body = !interim && !switching && !res_->is_done();
    const bool until_close = body && res_->need_eof();
    chunked_out_ = body && (res_->chunked() || until_close);
    if (!interim && !switching) keep_ = keep_ && res_->keep_alive() && !until_close;
    for (const auto& f : r) {
      std::string name = text::lower(sv(f.name_string()));
      if (switching ? (name == "connection" || name == "keep-alive" || name == "proxy-connection")
                    : is_hop_by_hop(name, named))
        continue;
      head += std::string(sv(f.name_string())) + ": " + std::string(sv(f.value())) + "\r\n";
    }
    if (switching) {
      head += "Connection: Upgrade\r\n";
    } else if (!interim) {
      if (chunked_out_)
        head += "Transfer-Encoding: chunked\r\n";
      else if (auto length = res_->content_length())
        head += "Content-Length: " + std::to_string(*length) + "\r\n";
      if (!keep_) head += "Connection: close\r\n";
    }
    head += "\r\n";
    auto self = shared_from_this();
    if (interim) return send(cs_, std::move(head), [self] { self->read_response(); });
    if (switching) return send(cs_, std::move(head), [self] { self->tunnel(); });
    if (!body) return send(cs_, std::move(head), [self] { self->response_sent(); });
    relay_response(std::move(head));
  }

  // The response's body to the client; `head` goes with its first bytes.
  void relay_response(std::string head) {
    if (!response_buf_) response_buf_ = std::make_unique<char[]>(kBodyChunk);
    res_->get().body().data = response_buf_.get();
    res_->get().body().size = kBodyChunk;
    auto self = shared_from_this();
    http::async_read(us_, ubuf_, *res_,
                     [self, head = std::move(head)](beast::error_code ec, size_t) mutable {
                       if (ec == http::error::need_buffer) ec = {};
                       if (self->ended_) return;
                       const size_t got = kBodyChunk - self->res_->get().body().size;
                       // A body until the server closes ends with any end of
                       // its connection (a TLS one without close_notify too).
                       bool last = self->res_->is_done();
                       if (ec && self->res_->need_eof()) {
                         last = true;
                         ec = {};
                       }
                       if (ec) return self->end();
                       self->write_body(
                           self->cs_, self->response_buf_.get(), got, self->chunked_out_, last,
                           [self, last] {
                             if (last) return self->response_sent();
                             self->relay_response({});
                           },
                           std::move(head));
                     });
  }

  void response_sent() {
    response_done_ = true;
    next();
  }

  // After one exchange: the next request, or the end.
  void next() {
    if (!request_done_ || !response_done_ || ended_) return;
    if (!keep_) return close();
    req_.reset();
    res_.reset();
    std::string().swap(body_);
    release();
    arm(o_.idle_timeout);
    read_request();
  }

  // An accepted upgrade: both ways unread, what each side sent past the
  // exchange first.
  void tunnel() {
    pump(cs_, us_, cbuf_, std::make_shared<std::vector<char>>(kBodyChunk));
    pump(us_, cs_, ubuf_, std::make_shared<std::vector<char>>(kBodyChunk));
  }

  template <class From, class To>
  void pump(From& from, To& to, beast::flat_buffer& held, std::shared_ptr<std::vector<char>> buf) {
    auto self = shared_from_this();
    auto again = [self, &from, &to, &held, buf] { self->pump(from, to, held, buf); };
    if (held.size() > 0) {
      std::string bytes(static_cast<const char*>(held.data().data()), held.size());
      held.consume(held.size());
      return send(to, std::move(bytes), again);
    }
    from.async_read_some(asio::buffer(*buf),
                         [self, &to, buf, again](const boost::system::error_code& ec, size_t n) {
                           if (ec || self->ended_) return self->end();
                           self->write_body(to, buf->data(), n, false, false, again);
                         });
  }

  void malformed(int status, const char* text, const std::string& reason) {
    owner_->audit_request(method_, "", "deny", "", reason);
    HttpVerdict v;
    v.malformed = true;
    v.reason = reason;
    respond(status, text, http_malformed_body(v, o_.host, o_.port, method_));
  }

  // A refusal: its response, then the end of the connection.
  void respond(int status, const char* text, const std::string& body) {
    if (ended_) return;
    auto self = shared_from_this();
    send(cs_,
         "HTTP/1.1 " + std::to_string(status) + " " + text +
             "\r\nContent-Type: application/json\r\nContent-Length: " +
             std::to_string(body.size() + 1) + "\r\nConnection: close\r\n\r\n" + body + "\n",
         [self] {
           if (self->req_ && !self->req_->is_done()) {
             self->arm(kDrainWait);
             return self->drain();
           }
           self->close();
         });
  }

  // The rest of a refused request, read and dropped until the client has
  // sent it all and closes, or kDrainWait or kMaxDrain is over.
  void drain() {
    if (!body_buf_) body_buf_ = std::make_unique<char[]>(kBodyChunk);
    auto self = shared_from_this();
    cs_.async_read_some(asio::buffer(body_buf_.get(), kBodyChunk),
                        [self](const boost::system::error_code& ec, size_t n) {
                          if (self->ended_) return;
                          if (ec) return self->close();
                          self->drained_ += n;
                          if (self->drained_ > kMaxDrain) return self->end();
                          self->drain();
                        });
  }

  // The end after a last response: TLS says so first (close_notify), so
  // that the client reads the response as whole; a client that does not
  // answer in kCloseNotifyWait is not waited for.
  void close() {
    if (ended_) return;
    if (!cs_.tls()) {
      boost::system::error_code ignored;
      client_socket_.shutdown(asio::socket_base::shutdown_send, ignored);
      return end();
    }
    arm(kCloseNotifyWait);
    auto self = shared_from_this();
    cs_.tls()->async_shutdown([self](const boost::system::error_code&) { self->end(); });
  }

  void arm(std::chrono::milliseconds after) {
    timer_.expires_after(after);
    auto self = shared_from_this();
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->end();
    });
  }

  void end() {
    if (ended_) return;
    ended_ = true;
    timer_.cancel();
    boost::system::error_code ignored;
    client_socket_.close(ignored);
    upstream_socket_.close(ignored);
  }

  std::shared_ptr<HttpSessionOwner> owner_;
  ClientSocket& client_socket_;
  tcp::socket& upstream_socket_;
  Stream<ClientSocket> cs_;
  Stream<tcp::socket> us_;
  HttpSessionOptions o_;
  asio::steady_timer timer_;
  beast::flat_buffer cbuf_{kMaxHead + kBodyChunk};
  beast::flat_buffer ubuf_{kMaxResponseHead + kBodyChunk};
  std::optional<http::request_parser<http::buffer_body>> req_;
  std::optional<http::response_parser<http::buffer_body>> res_;
  std::unique_ptr<char[]> body_buf_, response_buf_;
  std::shared_ptr<const Credentials> credentials_;
  HttpSessionOwner::Judgement judgement_;
  std::string method_, target_, body_, upstream_error_;
  uint64_t reserved_ = 0;  // of buffered_bytes, for body_
  size_t drained_ = 0;     // bytes of a refused request dropped
  uint16_t scheme_port_ = 80;
  int handshakes_ = 0;
  bool upgrade_ = false, keep_ = false, buffered_ = false;
  bool chunked_in_ = false, chunked_out_ = false;
  bool request_done_ = false, response_done_ = false, ended_ = false;
};

}  // namespace

void start_http_session(std::shared_ptr<HttpSessionOwner> owner, ClientSocket& client,
                        tcp::socket& upstream, HttpSessionOptions options) {
  std::make_shared<Session>(std::move(owner), client, upstream, std::move(options))->start();
}

}  // namespace openshell::egress
