// Private to src/net: what the HTTP and WebSocket files share.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/local/stream_protocol.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/websocket.hpp>

#include "base/log.h"
#include "base/unique_fd.h"
#include "net/http.h"

namespace openshell::net::detail {

namespace beast = boost::beast;
namespace bhttp = beast::http;
namespace websocket = beast::websocket;
using Local = asio::local::stream_protocol;
using Tcp = asio::ip::tcp;
namespace ssl = asio::ssl;
using TlsStream = ssl::stream<Tcp::socket>;
using BeastRequest = bhttp::request<bhttp::string_body>;
using BeastResponse = bhttp::response<bhttp::string_body>;

constexpr uint64_t kBodyLimit = 16u << 20;
constexpr uint32_t kHeaderLimit = 64u << 10;
constexpr size_t kMessageLimit = 16u << 20;
constexpr size_t kReadChunk = 64u << 10;

// The API's error shape: {"error": {"code": ..., "message": ...}}. Strings
// as JSON writes them (quotes, backslashes and control characters escaped,
// UTF-8 as it is); bytes that are not valid UTF-8 become U+FFFD.
std::string error_body(std::string_view code, std::string_view message);

inline std::string str(beast::string_view text) { return std::string(text.data(), text.size()); }

// Fills the parts of request that come from the target; false when malformed.
bool parse_target(std::string_view target, Request& request);

PeerCredentials peer_credentials(int fd);
void set_cloexec(int fd);
// Asio opens sockets without SOCK_CLOEXEC; ours must not leak into children.
UniqueFd open_unix_socket(const std::string& what);
bool fill_address(const std::string& path, sockaddr_un& address);
// True when something accepts connections on path (a live server, not a
// stale file). A full backlog (EAGAIN) also means a live server.
bool server_listens(const std::string& path);

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

// The server's side of an upgrade: answers request on socket.
std::shared_ptr<WebSocket> accept_websocket(Local::socket socket, BeastRequest request);
// A WebSocket on socket that has already failed for reason (its on_close
// tells it).
std::shared_ptr<WebSocket> failed_websocket(Local::socket socket, const std::string& reason);

// --- TCP and TLS (tls.cc) ---------------------------------------------------------
//
// A TLS connection is terminated into a socketpair: a pump relays bytes
// between the TLS stream and one end, and the other end is an ordinary
// Local::socket. So the server's connections, the WebSocket, and the
// handover of a connection to another process (release()) are the same code
// for every transport. A plain TCP socket is wrapped in a Local::socket as it
// is: they only read and write bytes, and the protocol type matters to asio
// only for addresses.

// TLS 1.3 only. The server requires a client certificate signed by files.ca;
// the client verifies the server's against files.ca and shows its own when
// files.cert is set. Throw Error naming the file at fault.
std::shared_ptr<ssl::context> server_tls_context(const TlsFiles& files);
std::shared_ptr<ssl::context> client_tls_context(const TlsFiles& files);
// The client's check that the server's certificate names host (a DNS name or
// an IP address among its SANs), and the name it asks for (SNI).
void expect_server_name(TlsStream& stream, const std::string& host);
// The verified client certificate's subject, after the server's handshake.
PeerCredentials tls_peer(TlsStream& stream, const std::string& address);
// "127.0.0.1:40312", "[::1]:40312".
std::string address_text(const Tcp::endpoint& endpoint);

// Why a client could not reach a TCP endpoint or lost it, as one line; the
// one place where each failure gets its words. ssl is the connection's (for
// the certificate's verification result), or nullptr.
std::string connect_failure(const Endpoint& endpoint, const beast::error_code& ec, SSL* ssl);
// The error code a TLS port answers http:// with.
inline constexpr const char* kTlsRequiredCode = "tls_required";

// Relays bytes between a TLS stream and a local socket, both ways, until
// either side ends: the TLS side's end half-closes the local socket (what
// was sent still arrives), the local side's end closes both.
class TlsPump : public std::enable_shared_from_this<TlsPump> {
 public:
  TlsPump(std::shared_ptr<ssl::context> context, std::unique_ptr<TlsStream> stream,
          Local::socket local);
  void start();
  // The TLS side's failure (an alert, a reset), or {} while none happened.
  beast::error_code tls_error() const { return tls_error_; }
  TlsStream& stream() { return *stream_; }

 private:
  void read_tls();
  void read_local();
  void close_all();

  std::shared_ptr<ssl::context> context_;  // outlives the stream's SSL
  std::unique_ptr<TlsStream> stream_;
  Local::socket local_;
  std::vector<char> from_tls_, from_local_;
  beast::error_code tls_error_;
  bool closed_ = false;
};

// Starts a pump for stream and returns the socketpair's other end
// (close-on-exec); *pump, when given, gets the pump.
Local::socket pump_through_socketpair(asio::io_context& io, std::shared_ptr<ssl::context> context,
                                      std::unique_ptr<TlsStream> stream,
                                      std::shared_ptr<TlsPump>* pump = nullptr);

}  // namespace openshell::net::detail
