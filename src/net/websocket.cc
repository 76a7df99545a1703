// WebSocket connections, both sides, with queued and ordered sends.
// A server may also take over a connection another process accepted.
#include <sys/random.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <utility>

#include <boost/asio/connect.hpp>
#include <boost/asio/post.hpp>

#include "base/error.h"
#include "base/unique_fd.h"
#include "net/http_internal.h"

namespace openshell::net {
namespace detail {
namespace {

constexpr auto kHandshakeTimeout = std::chrono::seconds(30);

// Beast's mask generator seeds itself from std::random_device, whose
// start-up probes the CPU (cpuid, expensive in a VM) on every client
// process; the kernel's random bytes seed it the same once per process.
void seed_masks_once() {
  static const bool seeded = [] {
    uint32_t words[8] = {};
    size_t got = 0;
    while (got < sizeof words) {
      ssize_t n = ::getrandom(reinterpret_cast<char*>(words) + got, sizeof words - got, 0);
      if (n <= 0 && errno != EINTR) return false;  // beast's own seed then
      if (n > 0) got += static_cast<size_t>(n);
    }
    std::seed_seq seq(std::begin(words), std::end(words));
    websocket::seed_prng(seq);
    return true;
  }();
  (void)seeded;
}

class WebSocketImpl final : public WebSocket, public std::enable_shared_from_this<WebSocketImpl> {
 public:
  explicit WebSocketImpl(Local::socket socket) : ws_((seed_masks_once(), std::move(socket))) {
    ws_.read_message_max(kMessageLimit);
    ws_.auto_fragment(false);
    ws_.write_buffer_bytes(64u << 10);
    websocket::stream_base::timeout timeout{};
    timeout.handshake_timeout = kHandshakeTimeout;
    timeout.idle_timeout = websocket::stream_base::none();
    timeout.keep_alive_pings = false;
    ws_.set_option(timeout);
    // One decorator serves both roles (a second set_option would replace it).
    ws_.set_option(websocket::stream_base::decorator([this](auto& message) {
      if constexpr (std::is_same_v<std::decay_t<decltype(message)>, websocket::response_type>)
        message.set(bhttp::field::server, "openshell");
      else
        message.set(bhttp::field::user_agent, "openshell");
      for (const auto& [name, value] : extra_headers_) message.set(name, value);
    }));
    if (ws_.next_layer().is_open()) peer_ = peer_credentials(ws_.next_layer().native_handle());
  }

  ~WebSocketImpl() override = default;

  void start(MessageHandler on_message, CloseHandler on_close) override {
    if (started_) return;
    started_ = true;
    on_message_ = std::make_shared<MessageHandler>(std::move(on_message));
    on_close_ = std::make_shared<CloseHandler>(std::move(on_close));
    if (finished_) {
      // It ended before anyone listened: tell them from the loop.
      asio::post(ws_.get_executor(), [self = shared_from_this()] { self->deliver_close(); });
      return;
    }
    read_next();
  }

  void send(std::string data, bool binary) override {
    if (finished_ || close_requested_) return;
    queued_bytes_ += data.size();
    queue_.push_back(Message{std::move(data), binary});
    write_next();
  }

  void close(const std::string& reason) override {
    if (finished_ || close_requested_) return;
    close_requested_ = true;
    close_reason_ = reason.substr(0, 123);
    write_next();
  }

  size_t queued_bytes() const override { return queued_bytes_; }
  PeerCredentials peer() const override { return peer_; }
  std::string response_header(std::string_view name) const override {
    for (const auto& [n, v] : response_headers_)
      if (beast::iequals(n, beast::string_view(name.data(), name.size()))) return v;
    return {};
  }
  // Fields added to the upgrade request (client) or its answer (server),
  // before the handshake starts.
  void set_extra_headers(Headers headers) { extra_headers_ = std::move(headers); }

  // Server side: answers the upgrade request.
  void accept(BeastRequest request) {
    ws_.async_accept(request,
                     [self = shared_from_this()](beast::error_code ec) { self->on_handshake(ec); });
  }

  // Client side: connects, then upgrades.
  static void connect(asio::io_context& io, const std::string& socket_path,
                      const std::string& target, Headers headers,
                      std::function<void(std::shared_ptr<WebSocket>, std::string)> done) {
    auto fail_later = [&io, done](std::string reason) {
      asio::post(io, [done, reason = std::move(reason)] {
        guarded(
            "WebSocket connect callback", [&] { done(nullptr, reason); }, nullptr);
      });
    };
    Local::socket socket(io);
    Local::endpoint endpoint;
    try {
      UniqueFd fd = open_unix_socket(socket_path);
      socket.assign(Local(), fd.get());
      fd.release();
      endpoint = Local::endpoint(socket_path);
    } catch (const std::exception& e) {
      fail_later("connect " + socket_path + ": " + e.what());
      return;
    }
    auto ws = std::make_shared<WebSocketImpl>(std::move(socket));
    ws->set_extra_headers(std::move(headers));
    ws->ws_.next_layer().async_connect(
        endpoint, [ws, socket_path, target, done](beast::error_code ec) {
          guarded(
              "WebSocket connect",
              [&] {
                if (ec) {
                  ws->fail("connect " + socket_path + ": " + ec.message());
                  done(nullptr, "connect " + socket_path + ": " + ec.message());
                  return;
                }
                ws->peer_ = peer_credentials(ws->ws_.next_layer().native_handle());
                if (std::string why =
                        untrusted_server(ws->ws_.next_layer().native_handle(), socket_path);
                    !why.empty()) {
                  ws->fail(why);
                  done(nullptr, why);
                  return;
                }
                ws->handshake(target, done);
              },
              [ws] { ws->fail("exception in the connect callback"); });
        });
  }

  // Client side over a socket already connected (TCP, or a TLS pump's end).
  static void connect_over(Local::socket socket, const PeerCredentials& peer,
                           const std::string& target, Headers headers,
                           std::function<void(std::shared_ptr<WebSocket>, std::string)> done) {
    auto ws = std::make_shared<WebSocketImpl>(std::move(socket));
    ws->peer_ = peer;
    ws->set_extra_headers(std::move(headers));
    ws->handshake(target, std::move(done));
  }

  void fail(const std::string& reason) { finish(reason); }

 private:
  struct Message {
    std::string data;
    bool binary;
  };

  using ConnectDone = std::function<void(std::shared_ptr<WebSocket>, std::string)>;

  void handshake(const std::string& target, ConnectDone done) {
    auto response = std::make_shared<websocket::response_type>();
    ws_.async_handshake(*response, "localhost", target,
                        [self = shared_from_this(), response, target, done](beast::error_code ec) {
                          guarded(
                              "WebSocket handshake",
                              [&] { self->on_client_handshake(ec, *response, target, done); },
                              [self] { self->fail("exception in the connect callback"); });
                        });
  }

  void on_client_handshake(beast::error_code ec, const websocket::response_type& response,
                           const std::string& target, const ConnectDone& done) {
    if (ec) {
      std::string reason = "WebSocket upgrade at " + target;
      if (ec == websocket::error::upgrade_declined) {
        // The server's answer says why (e.g. a superseded launch).
        reason += " refused: " + std::to_string(response.result_int());
        if (!response.body().empty()) reason += " " + response.body();
      } else {
        reason += ": " + ec.message();
      }
      fail(reason);
      done(nullptr, reason);
      return;
    }
    for (const auto& field : response)
      response_headers_.emplace_back(str(field.name_string()), str(field.value()));
    on_handshake({});
    done(shared_from_this(), "");
  }

  void on_handshake(beast::error_code ec) {
    guarded(
        "WebSocket handshake",
        [&] {
          if (finished_) return;
          if (ec) {
            finish("WebSocket handshake: " + ec.message());
            return;
          }
          open_ = true;
          read_next();
          write_next();
        },
        [this] { finish("exception after the WebSocket handshake"); });
  }

  void read_next() {
    if (!open_ || !started_ || finished_ || reading_) return;
    reading_ = true;
    ws_.async_read(read_buffer_, [self = shared_from_this()](beast::error_code ec, size_t) {
      self->on_read(ec);
    });
  }

  void on_read(beast::error_code ec) {
    reading_ = false;
    if (finished_) return;
    if (ec) {
      if (ec == websocket::error::closed)
        finish(close_requested_ ? close_reason_ : str(ws_.reason().reason));
      else
        finish(ec.message());
      return;
    }
    std::string data = beast::buffers_to_string(read_buffer_.data());
    read_buffer_.consume(read_buffer_.size());
    if (read_buffer_.capacity() > kReadChunk) read_buffer_.shrink_to_fit();
    bool binary = ws_.got_binary();
    auto handler = on_message_;  // may be released by a close() inside it
    bool ok = true;
    guarded(
        "WebSocket message handler",
        [&] {
          if (handler && *handler) (*handler)(std::move(data), binary);
        },
        [&] { ok = false; });
    if (!ok) {
      finish("exception in the message handler");
      return;
    }
    read_next();
  }

  void write_next() {
    if (!open_ || finished_ || writing_ || closing_) return;
    if (queue_.empty()) {
      if (close_requested_) close_now();
      return;
    }
    writing_ = true;
    Message& message = queue_.front();
    ws_.binary(message.binary);
    ws_.async_write(
        asio::buffer(message.data),
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_write(ec); });
  }

  void on_write(beast::error_code ec) {
    writing_ = false;
    if (!queue_.empty()) {
      if (!finished_) queued_bytes_ -= queue_.front().data.size();
      queue_.pop_front();
    }
    if (finished_) return;
    if (ec) {
      finish(ec.message());
      return;
    }
    guarded(
        "WebSocket write", [&] { write_next(); }, [this] { finish("exception while writing"); });
  }

  void close_now() {
    closing_ = true;
    ws_.async_close(websocket::close_reason(websocket::close_code::normal, close_reason_),
                    [self = shared_from_this()](beast::error_code ec) {
                      if (ec)
                        self->finish(ec.message());
                      else
                        self->finish(self->close_reason_);
                    });
  }

  // Ends the socket (once) and tells on_close.
  void finish(std::string reason) {
    if (finished_) return;
    finished_ = true;
    finish_reason_ = reason.empty() ? "closed" : std::move(reason);
    // A message being written stays until its write completes.
    if (writing_ && !queue_.empty())
      queue_.erase(queue_.begin() + 1, queue_.end());
    else
      queue_.clear();
    queued_bytes_ = 0;
    beast::error_code ignored;
    ws_.next_layer().close(ignored);
    if (started_) deliver_close();
  }

  void deliver_close() {
    auto handler = std::move(on_close_);
    on_message_.reset();
    on_close_.reset();
    if (!handler || !*handler) return;
    guarded(
        "WebSocket close handler", [&] { (*handler)(finish_reason_); }, nullptr);
  }

  websocket::stream<Local::socket, false> ws_;
  PeerCredentials peer_;
  beast::flat_buffer read_buffer_;
  std::deque<Message> queue_;
  size_t queued_bytes_ = 0;
  std::shared_ptr<MessageHandler> on_message_;
  std::shared_ptr<CloseHandler> on_close_;
  std::string close_reason_;
  std::string finish_reason_;
  Headers extra_headers_;         // ours, in the upgrade request or its answer
  Headers response_headers_;      // the server's answer's (client side)
  bool open_ = false;             // handshake done
  bool started_ = false;          // start() called
  bool reading_ = false;          // an async_read is pending
  bool writing_ = false;          // an async_write is pending
  bool close_requested_ = false;  // close() called
  bool closing_ = false;          // async_close started
  bool finished_ = false;         // ended; on_close told or due
};

// A client's way to a TCP endpoint: resolve, connect, the TLS handshake
// (kTls), then the WebSocket's upgrade. Every failure is connect_failure's line.
class TcpConnect : public std::enable_shared_from_this<TcpConnect> {
 public:
  using Done = std::function<void(std::shared_ptr<WebSocket>, std::string)>;
  TcpConnect(asio::io_context& io, Endpoint endpoint, std::string target,
             WebSocket::Headers headers, Done done)
      : io_(io),
        endpoint_(std::move(endpoint)),
        target_(std::move(target)),
        headers_(std::move(headers)),
        done_(std::move(done)),
        resolver_(io),
        socket_(io) {}

  void start() {
    if (endpoint_.kind == Endpoint::Kind::kTls) {
      try {
        context_ = client_tls_context(endpoint_.tls);
      } catch (const std::exception& e) {
        asio::post(io_,
                   [self = shared_from_this(), why = std::string(e.what())] { self->fail(why); });
        return;
      }
    }
    // An address needs no resolver (asio's async one starts a thread).
    beast::error_code literal_ec;
    auto literal = asio::ip::make_address(endpoint_.host, literal_ec);
    if (!literal_ec) {
      remote_ = Tcp::endpoint(literal, endpoint_.port);
      socket_.async_connect(remote_, [self = shared_from_this()](beast::error_code connect_ec) {
        self->on_connect(connect_ec, self->remote_);
      });
      return;
    }
    resolver_.async_resolve(
        endpoint_.host, std::to_string(endpoint_.port), Tcp::resolver::numeric_service,
        [self = shared_from_this()](beast::error_code ec, Tcp::resolver::results_type results) {
          if (ec)
            return self->fail("connect " + self->endpoint_.url() + ": resolve " +
                              self->endpoint_.host + ": " + ec.message());
          asio::async_connect(self->socket_, results,
                              [self](beast::error_code connect_ec, const Tcp::endpoint& remote) {
                                self->on_connect(connect_ec, remote);
                              });
        });
  }

 private:
  void fail(const std::string& why) {
    guarded(
        "WebSocket connect callback", [&] { done_(nullptr, why); }, nullptr);
  }

  void on_connect(beast::error_code ec, const Tcp::endpoint& remote) {
    if (ec) return fail(connect_failure(endpoint_, ec, nullptr));
    if (socket_.is_open()) set_cloexec(socket_.native_handle());
    socket_.set_option(Tcp::no_delay(true), ec);
    peer_.transport = endpoint_.kind == Endpoint::Kind::kTls ? PeerCredentials::Transport::kTls
                                                             : PeerCredentials::Transport::kTcp;
    peer_.uid = static_cast<uid_t>(-1);
    peer_.gid = static_cast<gid_t>(-1);
    peer_.address = address_text(remote);
    if (endpoint_.kind == Endpoint::Kind::kTcp) {
      Local::socket local(io_);
      local.assign(Local(), socket_.release());
      WebSocketImpl::connect_over(std::move(local), peer_, target_, headers_, done_);
      return;
    }
    stream_ = std::make_unique<TlsStream>(std::move(socket_), *context_);
    expect_server_name(*stream_, endpoint_.host);
    stream_->async_handshake(ssl::stream_base::client,
                             [self = shared_from_this()](beast::error_code handshake_ec) {
                               self->on_handshake(handshake_ec);
                             });
  }

  void on_handshake(beast::error_code ec) {
    if (ec) return fail(connect_failure(endpoint_, ec, stream_->native_handle()));
    std::shared_ptr<TlsPump> pump;
    Local::socket local(io_);
    try {
      local = pump_through_socketpair(io_, context_, std::move(stream_), &pump);
    } catch (const std::exception& e) {
      return fail(e.what());
    }
    // Over TLS 1.3 the server judges our certificate after our side of the
    // handshake: its refusal ends the pump, and says more than the upgrade's
    // "End of file".
    Endpoint endpoint = endpoint_;
    Done done = done_;
    WebSocketImpl::connect_over(
        std::move(local), peer_, target_, headers_,
        [pump, endpoint, done](std::shared_ptr<WebSocket> ws, std::string why) {
          if (!ws && pump->tls_error())
            why = connect_failure(endpoint, pump->tls_error(), pump->stream().native_handle());
          done(std::move(ws), std::move(why));
        });
  }

  asio::io_context& io_;
  Endpoint endpoint_;
  std::string target_;
  WebSocket::Headers headers_;
  Done done_;
  Tcp::resolver resolver_;
  Tcp::socket socket_;
  Tcp::endpoint remote_;
  std::shared_ptr<ssl::context> context_;
  std::unique_ptr<TlsStream> stream_;
  PeerCredentials peer_;
};

}  // namespace

std::shared_ptr<WebSocket> accept_websocket(Local::socket socket, BeastRequest request) {
  auto ws = std::make_shared<WebSocketImpl>(std::move(socket));
  ws->accept(std::move(request));
  return ws;
}

std::shared_ptr<WebSocket> failed_websocket(Local::socket socket, const std::string& reason) {
  auto ws = std::make_shared<WebSocketImpl>(std::move(socket));
  ws->fail(reason);
  return ws;
}

}  // namespace detail

using namespace detail;

void WebSocket::connect(asio::io_context& io, const std::string& socket_path,
                        const std::string& target,
                        std::function<void(std::shared_ptr<WebSocket>, std::string error)> done) {
  WebSocketImpl::connect(io, socket_path, target, {}, std::move(done));
}

void WebSocket::connect(asio::io_context& io, const Endpoint& endpoint, const std::string& target,
                        std::function<void(std::shared_ptr<WebSocket>, std::string error)> done) {
  connect(io, endpoint, target, {}, std::move(done));
}

void WebSocket::connect(asio::io_context& io, const Endpoint& endpoint, const std::string& target,
                        Headers headers,
                        std::function<void(std::shared_ptr<WebSocket>, std::string error)> done) {
  if (endpoint.kind == Endpoint::Kind::kUnix)
    return WebSocketImpl::connect(io, endpoint.socket_path, target, std::move(headers),
                                  std::move(done));
  std::make_shared<TcpConnect>(io, endpoint, target, std::move(headers), std::move(done))->start();
}

std::shared_ptr<WebSocket> WebSocket::accept_handed_over(asio::io_context& io, int fd,
                                                         const std::string& raw_request,
                                                         std::string* error,
                                                         Headers response_headers) {
  UniqueFd owned(fd);
  auto failed = [&](const std::string& why) -> std::shared_ptr<WebSocket> {
    if (error) *error = "handed-over connection: " + why;
    return nullptr;
  };
  bhttp::request_parser<bhttp::string_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(kBodyLimit);
  parser.eager(true);
  beast::error_code ec;
  size_t used = parser.put(asio::buffer(raw_request), ec);
  if (ec == bhttp::error::need_more || (!ec && !parser.is_done()))
    return failed("the request is incomplete");
  if (ec) return failed("bad request: " + ec.message());
  if (used != raw_request.size()) return failed("bytes follow the request");
  BeastRequest request = parser.release();
  if (!websocket::is_upgrade(request)) return failed("not a WebSocket upgrade request");
  if (request[bhttp::field::sec_websocket_key].empty() ||
      request[bhttp::field::sec_websocket_version] != "13")
    return failed("the upgrade request lacks Sec-WebSocket-Key or version 13");

  set_cloexec(owned.get());
  Local::socket socket(io);
  socket.assign(Local(), owned.get(), ec);
  if (ec) return failed(ec.message());
  owned.release();
  auto ws = std::make_shared<WebSocketImpl>(std::move(socket));
  ws->set_extra_headers(std::move(response_headers));
  ws->accept(std::move(request));
  return ws;
}

}  // namespace openshell::net
