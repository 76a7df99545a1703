// A small HTTP/1.1 server on 127.0.0.1 for tests of HTTP clients (the
// registry client's unit tests and osh-fake-registry). A handler answers each
// request; an answer can misbehave on purpose: stop halfway and close, never
// come, or be a closed connection. Plain TCP or TLS. It serves on its own
// thread; the destructor stops it and closes every connection.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

namespace openshell::testing {

struct FakeRequest {
  std::string method;                          // "GET", "HEAD"
  std::string target;                          // "/v2/x/blobs/sha256:..?a=b"
  std::string path;                            // the target without its query
  std::map<std::string, std::string> query;    // percent-decoded
  std::map<std::string, std::string> headers;  // names in lower case

  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

struct FakeReply {
  enum class Action {
    answer,    // the whole answer
    truncate,  // the header and the first truncate_at bytes of the body, then close
    hang,      // nothing, and the connection stays open until the server stops
    drop,      // close the connection without an answer
  };

  int status = 200;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;  // a HEAD request gets its Content-Length but not the body
  Action action = Action::answer;
  size_t truncate_at = 0;

  FakeReply& header(std::string name, std::string value) {
    headers.emplace_back(std::move(name), std::move(value));
    return *this;
  }
  static FakeReply with(int status, std::string body = {}) {
    FakeReply reply;
    reply.status = status;
    reply.body = std::move(body);
    return reply;
  }
  static FakeReply of(Action action) {
    FakeReply reply;
    reply.action = action;
    return reply;
  }
};

class FakeHttpServer {
 public:
  using Handler = std::function<FakeReply(const FakeRequest&)>;

  // Listens on 127.0.0.1:port (0: a free one) and serves on a new thread;
  // with tls, over TLS. Throws boost::system::system_error when it cannot listen.
  explicit FakeHttpServer(Handler handler, std::shared_ptr<boost::asio::ssl::context> tls = nullptr,
                          uint16_t port = 0)
      : state_(std::make_shared<State>(std::move(handler), std::move(tls))) {
    namespace asio = boost::asio;
    asio::ip::tcp::endpoint endpoint(asio::ip::make_address("127.0.0.1"), port);
    acceptor_.open(endpoint.protocol());
    acceptor_.set_option(asio::socket_base::reuse_address(true));
    acceptor_.bind(endpoint);
    acceptor_.listen();
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::thread([this] { io_.run(); });
  }

  ~FakeHttpServer() {
    io_.stop();
    thread_.join();
    boost::system::error_code ignored;
    acceptor_.close(ignored);
    std::lock_guard lock(state_->mutex);
    state_->held.clear();
  }

  FakeHttpServer(const FakeHttpServer&) = delete;
  FakeHttpServer& operator=(const FakeHttpServer&) = delete;

  uint16_t port() const { return port_; }
  // "http://127.0.0.1:PORT" (https with TLS).
  std::string origin() const {
    return std::string(state_->tls ? "https" : "http") + "://127.0.0.1:" + std::to_string(port_);
  }
  // The requests so far, in order.
  std::vector<FakeRequest> requests() const {
    std::lock_guard lock(state_->mutex);
    return state_->requests;
  }
  // Connections accepted so far.
  int connections() const { return state_->connections.load(); }

 private:
  struct State {
    State(Handler h, std::shared_ptr<boost::asio::ssl::context> t)
        : handler(std::move(h)), tls(std::move(t)) {}
    Handler handler;
    std::shared_ptr<boost::asio::ssl::context> tls;
    mutable std::mutex mutex;
    std::vector<FakeRequest> requests;
    std::vector<std::shared_ptr<void>> held;  // hanging sessions
    std::atomic<int> connections{0};

    FakeReply answer(const FakeRequest& request) {
      {
        std::lock_guard lock(mutex);
        requests.push_back(request);
      }
      try {
        return handler(request);
      } catch (const std::exception& e) {
        return FakeReply::with(500, std::string("fake server handler: ") + e.what());
      }
    }
  };

  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  static std::string percent_decode(std::string_view text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '%' && i + 2 < text.size() && hex_value(text[i + 1]) >= 0 &&
          hex_value(text[i + 2]) >= 0) {
        out += static_cast<char>(hex_value(text[i + 1]) * 16 + hex_value(text[i + 2]));
        i += 2;
      } else {
        out += text[i] == '+' ? ' ' : text[i];
      }
    }
    return out;
  }

  template <class Stream>
  class Session : public std::enable_shared_from_this<Session<Stream>> {
   public:
    template <class... Args>
    Session(std::shared_ptr<State> state, Args&&... args)
        : state_(std::move(state)), stream_(std::forward<Args>(args)...) {}

    void start() {
      if constexpr (std::is_same_v<Stream, boost::beast::tcp_stream>) {
        read();
      } else {
        stream_.async_handshake(boost::asio::ssl::stream_base::server,
                                [self = this->shared_from_this()](boost::beast::error_code ec) {
                                  if (!ec) self->read();
                                });
      }
    }

   private:
    void read() {
      namespace http = boost::beast::http;
      parser_.emplace();
      parser_->header_limit(64u << 10);
      parser_->body_limit(1u << 20);
      http::async_read(stream_, buffer_, *parser_,
                       [self = this->shared_from_this()](boost::beast::error_code ec, size_t) {
                         self->on_read(ec);
                       });
    }

    void on_read(boost::beast::error_code ec) {
      namespace http = boost::beast::http;
      if (ec) {
        // Not HTTP (a TLS hello, say): answer as servers do, then close.
        if (ec != http::error::end_of_stream && ec != boost::asio::error::eof &&
            parser_->got_some())
          send("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false);
        else
          close();
        return;
      }
      auto& message = parser_->get();
      FakeRequest request;
      request.method = std::string(message.method_string());
      request.target = std::string(message.target());
      size_t question = request.target.find('?');
      request.path = request.target.substr(0, question);
      if (question != std::string::npos) {
        std::string_view query = std::string_view(request.target).substr(question + 1);
        while (!query.empty()) {
          size_t amp = query.find('&');
          std::string_view pair = query.substr(0, amp);
          query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
          size_t equals = pair.find('=');
          std::string value =
              equals == std::string_view::npos ? "" : percent_decode(pair.substr(equals + 1));
          request.query[percent_decode(pair.substr(0, equals))] = value;
        }
      }
      for (const auto& field : message) {
        std::string name(field.name_string());
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        auto [it, fresh] = request.headers.emplace(name, std::string(field.value()));
        if (!fresh) it->second += ", " + std::string(field.value());
      }
      bool keep_alive = message.keep_alive();
      bool head = message.method() == http::verb::head;

      FakeReply reply = state_->answer(request);
      using Action = FakeReply::Action;
      if (reply.action == Action::hang) {
        std::lock_guard lock(state_->mutex);
        state_->held.push_back(this->shared_from_this());
        return;
      }
      if (reply.action == Action::drop) {
        close();
        return;
      }
      bool truncate = reply.action == Action::truncate;
      keep_alive = keep_alive && !truncate;
      std::string text = "HTTP/1.1 " + std::to_string(reply.status) + " " +
                         std::string(http::obsolete_reason(http::int_to_status(reply.status))) +
                         "\r\n";
      bool has_length = false;
      for (const auto& [name, value] : reply.headers) {
        text += name + ": " + value + "\r\n";
        has_length = has_length || name == "Content-Length";
      }
      if (!has_length) text += "Content-Length: " + std::to_string(reply.body.size()) + "\r\n";
      if (!keep_alive) text += "Connection: close\r\n";
      text += "\r\n";
      if (!head) text += truncate ? reply.body.substr(0, reply.truncate_at) : reply.body;
      send(std::move(text), keep_alive);
    }

    void send(std::string text, bool keep_alive) {
      auto data = std::make_shared<std::string>(std::move(text));
      boost::asio::async_write(
          stream_, boost::asio::buffer(*data),
          [self = this->shared_from_this(), data, keep_alive](boost::beast::error_code ec, size_t) {
            if (!ec && keep_alive)
              self->read();
            else
              self->close();
          });
    }

    void close() {
      boost::beast::error_code ignored;
      auto& socket = boost::beast::get_lowest_layer(stream_).socket();
      socket.shutdown(boost::asio::ip::tcp::socket::shutdown_both, ignored);
      socket.close(ignored);
    }

    std::shared_ptr<State> state_;
    Stream stream_;
    boost::beast::flat_buffer buffer_;
    std::optional<boost::beast::http::request_parser<boost::beast::http::string_body>> parser_;
  };

  void accept() {
    acceptor_.async_accept([this](boost::beast::error_code ec,
                                  boost::asio::ip::tcp::socket socket) {
      if (ec == boost::asio::error::operation_aborted) return;
      if (!ec) {
        ++state_->connections;
        boost::beast::tcp_stream stream(std::move(socket));
        if (state_->tls) {
          using TlsStream = boost::beast::ssl_stream<boost::beast::tcp_stream>;
          std::make_shared<Session<TlsStream>>(state_, std::move(stream), *state_->tls)->start();
        } else {
          std::make_shared<Session<boost::beast::tcp_stream>>(state_, std::move(stream))->start();
        }
      }
      accept();
    });
  }

  std::shared_ptr<State> state_;
  boost::asio::io_context io_;
  boost::asio::ip::tcp::acceptor acceptor_{io_};
  uint16_t port_ = 0;
  std::thread thread_;
};

}  // namespace openshell::testing
