// The API server: accepting, admitting, reading and answering requests.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/asio/ip/v6_only.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <openssl/err.h>
#include <openssl/x509.h>

#include "base/error.h"
#include "base/log.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "net/http_internal.h"

namespace openshell::net {

using namespace detail;

namespace {

constexpr int kBacklog = 1024;
constexpr auto kAcceptRetryDelay = std::chrono::milliseconds(100);
constexpr int kRefusalLogBurst = 20;
constexpr auto kRefusalLogWindow = std::chrono::seconds(10);

std::string lower(beast::string_view text) { return text::lower({text.data(), text.size()}); }

// --- server ------------------------------------------------------------------------

class Connection;
struct TcpListener;

// Whom the per-peer connection cap counts: a uid on the Unix socket, a
// certificate's subject over TLS, a client address over plain TCP.
std::string peer_key(const PeerCredentials& peer) {
  switch (peer.transport) {
    case PeerCredentials::Transport::kUnix:
      return "uid " + std::to_string(peer.uid);
    case PeerCredentials::Transport::kTls:
      return "subject " + peer.subject;
    case PeerCredentials::Transport::kTcp:
      break;
  }
  auto colon = peer.address.rfind(':');
  return "address " + peer.address.substr(0, colon);
}

// The peer as a log line names it.
std::string peer_text(const PeerCredentials& peer) {
  switch (peer.transport) {
    case PeerCredentials::Transport::kUnix:
      return "uid " + std::to_string(peer.uid) + " (pid " + std::to_string(peer.pid) + ")";
    case PeerCredentials::Transport::kTls:
      return "'" + peer.subject + "' at " + peer.address;
    case PeerCredentials::Transport::kTcp:
      break;
  }
  return peer.address;
}

struct ServerState : std::enable_shared_from_this<ServerState> {
  ServerState(asio::io_context& io, Server::Handler handler, ServerLimits limits)
      : io(io), handler(std::move(handler)), limits(limits), acceptor(io), retry_timer(io) {}

  void accept_next();
  void accept_tcp(const std::shared_ptr<TcpListener>& listener);
  // Serves a connection whose peer is known (a TLS one: its socketpair's end).
  void serve(Local::socket socket, const PeerCredentials& peer);
  void stop_listening();
  void close_connections();
  // Whether a connection from this peer may be served; else it was answered
  // and closed.
  bool admit(Local::socket& socket, const PeerCredentials& peer);
  // A refused or cut-off connection's log line: at most kRefusalLogBurst in
  // each kRefusalLogWindow, so that a client looping on them cannot fill
  // the log; how many were left out is said when logging resumes.
  void log_refusal(const std::string& line);

  asio::io_context& io;
  Server::Handler handler;
  ServerLimits limits;
  Server::Admission admission;
  std::map<std::string, size_t> connections_per_peer;  // peer_key()
  // TLS connections before their handshake's end, by client address: the
  // cap holds for them too, before there is a subject to count.
  std::map<std::string, size_t> handshakes_per_address;
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
  std::vector<std::shared_ptr<TcpListener>> tcp_listeners;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<ServerState> server, Local::socket socket, PeerCredentials peer)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        peer_(std::move(peer)),
        peer_key_(peer_key(peer_)),
        deadline_(server_->io) {}
  ~Connection() { forget(); }

  void start() {
    server_->connections[this] = weak_from_this();
    ++server_->connections_per_peer[peer_key_];
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
    // A client must wait for the 101 before it sends frames.
    if (buffer_.size() > 0)
      return failed_websocket(std::move(socket_), "data arrived before the WebSocket handshake");
    return accept_websocket(std::move(socket_), parser_->release());
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
      auto it = server_->connections_per_peer.find(peer_key_);
      if (it != server_->connections_per_peer.end() && --it->second == 0)
        server_->connections_per_peer.erase(it);
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
    server_->log_refusal("API: closing a connection from " + peer_text(peer_) + ": " + why);
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
  std::string peer_key_;
  asio::steady_timer deadline_;
  Wait waiting_for_ = Wait::none;
  bool counted_ = false;  // in server_->connections_per_peer
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

// --- TCP and TLS listeners ----------------------------------------------------------

// The TLS files a listener serves, reloaded when they change on disk: looked
// at (stat) at most once a second, as connections arrive. A new set that
// does not load keeps the old one, and says so once.
class TlsFilesWatch {
 public:
  explicit TlsFilesWatch(TlsFiles files)
      : files_(std::move(files)), seen_(stamp()), context_(server_tls_context(files_)) {
    last_look_ = std::chrono::steady_clock::now();
  }

  std::shared_ptr<ssl::context> current() {
    auto now = std::chrono::steady_clock::now();
    if (now - last_look_ < std::chrono::seconds(1)) return context_;
    last_look_ = now;
    std::string stamped = stamp();
    if (stamped == seen_) return context_;
    seen_ = stamped;
    try {
      context_ = server_tls_context(files_);
      log::warn("API: reloaded the TLS certificate " + files_.cert + ", its key and the CA " +
                files_.ca);
    } catch (const Error& e) {
      log::warn("API: the changed TLS files do not load, still serving the previous ones: " +
                std::string(e.what()));
    }
    return context_;
  }

 private:
  // What changes when any of the files is rewritten or replaced.
  std::string stamp() const {
    std::string stamped;
    for (const std::string* path : {&files_.ca, &files_.cert, &files_.key}) {
      struct stat st;
      if (::stat(path->c_str(), &st) != 0) {
        stamped += "missing;";
        continue;
      }
      stamped += std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
                 std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
                 std::to_string(st.st_mtim.tv_nsec) + ";";
    }
    return stamped;
  }

  TlsFiles files_;
  std::string seen_;
  std::shared_ptr<ssl::context> context_;
  std::chrono::steady_clock::time_point last_look_;
};

struct TcpListener {
  TcpListener(asio::io_context& io, Tcp::acceptor acceptor, std::string address,
              std::optional<TlsFiles> files)
      : acceptor(std::move(acceptor)), retry_timer(io), address(std::move(address)) {
    if (files) tls.emplace(std::move(*files));
  }
  Tcp::acceptor acceptor;
  asio::steady_timer retry_timer;
  std::string address;               // as bound: "127.0.0.1:17670"
  std::optional<TlsFilesWatch> tls;  // none: plain TCP
};

// A TLS connection from its accept to its handshake's end: the first byte
// tells a TLS client (a handshake record, 0x16) from a plain HTTP one, which
// is told to use https://. The header timeout bounds it all.
class TlsAccept : public std::enable_shared_from_this<TlsAccept> {
 public:
  TlsAccept(std::shared_ptr<ServerState> server, std::shared_ptr<TcpListener> listener,
            Tcp::socket socket)
      : server_(std::move(server)),
        listener_(std::move(listener)),
        socket_(std::move(socket)),
        deadline_(server_->io) {
    beast::error_code ec;
    auto remote = socket_.remote_endpoint(ec);
    address_ = ec ? "unknown" : address_text(remote);
    host_ = ec ? "unknown" : remote.address().to_string();
  }

  ~TlsAccept() {
    if (!counted_) return;
    auto it = server_->handshakes_per_address.find(host_);
    if (it != server_->handshakes_per_address.end() && --it->second == 0)
      server_->handshakes_per_address.erase(it);
  }

  void start() {
    const size_t cap = server_->limits.max_connections_per_uid;
    size_t& under_way = server_->handshakes_per_address[host_];
    if (cap > 0 && under_way >= cap) {
      server_->log_refusal("API: refused a connection from " + address_ + ": " +
                           std::to_string(under_way) +
                           " TLS handshakes from that address are under way (the limit is " +
                           std::to_string(cap) + ")");
      return give_up();
    }
    ++under_way;
    counted_ = true;
    deadline_.expires_after(server_->limits.header_timeout);
    deadline_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->give_up();
    });
    socket_.async_wait(Tcp::socket::wait_read, [self = shared_from_this()](beast::error_code ec) {
      self->on_first_byte(ec);
    });
  }

 private:
  void give_up() {
    beast::error_code ignored;
    if (stream_)
      stream_->lowest_layer().close(ignored);
    else
      socket_.close(ignored);
  }

  void on_first_byte(beast::error_code ec) {
    if (ec || server_->stopping) return give_up();
    unsigned char first = 0;
    ssize_t n = ::recv(socket_.native_handle(), &first, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n <= 0) return give_up();
    if (first != 0x16) return answer_plain_http();
    auto context = listener_->tls->current();
    stream_ = std::make_unique<TlsStream>(std::move(socket_), *context);
    context_ = context;
    stream_->async_handshake(ssl::stream_base::server,
                             [self = shared_from_this()](beast::error_code handshake_ec) {
                               guarded(
                                   "API TLS handshake", [&] { self->on_handshake(handshake_ec); },
                                   [self] { self->give_up(); });
                             });
  }

  void on_handshake(beast::error_code ec) {
    deadline_.cancel();
    if (ec) {
      std::string why = ec.message();
      if (ec.category() == asio::error::get_ssl_category()) {
        long result = SSL_get_verify_result(stream_->native_handle());
        if (result != X509_V_OK)
          why = std::string("the client certificate: ") + X509_verify_cert_error_string(result);
        else if (const char* reason =
                     ERR_reason_error_string(static_cast<unsigned long>(ec.value())))
          why = reason;
      }
      server_->log_refusal("API: TLS handshake with " + address_ + " failed: " + why);
      return give_up();
    }
    if (server_->stopping) return give_up();
    PeerCredentials peer = tls_peer(*stream_, address_);
    Local::socket local =
        pump_through_socketpair(server_->io, std::move(context_), std::move(stream_));
    server_->serve(std::move(local), peer);
  }

  // An http:// client: a plain answer, then its request is read to its end
  // (closing with unread bytes would reset the connection before it reads).
  void answer_plain_http() {
    std::string body =
        error_body(kTlsRequiredCode, "this port speaks TLS: use https://" + listener_->address +
                                         " (with a client certificate)");
    answer_ =
        "HTTP/1.1 400 Bad Request\r\nServer: openshell\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    server_->log_refusal("API: plain HTTP from " + address_ + " on the TLS port " +
                         listener_->address);
    asio::async_write(socket_, asio::buffer(answer_),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec) return self->give_up();
                        beast::error_code ignored;
                        self->socket_.shutdown(Tcp::socket::shutdown_send, ignored);
                        self->drain();
                      });
  }

  void drain() {
    socket_.async_read_some(asio::buffer(drained_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) {
                                self->deadline_.cancel();
                                return self->give_up();
                              }
                              self->drain();
                            });
  }

  std::shared_ptr<ServerState> server_;
  std::shared_ptr<TcpListener> listener_;
  Tcp::socket socket_;
  std::unique_ptr<TlsStream> stream_;
  std::shared_ptr<ssl::context> context_;
  asio::steady_timer deadline_;
  std::string address_;
  std::string host_;      // the address without its port
  bool counted_ = false;  // in server_->handshakes_per_address
  std::string answer_;
  char drained_[4096];
};

void ServerState::accept_tcp(const std::shared_ptr<TcpListener>& listener) {
  listener->acceptor.async_accept(
      [self = shared_from_this(), listener](beast::error_code ec, Tcp::socket socket) {
        if (ec == asio::error::operation_aborted || !listener->acceptor.is_open()) return;
        if (ec) {
          log::warn("accept on " + listener->address + ": " + ec.message());
          listener->retry_timer.expires_after(kAcceptRetryDelay);
          listener->retry_timer.async_wait([self, listener](beast::error_code wait_ec) {
            if (!wait_ec && listener->acceptor.is_open()) self->accept_tcp(listener);
          });
          return;
        }
        guarded(
            "API accept",
            [&] {
              set_cloexec(socket.native_handle());
              beast::error_code ignored;
              socket.set_option(Tcp::no_delay(true), ignored);
              if (listener->tls) {
                std::make_shared<TlsAccept>(self, listener, std::move(socket))->start();
                return;
              }
              PeerCredentials peer;
              peer.transport = PeerCredentials::Transport::kTcp;
              peer.pid = 0;
              peer.uid = static_cast<uid_t>(-1);
              peer.gid = static_cast<gid_t>(-1);
              auto remote = socket.remote_endpoint(ignored);
              peer.address = ignored ? "unknown" : address_text(remote);
              // The connection only reads and writes bytes: a Local::socket
              // carries a TCP one as well, and release() hands it over as it is.
              Local::socket local(self->io);
              local.assign(Local(), socket.release());
              self->serve(std::move(local), peer);
            },
            nullptr);
        self->accept_tcp(listener);
      });
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
          PeerCredentials peer = peer_credentials(socket.native_handle());
          self->serve(std::move(socket), peer);
        },
        nullptr);
    self->accept_next();
  });
}

// A refusal is written at once, without waiting: it is small and the socket
// is fresh. The client still reads it after the close (a Unix socket keeps
// what was sent), even when its own request was never read.
void ServerState::serve(Local::socket socket, const PeerCredentials& peer) {
  if (admit(socket, peer))
    std::make_shared<Connection>(shared_from_this(), std::move(socket), peer)->start();
}

bool ServerState::admit(Local::socket& socket, const PeerCredentials& peer) {
  int fd = socket.native_handle();
  std::optional<Refusal> refusal;
  if (admission) refusal = admission(fd, peer);
  if (!refusal && peer.transport == PeerCredentials::Transport::kTls && peer.subject.empty())
    refusal =
        Refusal{403, "no_subject",
                "the client certificate has no single common name (CN) to name its principal"};
  if (!refusal && limits.max_connections_per_uid > 0) {
    const std::string key = peer_key(peer);
    auto it = connections_per_peer.find(key);
    if (it != connections_per_peer.end() && it->second >= limits.max_connections_per_uid)
      refusal = Refusal{503, "too_many_connections",
                        key + " already has " + std::to_string(it->second) +
                            " connections open (the limit is " +
                            std::to_string(limits.max_connections_per_uid) + ")"};
  }
  if (!refusal) return true;
  log_refusal("API: refused a connection from " + peer_text(peer) + ": " + refusal->message);
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
  for (auto& listener : tcp_listeners) {
    beast::error_code ignored;
    listener->acceptor.close(ignored);
    listener->retry_timer.cancel();
  }
  tcp_listeners.clear();
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
  // Born with its mode at most: a client that checks the socket's mode
  // before it connects (Paths) never sees the umask's while we start.
  const mode_t saved = ::umask(static_cast<mode_t>(~mode & 0777));
  const int bound = ::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address);
  const int bind_err = errno;
  ::umask(saved);
  if (bound != 0) throw_errno("bind " + socket_path, bind_err);
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

namespace {

// "127.0.0.1:17670", "[::1]:0": an IP address (no name) and a port, 0 for
// one the kernel picks.
Tcp::endpoint parse_listen_address(const std::string& text, const std::string& what) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw Error(what + " '" + text + "': an IPv6 address is written [ADDRESS]:PORT");
    host = text.substr(1, close - 1);
    port = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos)
      throw Error(what + " '" + text + "': a port is required (ADDRESS:PORT)");
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  auto number = text::parse_uint(port, 65535);
  if (!number) throw Error(what + " '" + text + "': the port must be a number from 0 to 65535");
  beast::error_code ec;
  auto address = asio::ip::make_address(host, ec);
  if (ec) throw Error(what + " '" + text + "': '" + host + "' is not an IP address");
  return Tcp::endpoint(address, static_cast<uint16_t>(*number));
}

}  // namespace

std::string Server::listen_tcp_or_tls(const std::string& address, const TlsFiles* files) {
  ServerState& state = *impl_;
  const std::string what = files ? "listen (TLS) on" : "listen (plain TCP) on";
  Tcp::endpoint endpoint = parse_listen_address(address, what);
  if (!files && !endpoint.address().is_loopback())
    throw Error("refusing to listen in plain TCP on " + address +
                ": without TLS only a loopback address (127.0.0.1, ::1) may be served");
  // Before the socket: a missing or bad file is the first thing to say.
  std::optional<TlsFiles> tls;
  if (files) tls = *files;
  auto listener = std::make_shared<TcpListener>(state.io, Tcp::acceptor(state.io), "", tls);
  Tcp::acceptor& acceptor = listener->acceptor;
  UniqueFd fd(::socket(endpoint.protocol().family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(what + " " + address + ": socket");
  beast::error_code ec;
  acceptor.assign(endpoint.protocol(), fd.get(), ec);
  if (ec) throw Error(what + " " + address + ": " + ec.message());
  fd.release();
  acceptor.set_option(Tcp::acceptor::reuse_address(true), ec);
  if (endpoint.address().is_v6()) acceptor.set_option(asio::ip::v6_only(true), ec);
  acceptor.bind(endpoint, ec);
  if (ec) throw Error(what + " " + address + ": " + ec.message());
  acceptor.listen(kBacklog, ec);
  if (ec) throw Error(what + " " + address + ": " + ec.message());
  listener->address = address_text(acceptor.local_endpoint());
  state.stopping = false;
  state.tcp_listeners.push_back(listener);
  state.accept_tcp(listener);
  return listener->address;
}

std::string Server::listen_tls(const std::string& address, const TlsFiles& files) {
  return listen_tcp_or_tls(address, &files);
}

std::string Server::listen_tcp(const std::string& address) {
  return listen_tcp_or_tls(address, nullptr);
}

std::vector<Server::Listener> Server::listeners() const {
  std::vector<Listener> out;
  if (impl_->acceptor.is_open()) out.push_back({"unix", impl_->path});
  for (auto& listener : impl_->tcp_listeners)
    out.push_back({listener->tls ? "tls" : "tcp", listener->address});
  return out;
}

void Server::close() { impl_->stop_listening(); }

}  // namespace openshell::net
