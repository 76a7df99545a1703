// HTTP/1.1 and WebSocket over Unix sockets with Boost.Beast. This is the only
// translation unit that includes Beast (it is slow to compile).
#include "net/http.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include "base/error.h"
#include "base/log.h"
#include "base/text.h"
#include "base/unique_fd.h"

namespace openshell::net {
namespace {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace websocket = beast::websocket;
using Local = asio::local::stream_protocol;
using BeastRequest = bhttp::request<bhttp::string_body>;
using BeastResponse = bhttp::response<bhttp::string_body>;

constexpr uint64_t kBodyLimit = 16u << 20;
constexpr uint32_t kHeaderLimit = 64u << 10;
constexpr size_t kMessageLimit = 16u << 20;
constexpr size_t kReadChunk = 64u << 10;
constexpr int kBacklog = 1024;
constexpr auto kHandshakeTimeout = std::chrono::seconds(30);
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(100);
constexpr int kRefusalLogBurst = 20;
constexpr auto kRefusalLogWindow = std::chrono::seconds(10);

// --- small helpers -------------------------------------------------------------

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

// The API's error shape: {"error": {"code": ..., "message": ...}}.
std::string error_body(std::string_view code, std::string_view message) {
  return "{\"error\":{\"code\":" + json_string(code) + ",\"message\":" + json_string(message) +
         "}}";
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// nullopt for a malformed escape or an encoded NUL (never a valid name).
std::optional<std::string> percent_decode(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    int high = hex_value(text[i + 1]), low = hex_value(text[i + 2]);
    if (high < 0 || low < 0 || (high == 0 && low == 0)) return std::nullopt;
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

std::string str(beast::string_view text) { return std::string(text.data(), text.size()); }

std::string lower(beast::string_view text) { return text::lower({text.data(), text.size()}); }

// Fills the parts of request that come from the target; false when malformed.
bool parse_target(std::string_view target, Request& request) {
  if (target.empty() || target[0] != '/') return false;
  size_t question = target.find('?');
  std::string_view path = target.substr(0, question);
  auto decoded = percent_decode(path);
  if (!decoded) return false;
  request.path = std::move(*decoded);
  for (size_t start = 1; start <= path.size();) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    if (end > start) {
      auto segment = percent_decode(path.substr(start, end - start));
      if (!segment) return false;
      request.segments.push_back(std::move(*segment));
    }
    start = end + 1;
  }
  if (question == std::string_view::npos) return true;
  std::string_view query = target.substr(question + 1);
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t equals = pair.find('=');
    auto name = percent_decode(pair.substr(0, equals));
    auto value = percent_decode(equals == std::string_view::npos ? std::string_view()
                                                                 : pair.substr(equals + 1));
    if (!name || !value) return false;
    request.query[std::move(*name)] = std::move(*value);
  }
  return true;
}

PeerCredentials peer_credentials(int fd) {
  PeerCredentials peer;
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) == 0) {
    peer.pid = cred.pid;
    peer.uid = cred.uid;
    peer.gid = cred.gid;
  } else {
    // Never let a failed lookup read as root.
    peer.pid = 0;
    peer.uid = static_cast<uid_t>(-1);
    peer.gid = static_cast<gid_t>(-1);
  }
  return peer;
}

void set_cloexec(int fd) {
  int flags = ::fcntl(fd, F_GETFD);
  if (flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

// Asio opens sockets without SOCK_CLOEXEC; ours must not leak into children.
UniqueFd open_unix_socket(const std::string& what) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("socket for " + what);
  return fd;
}

bool fill_address(const std::string& path, sockaddr_un& address) {
  address = {};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path) return false;
  std::memcpy(address.sun_path, path.data(), path.size());
  return true;
}

// True when something accepts connections on path (a live server, not a
// stale file). A full backlog (EAGAIN) also means a live server.
bool server_listens(const std::string& path) {
  sockaddr_un address;
  if (!fill_address(path, address)) return false;
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd) return false;
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0) return true;
  return errno == EAGAIN || errno == EINPROGRESS;
}

template <class F>
void guarded(const char* what, F&& body, const std::function<void()>& on_exception) {
  try {
    body();
  } catch (const std::exception& e) {
    log::warn(std::string(what) + ": " + e.what());
    if (on_exception) on_exception();
  } catch (...) {
    log::warn(std::string(what) + ": unknown exception");
    if (on_exception) on_exception();
  }
}

// --- WebSocket -------------------------------------------------------------------

class WebSocketImpl final : public WebSocket, public std::enable_shared_from_this<WebSocketImpl> {
 public:
  explicit WebSocketImpl(Local::socket socket) : ws_(std::move(socket)) {
    ws_.read_message_max(kMessageLimit);
    ws_.auto_fragment(false);
    ws_.write_buffer_bytes(64u << 10);
    websocket::stream_base::timeout timeout{};
    timeout.handshake_timeout = kHandshakeTimeout;
    timeout.idle_timeout = websocket::stream_base::none();
    timeout.keep_alive_pings = false;
    ws_.set_option(timeout);
    // One decorator serves both roles (a second set_option would replace it).
    ws_.set_option(websocket::stream_base::decorator([](auto& message) {
      if constexpr (std::is_same_v<std::decay_t<decltype(message)>, websocket::response_type>)
        message.set(bhttp::field::server, "openshell");
      else
        message.set(bhttp::field::user_agent, "openshell");
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

  // Server side: answers the upgrade request.
  void accept(BeastRequest request) {
    ws_.async_accept(request,
                     [self = shared_from_this()](beast::error_code ec) { self->on_handshake(ec); });
  }

  // Client side: connects, then upgrades.
  static void connect(asio::io_context& io, const std::string& socket_path,
                      const std::string& target,
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
  bool open_ = false;             // handshake done
  bool started_ = false;          // start() called
  bool reading_ = false;          // an async_read is pending
  bool writing_ = false;          // an async_write is pending
  bool close_requested_ = false;  // close() called
  bool closing_ = false;          // async_close started
  bool finished_ = false;         // ended; on_close told or due
};

// --- server ------------------------------------------------------------------------

class Connection;

struct ServerState : std::enable_shared_from_this<ServerState> {
  ServerState(asio::io_context& io, Server::Handler handler, ServerLimits limits)
      : io(io), handler(std::move(handler)), limits(limits), acceptor(io), retry_timer(io) {}

  void accept_next();
  void stop_listening();
  void close_connections();
  // Whether a connection from this peer may be served; else it was answered
  // and closed.
  bool admit(Local::socket& socket);
  // A refused or cut-off connection's log line: at most kRefusalLogBurst in
  // each kRefusalLogWindow, so that a client looping on them cannot fill
  // the log; how many were left out is said when logging resumes.
  void log_refusal(const std::string& line);

  asio::io_context& io;
  Server::Handler handler;
  ServerLimits limits;
  Server::Admission admission;
  std::map<uid_t, size_t> connections_per_uid;
  std::chrono::steady_clock::time_point refusal_window_start;
  int refusals_logged = 0;
  long refusals_unlogged = 0;
  Local::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::string path;
  dev_t dev = 0;
  ino_t ino = 0;
  bool stopping = false;
  std::map<Connection*, std::weak_ptr<Connection>> connections;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<ServerState> server, Local::socket socket)
      : server_(std::move(server)), socket_(std::move(socket)), deadline_(server_->io) {
    peer_ = peer_credentials(socket_.native_handle());
  }
  ~Connection() { forget(); }

  void start() {
    server_->connections[this] = weak_from_this();
    ++server_->connections_per_uid[peer_.uid];
    counted_ = true;
    // A fresh connection owes its first request's head at once.
    wait_for(Wait::head);
    read_request();
  }

  const PeerCredentials& peer() const { return peer_; }

  void respond(Response answer) {
    if (state_ != State::handling) return;
    state_ = State::writing;
    auto response = std::make_shared<BeastResponse>();
    response->version(version_);
    int status = answer.status;
    if (status < 200 || status > 999) status = 500;
    response->result(static_cast<unsigned>(status));
    response->set(bhttp::field::server, "openshell");
    if (status == 204 || status == 304) answer.body.clear();
    if (!answer.body.empty() && !answer.content_type.empty())
      response->set(bhttp::field::content_type, answer.content_type);
    response->body() = std::move(answer.body);
    write(std::move(response), keep_alive_ && !server_->stopping);
  }

  std::shared_ptr<WebSocket> upgrade() {
    state_ = State::gone;
    forget();
    auto ws = std::make_shared<WebSocketImpl>(std::move(socket_));
    if (buffer_.size() > 0) {
      // A client must wait for the 101 before it sends frames.
      ws->fail("data arrived before the WebSocket handshake");
      return ws;
    }
    ws->accept(parser_->release());
    return ws;
  }

  int release() {
    if (buffer_.size() > 0)
      throw Error("hand over the API connection: " + std::to_string(buffer_.size()) +
                  " bytes after the request were already read from it");
    int fd = ::fcntl(socket_.native_handle(), F_DUPFD_CLOEXEC, 0);
    if (fd < 0) throw_errno("hand over the API connection: dup");
    state_ = State::gone;
    forget();
    beast::error_code ignored;
    socket_.close(ignored);
    return fd;
  }

  // The server stops: an idle connection closes now, a busy one after its answer.
  void on_server_stop() {
    if (state_ == State::reading) close();
  }

  void close() {
    if (state_ != State::gone) state_ = State::closed;
    beast::error_code ignored;
    socket_.close(ignored);
    forget();
  }

 private:
  enum class State { reading, handling, writing, closed, gone };

  void forget() {
    deadline_.cancel();
    if (!server_) return;
    server_->connections.erase(this);
    if (counted_) {
      counted_ = false;
      auto it = server_->connections_per_uid.find(peer_.uid);
      if (it != server_->connections_per_uid.end() && --it->second == 0)
        server_->connections_per_uid.erase(it);
    }
  }

  // What the connection's deadline waits for.
  enum class Wait { none, idle, head, body, refusal };

  // (Re)arms the deadline; Wait::none cancels it.
  void wait_for(Wait what) {
    waiting_for_ = what;
    if (what == Wait::none) {
      deadline_.cancel();
      return;
    }
    const ServerLimits& limits = server_->limits;
    deadline_.expires_after(what == Wait::idle   ? limits.idle_timeout
                            : what == Wait::body ? limits.body_timeout
                                                 : limits.header_timeout);
    deadline_.async_wait([weak = weak_from_this(), what](beast::error_code ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->guard([&] { self->on_deadline(what); });
    });
  }

  void on_deadline(Wait what) {
    if (what != waiting_for_ || state_ == State::gone || state_ == State::closed) return;
    if (what == Wait::refusal || state_ != State::reading) {
      // An answer the client does not take, or a refusal it does not read.
      close();
      return;
    }
    if (what == Wait::idle) {
      close();  // a keep-alive connection nobody uses any more
      return;
    }
    auto limit = what == Wait::head ? server_->limits.header_timeout : server_->limits.body_timeout;
    std::string why =
        what == Wait::head ? "no complete request head within " : "the request body stalled for ";
    why += std::to_string(limit.count()) + " ms";
    server_->log_refusal("API: closing a connection from uid " + std::to_string(peer_.uid) +
                         " (pid " + std::to_string(peer_.pid) + "): " + why);
    answer_and_close(408, "request_timeout", why);
  }

  template <class F>
  void guard(F&& body) {
    guarded("API connection", std::forward<F>(body), [this] { close(); });
  }

  void read_request() {
    if (server_->stopping) {
      close();
      return;
    }
    // After an answer: keep-alive, unless the next request has begun (pipelined).
    if (state_ != State::reading) wait_for(buffer_.size() > 0 ? Wait::head : Wait::idle);
    state_ = State::reading;
    parser_.emplace();
    parser_->header_limit(kHeaderLimit);
    parser_->body_limit(kBodyLimit);
    raw_.clear();
    continue_sent_ = false;
    parse_and_read();
  }

  // Parses what is buffered; reads more while the parser needs it.
  void parse_and_read() {
    while (buffer_.size() > 0 && !parser_->is_done()) {
      beast::error_code ec;
      auto data = buffer_.data();
      size_t used = parser_->put(data, ec);
      raw_.append(static_cast<const char*>(data.data()), used);
      buffer_.consume(used);
      if (ec == bhttp::error::need_more) break;
      if (ec) {
        bad_request(ec.message());
        return;
      }
      if (used == 0) break;
    }
    if (parser_->is_done()) {
      dispatch();
      return;
    }
    if (parser_->is_header_done() && !continue_sent_ &&
        beast::iequals(parser_->get()[bhttp::field::expect], "100-continue")) {
      // curl waits a second for this before it sends a larger body.
      continue_sent_ = true;
      static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      asio::async_write(socket_, asio::buffer(kContinue),
                        [self = shared_from_this()](beast::error_code ec, size_t) {
                          self->guard([&] {
                            if (ec)
                              self->close();
                            else
                              self->parse_and_read();
                          });
                        });
      return;
    }
    socket_.async_read_some(buffer_.prepare(kReadChunk),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->guard([&] { self->on_read(ec, n); });
                            });
  }

  void on_read(beast::error_code ec, size_t n) {
    if (state_ != State::reading) return;
    if (ec) {
      // EOF between requests is the client's normal goodbye.
      if (ec == asio::error::eof && parser_->got_some())
        bad_request("the request ended early");
      else
        close();
      return;
    }
    buffer_.commit(n);
    // The first byte of a request starts its head's clock; a body's clock
    // restarts with every byte of it.
    if (waiting_for_ == Wait::idle) wait_for(Wait::head);
    parse_and_read();
    if (state_ == State::reading && parser_ && parser_->is_header_done()) wait_for(Wait::body);
  }

  void dispatch() {
    BeastRequest& message = parser_->get();
    Request request;
    request.method = str(message.method_string());
    request.target = str(message.target());
    if (!parse_target(request.target, request)) {
      bad_request("malformed target " + request.target);
      return;
    }
    for (const auto& field : message) {
      std::string name = lower(field.name_string());
      auto [it, fresh] = request.headers.emplace(name, str(field.value()));
      if (!fresh) it->second += ", " + str(field.value());
    }
    request.body = std::move(message.body());
    request.websocket = websocket::is_upgrade(message);
    request.raw = std::move(raw_);
    raw_.clear();
    version_ = message.version();
    keep_alive_ = message.keep_alive();
    state_ = State::handling;
    wait_for(Wait::none);  // a handler may take its time (it waits for a sandbox)

    auto handler = server_->handler;
    if (!handler) {
      close();
      return;
    }
    auto exchange = make_exchange(std::move(request));
    try {
      handler(exchange);
    } catch (const std::exception& e) {
      log::warn("API handler for " + exchange->request().method + " " + exchange->request().target +
                ": " + e.what());
      fail_exchange(*exchange, e.what());
    } catch (...) {
      log::warn("API handler: unknown exception");
      fail_exchange(*exchange, "unknown exception");
    }
  }

  std::shared_ptr<Exchange> make_exchange(Request request);
  static void fail_exchange(Exchange& exchange, const std::string& what);

  void bad_request(const std::string& why) {
    answer_and_close(400, "bad_request", "bad request: " + why);
  }

  void answer_and_close(unsigned status, const std::string& code, const std::string& message) {
    state_ = State::handling;
    version_ = 11;
    auto response = std::make_shared<BeastResponse>();
    response->version(11);
    response->result(status);
    response->set(bhttp::field::server, "openshell");
    response->set(bhttp::field::content_type, "application/json");
    response->body() = error_body(code, message);
    state_ = State::writing;
    // The answer goes out or the connection goes.
    wait_for(Wait::refusal);
    write(std::move(response), false);
  }

  void write(std::shared_ptr<BeastResponse> response, bool keep_alive) {
    response->keep_alive(keep_alive);
    response->prepare_payload();
    bhttp::async_write(
        socket_, *response,
        [self = shared_from_this(), response, keep_alive](beast::error_code ec, size_t) {
          self->guard([&] {
            if (self->state_ != State::writing) return;
            if (ec || !keep_alive) {
              beast::error_code ignored;
              self->socket_.shutdown(Local::socket::shutdown_send, ignored);
              self->close();
              return;
            }
            self->read_request();
          });
        });
  }

  std::shared_ptr<ServerState> server_;
  Local::socket socket_;
  PeerCredentials peer_;
  asio::steady_timer deadline_;
  Wait waiting_for_ = Wait::none;
  bool counted_ = false;  // in server_->connections_per_uid
  beast::flat_buffer buffer_;
  std::optional<bhttp::request_parser<bhttp::string_body>> parser_;
  std::string raw_;
  State state_ = State::reading;
  unsigned version_ = 11;
  bool keep_alive_ = false;
  bool continue_sent_ = false;
};

class ExchangeImpl final : public Exchange {
 public:
  ExchangeImpl(std::shared_ptr<Connection> connection, Request request)
      : connection_(std::move(connection)), request_(std::move(request)) {}

  const Request& request() const override { return request_; }
  PeerCredentials peer() const override { return connection_->peer(); }

  void respond(Response response) override {
    if (answered_) {
      log::warn("API: a second answer to " + request_.method + " " + request_.target +
                " was ignored");
      return;
    }
    answered_ = true;
    connection_->respond(std::move(response));
  }

  std::shared_ptr<WebSocket> upgrade() override {
    if (answered_) throw Error("upgrade " + request_.target + ": the request was already answered");
    answered_ = true;
    return connection_->upgrade();
  }

  int release() override {
    if (answered_)
      throw Error("hand over " + request_.target + ": the request was already answered");
    int fd = connection_->release();  // throws before anything changed
    answered_ = true;
    return fd;
  }

  bool answered() const { return answered_; }

 private:
  std::shared_ptr<Connection> connection_;
  Request request_;
  bool answered_ = false;
};

std::shared_ptr<Exchange> Connection::make_exchange(Request request) {
  return std::make_shared<ExchangeImpl>(shared_from_this(), std::move(request));
}

void Connection::fail_exchange(Exchange& exchange, const std::string& what) {
  auto& impl = static_cast<ExchangeImpl&>(exchange);
  if (!impl.answered())
    impl.respond(Response{500, error_body("internal", "internal error: " + what)});
}

void ServerState::accept_next() {
  acceptor.async_accept([self = shared_from_this()](beast::error_code ec, Local::socket socket) {
    if (ec == asio::error::operation_aborted || !self->acceptor.is_open()) return;
    if (ec) {
      // Out of descriptors and the like: retry soon rather than spin.
      log::warn("accept on " + self->path + ": " + ec.message());
      self->retry_timer.expires_after(kAcceptRetryDelay);
      self->retry_timer.async_wait([self](beast::error_code wait_ec) {
        if (!wait_ec && self->acceptor.is_open()) self->accept_next();
      });
      return;
    }
    guarded(
        "API accept",
        [&] {
          set_cloexec(socket.native_handle());
          if (self->admit(socket)) std::make_shared<Connection>(self, std::move(socket))->start();
        },
        nullptr);
    self->accept_next();
  });
}

// A refusal is written at once, without waiting: it is small and the socket
// is fresh. The client still reads it after the close (a Unix socket keeps
// what was sent), even when its own request was never read.
bool ServerState::admit(Local::socket& socket) {
  int fd = socket.native_handle();
  PeerCredentials peer = peer_credentials(fd);
  std::optional<Refusal> refusal;
  if (admission) refusal = admission(fd, peer);
  if (!refusal && limits.max_connections_per_uid > 0) {
    auto it = connections_per_uid.find(peer.uid);
    if (it != connections_per_uid.end() && it->second >= limits.max_connections_per_uid)
      refusal = Refusal{503, "too_many_connections",
                        "uid " + std::to_string(peer.uid) + " already has " +
                            std::to_string(it->second) + " connections open (the limit is " +
                            std::to_string(limits.max_connections_per_uid) + ")"};
  }
  if (!refusal) return true;
  log_refusal("API: refused a connection from uid " + std::to_string(peer.uid) + " (pid " +
              std::to_string(peer.pid) + "): " + refusal->message);
  std::string body = error_body(refusal->code, refusal->message);
  int status = refusal->status >= 400 && refusal->status <= 599 ? refusal->status : 403;
  const char* reason = status == 403   ? "Forbidden"
                       : status == 503 ? "Service Unavailable"
                                       : "Refused";
  std::string answer =
      "HTTP/1.1 " + std::to_string(status) + " " + reason +
      "\r\nServer: openshell\r\nContent-Type: application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
  ssize_t ignored = ::send(fd, answer.data(), answer.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  (void)ignored;
  ::shutdown(fd, SHUT_WR);
  beast::error_code ec;
  socket.close(ec);
  return false;
}

void ServerState::log_refusal(const std::string& line) {
  auto now = std::chrono::steady_clock::now();
  if (now - refusal_window_start >= kRefusalLogWindow) {
    if (refusals_unlogged > 0)
      log::warn("API: " + std::to_string(refusals_unlogged) +
                " more refused or cut-off connections were not logged");
    refusal_window_start = now;
    refusals_logged = 0;
    refusals_unlogged = 0;
  }
  if (refusals_logged >= kRefusalLogBurst) {
    ++refusals_unlogged;
    return;
  }
  ++refusals_logged;
  log::warn(line);
}

void ServerState::stop_listening() {
  stopping = true;
  if (!acceptor.is_open()) return;
  beast::error_code ignored;
  acceptor.close(ignored);
  retry_timer.cancel();
  // Remove the socket file, unless another server has replaced it since.
  struct stat st;
  if (!path.empty() && ::lstat(path.c_str(), &st) == 0 && st.st_dev == dev && st.st_ino == ino)
    ::unlink(path.c_str());
  // Copy: closing a connection removes it from the map.
  std::vector<std::shared_ptr<Connection>> open;
  for (auto& [raw, weak] : connections)
    if (auto connection = weak.lock()) open.push_back(connection);
  for (auto& connection : open) connection->on_server_stop();
}

void ServerState::close_connections() {
  std::vector<std::shared_ptr<Connection>> open;
  for (auto& [raw, weak] : connections)
    if (auto connection = weak.lock()) open.push_back(connection);
  for (auto& connection : open) connection->close();
  connections.clear();
}

}  // namespace

struct Server::Impl : ServerState {
  using ServerState::ServerState;
};

namespace {

// A limit from the environment: a decimal number, at least 1.
template <class T>
void limit_from_env(const char* name, T* value) {
  const char* text = std::getenv(name);
  if (!text || !*text) return;
  auto parsed = text::parse_uint(text, 86400000);
  if (!parsed || *parsed == 0)
    throw Error(std::string(name) + "=" + text + ": expected a whole number from 1 to 86400000");
  if constexpr (std::is_same_v<T, size_t>)
    *value = static_cast<size_t>(*parsed);
  else
    *value = std::chrono::milliseconds(*parsed);
}

}  // namespace

ServerLimits ServerLimits::from_environment() {
  ServerLimits limits;
  limit_from_env("OPENSHELL_API_HEADER_TIMEOUT_MS", &limits.header_timeout);
  limit_from_env("OPENSHELL_API_BODY_TIMEOUT_MS", &limits.body_timeout);
  limit_from_env("OPENSHELL_API_IDLE_TIMEOUT_MS", &limits.idle_timeout);
  limit_from_env("OPENSHELL_API_MAX_CONNECTIONS_PER_UID", &limits.max_connections_per_uid);
  return limits;
}

Server::Server(asio::io_context& io, Handler handler, ServerLimits limits)
    : impl_(std::make_shared<Impl>(io, std::move(handler), limits)) {}

void Server::set_admission(Admission admission) { impl_->admission = std::move(admission); }

Server::~Server() {
  close();
  impl_->handler = nullptr;
  impl_->close_connections();
}

void Server::listen(const std::string& socket_path, unsigned mode) {
  ServerState& state = *impl_;
  if (state.acceptor.is_open())
    throw Error("listen on " + socket_path + ": already listening on " + state.path);
  sockaddr_un address;
  if (!fill_address(socket_path, address))
    throw Error("listen on " + socket_path + ": the path is empty or too long for a socket");

  struct stat st;
  if (::lstat(socket_path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode))
      throw Error("listen on " + socket_path + ": the path exists and is not a socket");
    if (server_listens(socket_path))
      throw Error("listen on " + socket_path + ": another server listens there");
    if (::unlink(socket_path.c_str()) != 0 && errno != ENOENT)
      throw_errno("remove the stale socket " + socket_path);
  } else if (errno != ENOENT) {
    throw_errno("listen on " + socket_path);
  }

  UniqueFd fd = open_unix_socket(socket_path);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0)
    throw_errno("bind " + socket_path);
  // Before listen(): nobody can connect while the mode is still the umask's.
  if (::chmod(socket_path.c_str(), mode) != 0) {
    int err = errno;
    ::unlink(socket_path.c_str());
    throw_errno("chmod " + socket_path, err);
  }
  if (::listen(fd.get(), kBacklog) != 0 || ::stat(socket_path.c_str(), &st) != 0) {
    int err = errno;
    ::unlink(socket_path.c_str());
    throw_errno("listen on " + socket_path, err);
  }
  beast::error_code ec;
  state.acceptor.assign(Local(), fd.get(), ec);
  if (ec) {
    ::unlink(socket_path.c_str());
    throw Error("listen on " + socket_path + ": " + ec.message());
  }
  fd.release();
  state.path = socket_path;
  state.dev = st.st_dev;
  state.ino = st.st_ino;
  state.stopping = false;
  state.accept_next();
}

void Server::close() { impl_->stop_listening(); }

void WebSocket::connect(asio::io_context& io, const std::string& socket_path,
                        const std::string& target,
                        std::function<void(std::shared_ptr<WebSocket>, std::string error)> done) {
  WebSocketImpl::connect(io, socket_path, target, std::move(done));
}

std::shared_ptr<WebSocket> WebSocket::accept_handed_over(asio::io_context& io, int fd,
                                                         const std::string& raw_request,
                                                         std::string* error) {
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
  ws->accept(std::move(request));
  return ws;
}

// --- client ----------------------------------------------------------------------

std::string untrusted_server(int fd, const std::string& socket_path) {
  ucred cred{};
  socklen_t length = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &length) != 0)
    return errno_message("the server at " + socket_path + ": its credentials (SO_PEERCRED)", errno);
  uid_t own = ::geteuid();
  if (cred.uid == own || cred.uid == 0) return "";
  return "the server at " + socket_path + " runs as uid " + std::to_string(cred.uid) +
         ", not as you (uid " + std::to_string(own) +
         ") or root: refusing to talk to it (someone else may be impersonating the gateway)";
}

struct Client::Impl {
  explicit Impl(std::string path) : path(std::move(path)) {}

  void connect() {
    buffer.clear();
    sockaddr_un address;
    if (!fill_address(path, address))
      throw ConnectError(errno_message("connect " + path, ENAMETOOLONG), ENAMETOOLONG);
    UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) {
      int err = errno;
      throw ConnectError(errno_message("socket for " + path, err), err);
    }
    int rc;
    do {
      rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address);
    } while (rc != 0 && errno == EINTR);
    if (rc != 0) {
      int err = errno;
      throw ConnectError(errno_message("connect " + path, err), err);
    }
    if (std::string why = untrusted_server(fd.get(), path); !why.empty()) throw Error(why);
    beast::error_code ec;
    socket.assign(Local(), fd.get(), ec);
    if (ec) throw ConnectError("connect " + path + ": " + ec.message(), ec.value());
    fd.release();
  }

  [[noreturn]] void connection_failed(beast::error_code ec) {
    beast::error_code ignored;
    socket.close(ignored);
    if (ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::broken_pipe || ec == bhttp::error::end_of_stream ||
        ec == bhttp::error::partial_message)
      throw Error("the gateway closed the connection");
    throw Error("talk to the gateway at " + path + ": " + ec.message());
  }

  asio::io_context io;
  Local::socket socket{io};
  beast::flat_buffer buffer;
  std::string path;
};

Client::Client(const std::string& socket_path) : impl_(std::make_unique<Impl>(socket_path)) {
  impl_->connect();
}

Client::~Client() = default;

Response Client::request(const std::string& method, const std::string& target,
                         const std::string& body) {
  // A connection the server has closed since (its keep-alive or head
  // deadline passed while we were busy) reads as ready: start afresh.
  if (impl_->socket.is_open()) {
    pollfd p{impl_->socket.native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0) {
      beast::error_code ignored;
      impl_->socket.close(ignored);
      try {
        impl_->connect();
      } catch (const ConnectError&) {
        throw Error("the gateway closed the connection");  // and is gone
      }
    }
  }
  if (!impl_->socket.is_open()) impl_->connect();
  BeastRequest request;
  bhttp::verb verb = bhttp::string_to_verb(method);
  if (verb == bhttp::verb::unknown)
    request.method_string(method);
  else
    request.method(verb);
  request.target(target);
  request.version(11);
  request.set(bhttp::field::host, "localhost");
  request.set(bhttp::field::user_agent, "openshell");
  request.keep_alive(true);
  if (!body.empty()) {
    request.set(bhttp::field::content_type, "application/json");
    request.body() = body;
  }
  request.prepare_payload();

  beast::error_code write_ec;
  bhttp::write(impl_->socket, request, write_ec);
  // A server that refuses a connection answers and closes it before it reads
  // the request: its answer may still be there to read.
  bool unsent = write_ec &&
                (write_ec == asio::error::broken_pipe || write_ec == asio::error::connection_reset);
  if (write_ec && !unsent) impl_->connection_failed(write_ec);

  beast::error_code ec;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(boost::none);
  bhttp::read(impl_->socket, impl_->buffer, parser, ec);
  if (ec) impl_->connection_failed(unsent ? write_ec : ec);
  bool keep_alive = parser.keep_alive();
  BeastResponse& message = parser.get();
  Response response;
  response.status = static_cast<int>(message.result_int());
  response.content_type = str(message[bhttp::field::content_type]);
  response.body = std::move(message.body());
  if (!keep_alive) {
    beast::error_code ignored;
    impl_->socket.close(ignored);
  }
  return response;
}

std::string percent_encode(std::string_view text) {
  static const char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    auto byte = static_cast<unsigned char>(c);
    if ((byte >= 'A' && byte <= 'Z') || (byte >= 'a' && byte <= 'z') ||
        (byte >= '0' && byte <= '9') || byte == '-' || byte == '.' || byte == '_' || byte == '~') {
      out += c;
    } else {
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 15];
    }
  }
  return out;
}

}  // namespace openshell::net
