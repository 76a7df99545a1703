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

#include <boost/asio/local/stream_protocol.hpp>
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

}  // namespace openshell::net::detail
