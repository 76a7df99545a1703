// Private to src/image: what the registry client's files share.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>

#include "base/text.h"
#include "image/digest.h"
#include "image/registry.h"
#include "net/dns.h"

namespace openshell::image {
namespace registry_detail {

// The address type of net::dns, egress's until Address moves to base.

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using Fields = std::vector<std::pair<std::string, std::string>>;
using Parser = bhttp::response_parser<bhttp::buffer_body>;

inline constexpr uint32_t kHeaderLimit = 64u << 10;
inline constexpr size_t kMaxTokenBytes = 1u << 20;
inline constexpr size_t kMaxErrorBodyBytes = 64u << 10;
inline constexpr size_t kChunkBytes = 64u << 10;
inline constexpr int kMaxRedirects = 5;
inline constexpr int kMaxBackoffMs = 4000;
inline constexpr int kMaxRetryAfterMs = 30000;
inline constexpr size_t kMaxConnections = 4;

// --- failures ------------------------------------------------------------------

// A failure that may pass: the request is tried again.
struct Transient {
  explicit Transient(std::string why = {}) : reason(std::move(why)) {}

  std::string reason;       // a network or transfer failure: what failed
  int status = 0;           // 429 or 5xx: the answer
  std::string who;          // "registry H" or "token server H", for status
  std::string status_line;  // "500 Internal Server Error"
  std::string detail;       // the registry's own error message, if any
  int retry_after_ms = -1;  // the server's Retry-After
  // Whether a broken transfer may go on with a Range request; unset when no
  // body was being received (what was known before still holds).
  std::optional<bool> resumable;
};

// A failure that will not pass; reason follows the object's name.
struct Fatal {
  explicit Fatal(std::string why, int http_status = 0)
      : reason(std::move(why)), status(http_status) {}

  std::string reason;
  int status;
};

// A body over the limit of what is read of it.
struct BodyTooLarge {};

// --- small helpers -------------------------------------------------------------

inline std::string str(beast::string_view text) { return std::string(text.data(), text.size()); }

using text::iequals;
using text::lower;

bool starts_with(std::string_view text, std::string_view prefix);

// Server-provided text fit for a one-line message: control characters
// replaced, cut at kMaxQuotedText.
std::string printable(std::string_view text);

std::string duration_text(int ms);

bool valid_tag(std::string_view tag);

// A request target or header value we send: printable ASCII, no spaces.
bool valid_token_text(std::string_view text);

bool is_retryable_status(int status);

bool is_redirect(int status);

// "application/json; charset=utf-8" -> "application/json".
std::string media_type_of(std::string_view content_type);

// The distribution spec's error body, {"errors":[{"code":..,"message":..}]}:
// the messages joined, or "" when the body is something else.
std::string registry_error_message(const std::string& body);

// --- URLs ----------------------------------------------------------------------

struct Url {
  bool https = true;
  std::string host;  // lower case, an IPv6 address without brackets
  uint16_t port = 443;
  std::string target = "/";

  // host[:port] as the Host header writes it: the default port left out.
  std::string host_port() const {
    std::string text = host.find(':') != std::string::npos ? "[" + host + "]" : host;
    if (port != (https ? 443 : 80)) text += ":" + std::to_string(port);
    return text;
  }
  std::string origin() const { return (https ? "https://" : "http://") + host_port(); }
  bool same_origin(const Url& other) const {
    return https == other.https && host == other.host && port == other.port;
  }
};

// "host", "host:port", "[v6]", "[v6]:port".
std::optional<Url> parse_authority(std::string_view authority, bool https);

std::optional<Url> parse_url(std::string_view text);

// A Location header: absolute, scheme-relative, an absolute path, or a path
// relative to base's.
std::optional<Url> resolve_location(const Url& base, std::string_view location);

// --- authentication --------------------------------------------------------------

struct Challenge {
  std::string realm, service, scope;
};

// The first Bearer challenge with a realm among the WWW-Authenticate values:
// Bearer realm="https://auth.example/token",service="x",scope="repository:a:pull".
std::optional<Challenge> bearer_challenge(const std::vector<std::string>& values);

// --- where bodies go -------------------------------------------------------------

// Counts and hashes what it is given; subclasses keep it.
class Sink {
 public:
  virtual ~Sink() = default;
  uint64_t size() const { return size_; }
  void append(const char* data, size_t size) {
    write(data, size);
    hash_->update(data, size);
    size_ += size;
  }
  // Drops what was received: the transfer starts again.
  void restart() {
    if (size_ == 0 && !resumed) return;
    discard();
    hash_ = std::make_unique<Sha256>();
    size_ = 0;
    resumed = false;
  }
  // Once per transfer (restart() makes a new one).
  std::string digest() { return hash_->digest(); }

  bool resumed = false;  // part of the content came from a Range request

 protected:
  virtual void write(const char* data, size_t size) = 0;
  virtual void discard() = 0;

 private:
  std::unique_ptr<Sha256> hash_ = std::make_unique<Sha256>();
  uint64_t size_ = 0;
};

// "bytes 100-199/200" -> 100.
std::optional<uint64_t> range_start(std::string_view content_range);

// --- connections -----------------------------------------------------------------

struct Connection {
  std::optional<beast::tcp_stream> tcp;
  std::optional<beast::ssl_stream<beast::tcp_stream>> tls;
  beast::flat_buffer buffer;
  int answers = 0;    // responses read on it
  bool busy = false;  // a response's body is not read to its end

  beast::tcp_stream& lowest() { return tls ? beast::get_lowest_layer(*tls) : *tcp; }
  bool is_open() { return (tls || tcp) && lowest().socket().is_open(); }
};

// One answer whose header was read; its body is still on the connection.
struct Reply {
  Url url;
  int status = 0;
  std::string status_line;  // "404 Not Found"
  Fields headers;           // names in lower case
  std::optional<uint64_t> content_length;
  Connection* connection = nullptr;
  std::unique_ptr<Parser> parser;

  std::string header(std::string_view name) const {
    for (const auto& [key, value] : headers)
      if (key == name) return value;
    return "";
  }
  std::vector<std::string> all(std::string_view name) const {
    std::vector<std::string> values;
    for (const auto& [key, value] : headers)
      if (key == name) values.push_back(value);
    return values;
  }
};

asio::ip::address to_asio(const Address& address);

// What to fetch, and what it must be.
struct Object {
  std::string what;  // "localhost:5000/x:1", "blob sha256:... from localhost:5000/x"
  std::string path;  // "/v2/x/manifests/1"
  std::string accept;
  uint64_t max_bytes = UINT64_MAX;
  int64_t size = -1;    // the expected size, when known
  std::string digest;   // the expected digest, when known
  bool resume = false;  // a broken transfer may go on with a Range request
};

// A request's method and body (pushes); a plain GET by default.
struct Send {
  bhttp::verb method = bhttp::verb::get;
  std::string_view body;
  std::string_view content_type;
};

struct Fetched {
  std::string media_type;       // of the Content-Type
  std::string registry_digest;  // Docker-Content-Digest
  std::string digest;           // of the content
};

}  // namespace registry_detail

using namespace registry_detail;

struct RegistryClient::Impl {
  Impl(Reference reference, RegistryOptions opts);

  // --- running one step ---

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(options.timeout_ms);
  }
  std::string step_message(const beast::error_code& ec) const;
  // Starts an asynchronous operation (start gets its completion handler)
  // and runs the loop until it completes.
  template <class Start>
  beast::error_code run(Start&& start) {
    std::optional<beast::error_code> result;
    start([&result](beast::error_code ec, auto&&...) { result = ec; });
    io.restart();
    while (!result && io.run_one() > 0) {
    }
    return result.value_or(asio::error::operation_aborted);
  }
  // An operation on the connection's stream (TLS or not), under the deadline.
  template <class Operation>
  beast::error_code on_stream(Connection& connection, Operation operation) {
    connection.lowest().expires_after(timeout());
    return run([&](auto handler) {
      if (connection.tls)
        operation(*connection.tls, std::move(handler));
      else
        operation(*connection.tcp, std::move(handler));
    });
  }

  // --- resolving and connecting ---

  std::vector<Address> addresses_of(const std::string& host);
  asio::ssl::context& tls_context();
  void connect(Connection& connection, const Url& url);
  void handshake(Connection& connection, const Url& url);
  // The open connection to url's origin, else a new one.
  Connection& connection_for(const Url& url);
  void drop(const Url& url) { connections.erase(url.origin()); }

  // --- one request and its answer ---

  // Sends a GET and reads the answer's header. A kept-alive connection that
  // the server had closed meanwhile is replaced once, at no cost.
  Reply exchange(const Url& url, const Fields& fields, const Send& send = {});
  // Reads the rest of reply's body into sink, in chunks. Returns what broke
  // the transfer, if anything. Exceptions from sink leave the connection busy
  // (it is then replaced).
  beast::error_code read_body(Reply& reply, const std::function<void(const char*, size_t)>& sink);
  // An answer that is not used: its body (at most kMaxErrorBodyBytes, for an
  // error message), read so that the connection can serve the next request.
  std::string drain(Reply& reply);
  // Follows redirects; the token goes only to the registry itself.
  Reply follow(Url url, const Fields& fields, bool with_token);
  // GET path on the registry: redirects followed, a bearer token fetched
  // when the registry asks for one.
  Reply open(const std::string& path, const Fields& fields);
  std::string fetch_token(const Challenge& challenge);
  // A push's request to url (the registry's, or an upload location it
  // gave): the token when the url is the registry's, a new one fetched on a
  // 401; redirects are not followed.
  Reply send_to(const Url& url, const Fields& fields, const Send& send);
  // An answer other than the one wanted: Transient or Fatal, with the
  // server's own message when it sent one.
  [[noreturn]] void status_failure(Reply& reply, const std::string& who);

  // --- one object, with retries ---

  Fetched fetch_once(const Object& object, Sink& sink, bool resume);
  Fetched fetch(const Object& object, Sink& sink);
  static std::string exhausted(const Object& object, const Transient& failure, int attempts);
  std::string blob_what(const std::string& digest) const;
  Object blob_object(const std::string& digest) const;

  // Members in this order: connections and the resolver go before the loop.
  Reference ref;
  RegistryOptions options;
  Url registry;  // scheme, host and port
  std::string token;
  // What a token asks for when the registry's challenge names no scope.
  std::string actions = "pull";
  std::vector<char> chunk;
  asio::io_context io;
  std::optional<asio::ssl::context> tls;
  std::unique_ptr<net::dns::Resolver> resolver;
  std::map<std::string, std::vector<Address>> resolved;
  std::map<std::string, std::unique_ptr<Connection>> connections;  // by origin
};

}  // namespace openshell::image
