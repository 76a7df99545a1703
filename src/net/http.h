// HTTP/1.1 and WebSocket over Unix sockets, TCP and TLS: the gateway's API server, the
// command line's client, and the streams (logs, exec stdio, watch, the
// supervisor's session). Implemented with Boost.Beast in http_server.cc,
// http_client.cc, websocket.cc, http_socket.cc, http_message.cc and tls.cc; only they
// include Beast (through http_internal.h), since it is slow to compile.
//
// Everything asynchronous runs on one asio::io_context, single-threaded:
// handlers are called from it and may call back into these objects freely.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/io_context.hpp>

#include "base/error.h"
#include "base/text.h"
#include "net/endpoint.h"

namespace openshell::net {

namespace asio = boost::asio;

struct Request {
  std::string method;  // "GET"
  std::string target;  // "/v1/sandboxes/x?follow=1"
  std::string path;    // "/v1/sandboxes/x" (percent-decoded)
  // The path's non-empty segments, each percent-decoded: {"v1", "sandboxes", "x"}.
  // Unlike path, a segment keeps an encoded "/" ("a%2Fb" is one segment "a/b").
  std::vector<std::string> segments;
  std::map<std::string, std::string> query;    // percent-decoded ("+" stays "+"); last one wins
  std::map<std::string, std::string> headers;  // names in lower case; repeats joined with ", "
  std::string body;
  bool websocket = false;  // a WebSocket upgrade request
  std::string raw;         // the request exactly as received (for a handover)
};

struct Response {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

// Who is at the other end of a connection, as the transport tells.
struct PeerCredentials {
  enum class Transport { kUnix, kTls, kTcp };
  Transport transport = Transport::kUnix;
  // kUnix: SO_PEERCRED.
  pid_t pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  // kTls: the verified client certificate's subject: its common name, and
  // whether it was issued to an admin (organizational unit "admin").
  std::string subject;
  bool admin = false;
  // kTls, kTcp: the peer's address ("127.0.0.1:40312").
  std::string address;
};

// One WebSocket connection (either side). Messages are text (JSON) or binary
// (stdio bytes). Sends are queued and go out in order.
class WebSocket {
 public:
  using MessageHandler = std::function<void(std::string data, bool binary)>;
  using CloseHandler = std::function<void(const std::string& reason)>;

  virtual ~WebSocket() = default;
  // Starts reading; on_close runs once, when the peer closes or on an error.
  // Its reason: after a close handshake, the close frame's reason (the one
  // given to close() when this side closed), or "closed" when it was empty;
  // after a failure, what failed ("End of file" when the peer vanished).
  // After on_close, the handlers are released (breaking reference cycles).
  virtual void start(MessageHandler on_message, CloseHandler on_close) = 0;
  // Ignored once close() was called or the socket has closed.
  virtual void send(std::string data, bool binary) = 0;
  // Closes after the queued messages are sent (the handshake is bounded by a
  // 30 s timeout). The reason is cut to 123 bytes.
  virtual void close(const std::string& reason = {}) = 0;
  // Bytes queued but not yet written (for back-pressure).
  virtual size_t queued_bytes() const = 0;
  virtual PeerCredentials peer() const = 0;

  // Client: connects to socket_path and upgrades at target. done gets the
  // socket, or nullptr and the reason; when the server answers the upgrade
  // with an HTTP error, the reason holds its status and body:
  // "WebSocket upgrade at /v1/x refused: 403 {\"error\":\"...\"}".
  // done is always called later, from the loop, never from within connect.
  static void connect(asio::io_context& io, const std::string& socket_path,
                      const std::string& target,
                      std::function<void(std::shared_ptr<WebSocket>, std::string error)> done);
  // The same at any endpoint (net/endpoint.h).
  static void connect(asio::io_context& io, const Endpoint& endpoint, const std::string& target,
                      std::function<void(std::shared_ptr<WebSocket>, std::string error)> done);
  // The same, with these header fields in the upgrade request.
  using Headers = std::vector<std::pair<std::string, std::string>>;
  static void connect(asio::io_context& io, const Endpoint& endpoint, const std::string& target,
                      Headers headers,
                      std::function<void(std::shared_ptr<WebSocket>, std::string error)> done);
  // Client: a header field of the server's upgrade answer ("" without it).
  virtual std::string response_header(std::string_view /*name*/) const { return {}; }

  // Server: a connection handed over by another process (the fd and the
  // upgrade request it had read); completes the handshake. Returns nullptr
  // and sets *error when the request is not a valid upgrade. Takes ownership
  // of fd (closed on failure too). The returned socket can be used at once:
  // sends wait for the handshake; a failed handshake ends in on_close.
  // response_headers go into the upgrade's answer.
  static std::shared_ptr<WebSocket> accept_handed_over(asio::io_context& io, int fd,
                                                       const std::string& raw_request,
                                                       std::string* error,
                                                       Headers response_headers = {});
};

// One request being answered by the server.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual const Request& request() const = 0;
  virtual PeerCredentials peer() const = 0;
  // Answers (exactly once, possibly later, from any handler on the loop).
  // An exchange dropped unanswered closes its connection; one whose handler
  // threw is answered 500. A second answer is ignored (and logged).
  virtual void respond(Response response) = 0;
  // Accepts a WebSocket upgrade on this connection. Throws Error when the
  // exchange was already answered or handed over.
  virtual std::shared_ptr<WebSocket> upgrade() = 0;
  // Gives up the connection: returns its fd (the caller owns it) with nothing
  // written to it; the server forgets it. For handing it to another process.
  // The fd is close-on-exec and non-blocking. Throws Error (and keeps the
  // connection) when bytes beyond the request were already read from it.
  virtual int release() = 0;
};

// How long a connection may keep the server waiting, and how many one peer
// may hold open (a uid on the Unix socket, a certificate's subject over TLS,
// a client address over plain TCP). A WebSocket, once upgraded (or a connection handed over),
// is no longer the server's: these no longer apply to it.
struct ServerLimits {
  // From the connection's start, or from the first byte of a later request,
  // to the end of the request's head.
  std::chrono::milliseconds header_timeout{10000};
  // The longest pause while a request's body arrives.
  std::chrono::milliseconds body_timeout{10000};
  // Keep-alive: the longest wait for the next request.
  std::chrono::milliseconds idle_timeout{60000};
  // Connections (reading, being answered) from one peer at once; TLS
  // handshakes under way count per client address. (Named for the Unix
  // socket's peers, which it counted first.)
  size_t max_connections_per_uid = 128;

  // The defaults, overridden by OPENSHELL_API_HEADER_TIMEOUT_MS,
  // OPENSHELL_API_BODY_TIMEOUT_MS, OPENSHELL_API_IDLE_TIMEOUT_MS and
  // OPENSHELL_API_MAX_CONNECTIONS_PER_UID. Throws Error on a bad value.
  static ServerLimits from_environment();
};

// A connection the server will not serve: it is answered with this status
// and the API's error body, and closed, before any of its request is read.
struct Refusal {
  int status = 403;
  std::string code;
  std::string message;
};

class Server {
 public:
  using Handler = std::function<void(std::shared_ptr<Exchange>)>;
  // Decides, as a connection is accepted, whether its peer may use the
  // server: nullopt admits it. fd is the connection's socket.
  using Admission = std::function<std::optional<Refusal>(int fd, const PeerCredentials& peer)>;
  Server(asio::io_context& io, Handler handler,
         ServerLimits limits = ServerLimits::from_environment());
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Listens on a Unix socket (a stale socket file is replaced) with the given
  // file mode. Throws Error, also when the path is not a socket or a server
  // still listens on it.
  void listen(const std::string& socket_path, unsigned mode);
  // Listens on TCP at address ("127.0.0.1:17670", "[::1]:0": an IP address,
  // and a port, 0 for one the kernel picks) with TLS 1.3, requiring a client
  // certificate signed by files.ca; serves files.cert and files.key, and
  // reloads the three when they change on disk. A plain-HTTP request there is
  // answered 400 (code "tls_required"). Peers are kTls, with the
  // certificate's subject. Returns the address as bound. Throws Error, also
  // when a file does not load.
  std::string listen_tls(const std::string& address, const TlsFiles& files);
  // Plain HTTP on TCP: loopback addresses only (Error otherwise). Peers are
  // kTcp, with their address.
  std::string listen_tcp(const std::string& address);
  struct Listener {
    std::string kind;     // "unix", "tls", "tcp"
    std::string address;  // the socket's path, or the bound ADDRESS:PORT
  };
  std::vector<Listener> listeners() const;
  // Checks every connection accepted from now on (see Admission).
  void set_admission(Admission admission);
  // Stops accepting (every listener) and removes the socket file; open connections finish
  // their exchange, then close. The destructor also closes open connections
  // (but not exchanges handed over or upgraded).
  void close();

 private:
  std::string listen_tcp_or_tls(const std::string& address, const TlsFiles* files);
  struct Impl;
  std::shared_ptr<Impl> impl_;
};

// Why a client could not connect: errno ENOENT or ECONNREFUSED mean nothing
// listens there.
class ConnectError : public Error {
 public:
  ConnectError(const std::string& message, int err) : Error(message), err_(err) {}
  int err() const { return err_; }

 private:
  int err_;
};

// Why the server on a connected Unix socket is not one to talk to: its
// SO_PEERCRED uid is neither ours (the effective uid) nor root's. "" when it
// is. Both clients below refuse such a server before they send anything.
std::string untrusted_server(int fd, const std::string& socket_path);

// Synchronous client for the command line: one connection, keep-alive.
class Client {
 public:
  // Throws ConnectError; Error when the server is not ours (untrusted_server).
  explicit Client(const std::string& socket_path);
  // The same at any endpoint (net/endpoint.h).
  explicit Client(const Endpoint& endpoint);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Throws Error when the connection fails ("the gateway closed the
  // connection"); an HTTP error status is a Response like any other. When the
  // server had closed the connection after the last response, this reconnects.
  Response request(const std::string& method, const std::string& target,
                   const std::string& body = {});

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// "a b/c" -> "a%20b%2Fc", for path segments and query values: base's
// text::percent_encode, named here too for the API's callers.
using text::percent_encode;

}  // namespace openshell::net
