// The command line's synchronous HTTP client, one keep-alive connection
// (a Unix socket, TLS, or plain TCP).
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <memory>
#include <string>
#include <utility>

#include <boost/asio/connect.hpp>

#include "base/error.h"
#include "base/unique_fd.h"
#include "net/http_internal.h"

namespace openshell::net {

using namespace detail;

struct Client::Impl {
  explicit Impl(Endpoint endpoint) : endpoint(std::move(endpoint)) {
    if (this->endpoint.kind == Endpoint::Kind::kTls)
      tls_context = client_tls_context(this->endpoint.tls);
    // beast reads as much as the buffer has room for, at least 512 bytes:
    // an empty buffer read a 630 KB list of 1000 sandboxes 512 bytes a
    // call (1200 calls, each one more turn of the parser).
    buffer.reserve(kReadChunk);
  }

  void connect() {
    buffer.clear();
    if (endpoint.kind == Endpoint::Kind::kUnix)
      connect_unix();
    else
      connect_tcp();
  }

  void connect_unix() {
    const std::string& path = endpoint.socket_path;
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

  void connect_tcp() {
    beast::error_code ec;
    Tcp::socket tcp(io);
    // An address needs no resolver.
    auto literal = asio::ip::make_address(endpoint.host, ec);
    if (!ec) {
      tcp.connect(Tcp::endpoint(literal, endpoint.port), ec);
    } else {
      Tcp::resolver resolver(io);
      auto addresses = resolver.resolve(endpoint.host, std::to_string(endpoint.port),
                                        Tcp::resolver::numeric_service, ec);
      if (ec)
        throw ConnectError(
            "connect " + endpoint.url() + ": resolve " + endpoint.host + ": " + ec.message(),
            EHOSTUNREACH);
      asio::connect(tcp, addresses, ec);
    }
    if (ec) throw ConnectError(connect_failure(endpoint, ec, nullptr), ec.value());
    set_cloexec(tcp.native_handle());
    tcp.set_option(Tcp::no_delay(true), ec);
    if (endpoint.kind == Endpoint::Kind::kTcp) {
      socket.assign(Local(), tcp.release());
      return;
    }
    auto stream = std::make_unique<TlsStream>(std::move(tcp), *tls_context);
    expect_server_name(*stream, endpoint.host);
    stream->handshake(ssl::stream_base::client, ec);
    if (ec) {
      std::string why = connect_failure(endpoint, ec, stream->native_handle());
      throw ConnectError(why, ec == asio::error::connection_refused ? ECONNREFUSED : EPROTO);
    }
    tls = std::move(stream);
  }

  bool is_open() const { return tls ? tls->lowest_layer().is_open() : socket.is_open(); }
  int native_handle() { return tls ? tls->lowest_layer().native_handle() : socket.native_handle(); }
  void close() {
    beast::error_code ignored;
    socket.close(ignored);
    tls.reset();
  }

  // Runs f on the connection's stream, whichever it is.
  template <class F>
  void with_stream(F&& f) {
    if (tls)
      f(*tls);
    else
      f(socket);
  }

  [[noreturn]] void connection_failed(beast::error_code ec) {
    SSL* ssl = tls ? tls->native_handle() : nullptr;
    std::string why;
    // Over TLS 1.3 the server judges our certificate after our side of the
    // handshake is done: its refusal arrives as the answer to the request.
    if (ec.category() == asio::error::get_ssl_category()) why = connect_failure(endpoint, ec, ssl);
    close();
    if (!why.empty()) throw Error(why);
    if (ec == asio::error::eof || ec == asio::error::connection_reset ||
        ec == asio::error::broken_pipe || ec == bhttp::error::end_of_stream ||
        ec == bhttp::error::partial_message || ec == ssl::error::stream_truncated)
      throw Error("the gateway closed the connection");
    throw Error("talk to the gateway at " + endpoint.url() + ": " + ec.message());
  }

  asio::io_context io;
  Endpoint endpoint;
  Local::socket socket{io};  // kUnix, kTcp
  std::shared_ptr<ssl::context> tls_context;
  std::unique_ptr<TlsStream> tls;  // kTls
  beast::flat_buffer buffer;
};

Client::Client(const std::string& socket_path)
    : impl_(std::make_unique<Impl>(Endpoint::unix_socket(socket_path))) {
  impl_->connect();
}

Client::Client(const Endpoint& endpoint) : impl_(std::make_unique<Impl>(endpoint)) {
  impl_->connect();
}

Client::~Client() = default;

Response Client::request(const std::string& method, const std::string& target,
                         const std::string& body) {
  // A connection the server has closed since (its keep-alive or head
  // deadline passed while we were busy) reads as ready: start afresh.
  if (impl_->is_open()) {
    pollfd p{impl_->native_handle(), POLLIN | POLLRDHUP, 0};
    if (::poll(&p, 1, 0) != 0) {
      impl_->close();
      try {
        impl_->connect();
      } catch (const ConnectError&) {
        throw Error("the gateway closed the connection");  // and is gone
      }
    }
  }
  if (!impl_->is_open()) impl_->connect();
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
  impl_->with_stream([&](auto& stream) { bhttp::write(stream, request, write_ec); });
  // A server that refuses a connection answers and closes it before it reads
  // the request: its answer may still be there to read.
  bool unsent = write_ec &&
                (write_ec == asio::error::broken_pipe || write_ec == asio::error::connection_reset);
  if (write_ec && !unsent) impl_->connection_failed(write_ec);

  beast::error_code ec;
  bhttp::response_parser<bhttp::string_body> parser;
  parser.header_limit(kHeaderLimit);
  parser.body_limit(boost::none);
  impl_->with_stream([&](auto& stream) { bhttp::read(stream, impl_->buffer, parser, ec); });
  if (ec) impl_->connection_failed(unsent ? write_ec : ec);
  bool keep_alive = parser.keep_alive();
  BeastResponse& message = parser.get();
  Response response;
  response.status = static_cast<int>(message.result_int());
  response.content_type = str(message[bhttp::field::content_type]);
  response.body = std::move(message.body());
  if (!keep_alive) impl_->close();
  if (impl_->endpoint.kind == Endpoint::Kind::kTcp && response.status == 400 &&
      response.body.find(std::string("\"") + kTlsRequiredCode + "\"") != std::string::npos)
    throw Error("the gateway at " + impl_->endpoint.url() +
                " speaks TLS on that port: use https://" + impl_->endpoint.host_port());
  return response;
}

}  // namespace openshell::net
