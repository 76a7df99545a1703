// The command line's synchronous HTTP client, one keep-alive connection.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <memory>
#include <string>
#include <utility>

#include "base/error.h"
#include "base/unique_fd.h"
#include "net/http_internal.h"

namespace openshell::net {

using namespace detail;

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

Client::Client(const Endpoint& endpoint) {
  if (endpoint.kind != Endpoint::Kind::kUnix)
    throw ConnectError("connect " + endpoint.url() + ": TCP endpoints are not supported yet",
                       EPROTONOSUPPORT);
  impl_ = std::make_unique<Impl>(endpoint.socket_path);
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

}  // namespace openshell::net
