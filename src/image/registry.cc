// The registry client with Boost.Beast, over TCP or OpenSSL. Each client owns
// an io_context; every network step is an asynchronous operation with a
// deadline (beast::tcp_stream's expiry) that the calling thread runs until it
// completes, so the API is synchronous and nothing can hang.
#include "image/registry.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <nlohmann/json.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/error.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "egress/dns.h"
#include "egress/rules.h"
#include "image/digest.h"
#include "net/http.h"

namespace openshell::image {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Fields = std::vector<std::pair<std::string, std::string>>;
using Parser = bhttp::response_parser<bhttp::buffer_body>;

constexpr uint32_t kHeaderLimit = 64u << 10;
constexpr size_t kMaxTokenBytes = 1u << 20;
constexpr size_t kMaxErrorBodyBytes = 64u << 10;
constexpr size_t kChunkBytes = 64u << 10;
constexpr int kMaxRedirects = 5;
constexpr int kMaxBackoffMs = 4000;
constexpr int kMaxRetryAfterMs = 30000;
constexpr size_t kMaxConnections = 4;
constexpr size_t kMaxQuotedText = 200;

// The distributions' CA bundles; a static binary cannot rely on OpenSSL's
// compiled-in directory existing on the host.
constexpr const char* kCaBundles[] = {
    "/etc/ssl/certs/ca-certificates.crt",                 // Debian, Ubuntu, Arch, Gentoo
    "/etc/pki/tls/certs/ca-bundle.crt",                   // Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",                             // openSUSE
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  // CentOS, RHEL
    "/etc/ssl/cert.pem",                                  // Alpine
};

const std::string kManifestAccept = std::string(kMediaTypeOciIndex) + ", " + kMediaTypeOciManifest +
                                    ", " + kMediaTypeDockerManifestList + ", " +
                                    kMediaTypeDockerManifest;

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

std::string str(beast::string_view text) { return std::string(text.data(), text.size()); }

using text::iequals;
using text::lower;

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// Server-provided text fit for a one-line message: control characters
// replaced, cut at kMaxQuotedText.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, kMaxQuotedText))
    out += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
  if (text.size() > kMaxQuotedText) out += "...";
  return out;
}

std::string duration_text(int ms) {
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  return buf;
}

bool valid_tag(std::string_view tag) {
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  if (tag.empty() || tag.size() > 128 || !word(tag[0])) return false;
  return std::all_of(tag.begin(), tag.end(),
                     [&](char c) { return word(c) || c == '.' || c == '-'; });
}

// A request target or header value we send: printable ASCII, no spaces.
bool valid_token_text(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f;
  });
}

bool is_retryable_status(int status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// "application/json; charset=utf-8" -> "application/json".
std::string media_type_of(std::string_view content_type) {
  return lower(text::trim(content_type.substr(0, content_type.find(';'))));
}

// The distribution spec's error body, {"errors":[{"code":..,"message":..}]}:
// the messages joined, or "" when the body is something else.
std::string registry_error_message(const std::string& body) {
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("errors") ||
      !doc["errors"].is_array())
    return "";
  std::string out;
  for (const json& error : doc["errors"]) {
    if (!error.is_object()) continue;
    std::string message;
    if (error.contains("message") && error["message"].is_string())
      message = error["message"].get<std::string>();
    if (message.empty() && error.contains("code") && error["code"].is_string()) {
      message = lower(error["code"].get<std::string>());
      std::replace(message.begin(), message.end(), '_', ' ');
    }
    if (message.empty()) continue;
    if (!out.empty()) out += "; ";
    out += message;
  }
  return printable(out);
}

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
std::optional<Url> parse_authority(std::string_view authority, bool https) {
  Url url;
  url.https = https;
  url.port = https ? 443 : 80;
  std::string_view host = authority, port;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = authority.substr(1, close - 1);
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':' || rest.size() == 1) return std::nullopt;
      port = rest.substr(1);
    }
    auto address = egress::Address::parse(host);
    if (!address || address->family != AF_INET6) return std::nullopt;
  } else {
    size_t colon = authority.find(':');
    if (colon != std::string_view::npos) {
      host = authority.substr(0, colon);
      port = authority.substr(colon + 1);
      if (port.empty()) return std::nullopt;
    }
    if (host.empty() || host.front() == '-' || host.front() == '.') return std::nullopt;
    for (char c : host)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '-' || c == '_'))
        return std::nullopt;
  }
  if (!port.empty()) {
    auto number = text::parse_uint(port, 65535);
    if (!number || *number == 0) return std::nullopt;
    url.port = static_cast<uint16_t>(*number);
  }
  url.host = lower(host);
  return url;
}

std::optional<Url> parse_url(std::string_view text) {
  bool https;
  if (starts_with(text, "https://")) {
    https = true;
    text.remove_prefix(8);
  } else if (starts_with(text, "http://")) {
    https = false;
    text.remove_prefix(7);
  } else {
    return std::nullopt;
  }
  text = text.substr(0, text.find('#'));
  size_t end = text.find_first_of("/?");
  auto url = parse_authority(text.substr(0, end), https);
  if (!url) return std::nullopt;
  std::string_view rest = end == std::string_view::npos ? std::string_view() : text.substr(end);
  url->target = rest.empty() ? "/" : rest[0] == '?' ? "/" + std::string(rest) : std::string(rest);
  if (!valid_token_text(url->target)) return std::nullopt;
  return url;
}

// A Location header: absolute, scheme-relative, an absolute path, or a path
// relative to base's.
std::optional<Url> resolve_location(const Url& base, std::string_view location) {
  location = text::trim(location);
  if (starts_with(location, "https://") || starts_with(location, "http://"))
    return parse_url(location);
  if (starts_with(location, "//"))
    return parse_url((base.https ? "https:" : "http:") + std::string(location));
  location = location.substr(0, location.find('#'));
  if (location.empty()) return std::nullopt;
  Url url = base;
  if (location[0] == '/') {
    url.target = std::string(location);
  } else {
    std::string path = base.target.substr(0, base.target.find('?'));
    if (location[0] != '?') path = path.substr(0, path.rfind('/') + 1);
    url.target = path + std::string(location);
  }
  if (!valid_token_text(url.target)) return std::nullopt;
  return url;
}

// --- authentication --------------------------------------------------------------

struct Challenge {
  std::string realm, service, scope;
};

// The first Bearer challenge with a realm among the WWW-Authenticate values:
// Bearer realm="https://auth.example/token",service="x",scope="repository:a:pull".
std::optional<Challenge> bearer_challenge(const std::vector<std::string>& values) {
  for (const std::string& value : values) {
    std::string_view text = text::trim(value);
    if (text.size() < 7 || !iequals(text.substr(0, 6), "bearer") || text[6] != ' ') continue;
    text.remove_prefix(7);
    Challenge challenge;
    size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && (text[i] == ' ' || text[i] == ',' || text[i] == '\t')) ++i;
      size_t equals = text.find('=', i);
      if (equals == std::string_view::npos) break;
      std::string name = lower(text::trim(text.substr(i, equals - i)));
      i = equals + 1;
      std::string param;
      if (i < text.size() && text[i] == '"') {
        for (++i; i < text.size() && text[i] != '"'; ++i) {
          if (text[i] == '\\' && i + 1 < text.size()) ++i;
          param += text[i];
        }
        ++i;  // the closing quote
      } else {
        size_t end = text.find(',', i);
        if (end == std::string_view::npos) end = text.size();
        param = std::string(text::trim(text.substr(i, end - i)));
        i = end;
      }
      if (name == "realm") challenge.realm = param;
      if (name == "service") challenge.service = param;
      if (name == "scope") challenge.scope = param;
    }
    if (!challenge.realm.empty()) return challenge;
  }
  return std::nullopt;
}

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

class MemorySink : public Sink {
 public:
  std::string data;

 protected:
  void write(const char* bytes, size_t size) override { data.append(bytes, size); }
  void discard() override { data.clear(); }
};

class FileSink : public Sink {
 public:
  FileSink(int fd, const std::string& path, const std::function<void(uint64_t)>& progress)
      : fd_(fd), path_(path), progress_(progress) {}

 protected:
  void write(const char* bytes, size_t size) override {
    while (size > 0) {
      ssize_t n = ::pwrite(fd_, bytes, size, static_cast<off_t>(written_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Fatal{errno_message("write " + path_, errno)};
      bytes += n;
      size -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
    if (progress_) progress_(written_);
  }
  void discard() override {
    if (::ftruncate(fd_, 0) != 0) throw Fatal{errno_message("truncate " + path_, errno)};
    written_ = 0;
    if (progress_) progress_(0);
  }

 private:
  int fd_;
  const std::string& path_;
  const std::function<void(uint64_t)>& progress_;
  uint64_t written_ = 0;
};

// "bytes 100-199/200" -> 100.
std::optional<uint64_t> range_start(std::string_view content_range) {
  content_range = text::trim(content_range);
  if (!starts_with(content_range, "bytes ")) return std::nullopt;
  content_range.remove_prefix(6);
  return text::parse_uint(content_range.substr(0, content_range.find('-')));
}

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

asio::ip::address to_asio(const egress::Address& address) {
  if (address.family == AF_INET) {
    asio::ip::address_v4::bytes_type bytes;
    std::memcpy(bytes.data(), address.bytes, bytes.size());
    return asio::ip::address_v4(bytes);
  }
  asio::ip::address_v6::bytes_type bytes;
  std::memcpy(bytes.data(), address.bytes, bytes.size());
  return asio::ip::address_v6(bytes);
}

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

struct Fetched {
  std::string media_type;       // of the Content-Type
  std::string registry_digest;  // Docker-Content-Digest
  std::string digest;           // of the content
};

}  // namespace

struct RegistryClient::Impl {
  Impl(Reference reference, RegistryOptions opts)
      : ref(std::move(reference)), options(std::move(opts)), chunk(kChunkBytes) {
    options.attempts = std::max(options.attempts, 1);
    options.backoff_ms = std::max(options.backoff_ms, 0);
    options.timeout_ms = std::max(options.timeout_ms, 1);
    if (options.user_agent.empty()) options.user_agent = "openshell/" OPENSHELL_VERSION;
    bool https = !(options.insecure || ref.is_local_registry());
    auto url = parse_authority(ref.registry_host(), https);
    if (!url) throw RegistryError("registry " + ref.registry_host() + ": not a host[:port]", 0);
    registry = *url;
  }

  // --- running one step ---

  std::chrono::milliseconds timeout() const {
    return std::chrono::milliseconds(options.timeout_ms);
  }

  std::string step_message(const beast::error_code& ec) const {
    if (ec == beast::error::timeout) return "timed out after " + duration_text(options.timeout_ms);
    if (ec == bhttp::error::partial_message || ec == bhttp::error::end_of_stream ||
        ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
      return "the server closed the connection";
    return ec.message();
  }

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

  std::vector<egress::Address> addresses_of(const std::string& host) {
    if (auto literal = egress::Address::parse(host)) return {*literal};
    if (auto it = resolved.find(host); it != resolved.end()) return it->second;
    if (!resolver) {
      try {
        resolver =
            std::make_unique<egress::Resolver>(io, egress::ResolverConfig::from_environment());
      } catch (const Error& e) {
        throw Fatal{std::string("resolve ") + host + ": " + e.what()};
      }
    }
    struct Lookup {
      bool done = false, expired = false;
      std::vector<egress::Address> addresses;
      std::string error;
    };
    // Shared with the callbacks: a lookup that timed out may still answer.
    auto lookup = std::make_shared<Lookup>();
    resolver->resolve(host, [lookup](std::vector<egress::Address> addresses, std::string error) {
      lookup->done = true;
      lookup->addresses = std::move(addresses);
      lookup->error = std::move(error);
    });
    asio::steady_timer timer(io);
    timer.expires_after(timeout());
    timer.async_wait([lookup](beast::error_code ec) {
      if (!ec) lookup->expired = true;
    });
    io.restart();
    while (!lookup->done && !lookup->expired && io.run_one() > 0) {
    }
    timer.cancel();
    if (!lookup->done)
      throw Transient{"resolve " + host + ": no answer within " +
                      duration_text(options.timeout_ms)};
    if (!lookup->error.empty()) {
      // A name that does not exist will not exist on the next try either.
      std::string_view error = lookup->error;
      bool lasting = error.size() >= 12 && (error.substr(error.size() - 12) == "no such host" ||
                                            error.find("not a valid host name") != error.npos);
      if (lasting) throw Fatal{lookup->error};
      throw Transient{lookup->error};
    }
    if (lookup->addresses.empty()) throw Fatal{host + ": the name has no addresses"};
    resolved[host] = lookup->addresses;
    return lookup->addresses;
  }

  asio::ssl::context& tls_context() {
    if (tls) return *tls;
    tls.emplace(asio::ssl::context::tls_client);
    SSL_CTX* ctx = tls->native_handle();
    SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
    // SSL_CERT_FILE and SSL_CERT_DIR, else OpenSSL's own directory.
    SSL_CTX_set_default_verify_paths(ctx);
    for (const char* bundle : kCaBundles) {
      if (::access(bundle, R_OK) == 0) {
        SSL_CTX_load_verify_locations(ctx, bundle, nullptr);
        break;
      }
    }
    ERR_clear_error();  // a missing default file is not an error
    SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
    return *tls;
  }

  void connect(Connection& connection, const Url& url) {
    std::vector<egress::Address> addresses = addresses_of(url.host);
    bool named = !egress::Address::parse(url.host);
    std::string last_error;
    for (const egress::Address& address : addresses) {
      tcp::endpoint endpoint(to_asio(address), url.port);
      std::string where = url.host_port();
      if (named)
        where +=
            " (" +
            (address.family == AF_INET6 ? "[" + address.to_string() + "]" : address.to_string()) +
            ":" + std::to_string(url.port) + ")";
      // Asio opens sockets without SOCK_CLOEXEC; ours must not leak into children.
      UniqueFd fd(::socket(address.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (!fd) throw Transient{errno_message("socket for " + where, errno)};
      beast::tcp_stream stream(io);
      beast::error_code ec;
      stream.socket().assign(endpoint.protocol(), fd.get(), ec);
      if (ec) throw Transient{"socket for " + where + ": " + ec.message()};
      fd.release();
      stream.expires_after(timeout());
      ec = run([&](auto handler) { stream.async_connect(endpoint, std::move(handler)); });
      if (ec) {
        last_error = "connect to " + where + ": " + step_message(ec);
        continue;
      }
      connection.tcp.emplace(std::move(stream));
      break;
    }
    if (!connection.tcp) throw Transient{last_error};
    if (url.https) handshake(connection, url);
  }

  void handshake(Connection& connection, const Url& url) {
    connection.tls.emplace(std::move(*connection.tcp), tls_context());
    connection.tcp.reset();
    SSL* ssl = connection.tls->native_handle();
    if (egress::Address::parse(url.host)) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), url.host.c_str());
    } else {
      SSL_set_tlsext_host_name(ssl, url.host.c_str());
      SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
      SSL_set1_host(ssl, url.host.c_str());
    }
    connection.lowest().expires_after(timeout());
    beast::error_code ec = run([&](auto handler) {
      connection.tls->async_handshake(asio::ssl::stream_base::client, std::move(handler));
    });
    if (!ec) return;
    std::string what = "TLS handshake with " + url.host_port() + ": ";
    long verify = SSL_get_verify_result(ssl);
    if (verify != X509_V_OK)
      throw Fatal{what + "certificate verify failed: " + X509_verify_cert_error_string(verify)};
    if (ec.category() == asio::error::get_ssl_category()) {
      // A plain-HTTP server answers a ClientHello with "HTTP/1.x 400",
      // which OpenSSL reads as a record of a wrong version.
      std::string hint = ec.message().find("wrong version number") != std::string::npos
                             ? " (a plain-HTTP registry? pull with --insecure to use HTTP)"
                             : "";
      throw Fatal{what + ec.message() + hint};
    }
    throw Transient{what + step_message(ec)};
  }

  // The open connection to url's origin, else a new one.
  Connection& connection_for(const Url& url) {
    std::string key = url.origin();
    auto it = connections.find(key);
    if (it != connections.end() && (it->second->busy || !it->second->is_open())) {
      connections.erase(it);
      it = connections.end();
    }
    if (it != connections.end()) return *it->second;
    if (connections.size() >= kMaxConnections) connections.erase(connections.begin());
    auto connection = std::make_unique<Connection>();
    connect(*connection, url);
    return *connections.emplace(key, std::move(connection)).first->second;
  }

  void drop(const Url& url) { connections.erase(url.origin()); }

  // --- one request and its answer ---

  // Sends a GET and reads the answer's header. A kept-alive connection that
  // the server had closed meanwhile is replaced once, at no cost.
  Reply exchange(const Url& url, const Fields& fields) {
    for (bool replaced = false;; replaced = true) {
      Connection& connection = connection_for(url);
      bool reused = connection.answers > 0;
      bhttp::request<bhttp::empty_body> request{bhttp::verb::get, url.target, 11};
      request.set(bhttp::field::host, url.host_port());
      request.set(bhttp::field::user_agent, options.user_agent);
      for (const auto& [name, value] : fields) request.set(name, value);

      auto parser = std::make_unique<Parser>();
      parser->header_limit(kHeaderLimit);
      // The callers count. (Not boost::none: Boost 1.74 then refuses any
      // Content-Length.)
      parser->body_limit(std::numeric_limits<uint64_t>::max());
      const char* step = "send the request to ";
      beast::error_code ec = on_stream(connection, [&](auto& stream, auto handler) {
        bhttp::async_write(stream, request, std::move(handler));
      });
      if (!ec) {
        step = "read the answer from ";
        ec = on_stream(connection, [&](auto& stream, auto handler) {
          bhttp::async_read_header(stream, connection.buffer, *parser, std::move(handler));
        });
      }
      if (!ec) {
        ++connection.answers;
        connection.busy = true;
        Reply reply;
        reply.url = url;
        auto& message = parser->get();
        reply.status = static_cast<int>(message.result_int());
        std::string reason = str(message.reason());
        if (reason.empty()) reason = str(bhttp::obsolete_reason(message.result()));
        reply.status_line = std::to_string(reply.status) + " " + printable(reason);
        for (const auto& field : message)
          reply.headers.emplace_back(lower(str(field.name_string())), str(field.value()));
        if (auto length = parser->content_length()) reply.content_length = *length;
        reply.connection = &connection;
        reply.parser = std::move(parser);
        return reply;
      }
      bool nothing_came = !parser->got_some();
      drop(url);
      bool closed = ec == bhttp::error::end_of_stream || ec == asio::error::eof ||
                    ec == asio::error::connection_reset || ec == asio::error::broken_pipe ||
                    ec == asio::ssl::error::stream_truncated;
      if (reused && !replaced && nothing_came && closed) continue;
      bool malformed =
          ec.category() == bhttp::make_error_code(bhttp::error::bad_version).category() &&
          ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message;
      if (malformed)
        throw Fatal{"the answer from " + url.host_port() + " is not valid HTTP: " + ec.message()};
      throw Transient{step + url.host_port() + ": " + step_message(ec)};
    }
  }

  // Reads the rest of reply's body into sink, in chunks. Returns what broke
  // the transfer, if anything. Exceptions from sink leave the connection busy
  // (it is then replaced).
  beast::error_code read_body(Reply& reply, const std::function<void(const char*, size_t)>& sink) {
    Connection& connection = *reply.connection;
    Parser& parser = *reply.parser;
    while (!parser.is_done()) {
      parser.get().body().data = chunk.data();
      parser.get().body().size = chunk.size();
      beast::error_code ec = on_stream(connection, [&](auto& stream, auto handler) {
        bhttp::async_read_some(stream, connection.buffer, parser, std::move(handler));
      });
      if (ec == bhttp::error::need_buffer) ec = {};
      size_t received = chunk.size() - parser.get().body().size;
      if (received > 0) sink(chunk.data(), received);
      if (ec) {
        drop(reply.url);
        return ec;
      }
    }
    connection.busy = false;
    if (!parser.keep_alive()) drop(reply.url);
    return {};
  }

  // An answer that is not used: its body (at most kMaxErrorBodyBytes, for an
  // error message), read so that the connection can serve the next request.
  std::string drain(Reply& reply) {
    std::string body;
    try {
      read_body(reply, [&body](const char* data, size_t size) {
        if (body.size() + size > kMaxErrorBodyBytes) throw BodyTooLarge{};
        body.append(data, size);
      });
    } catch (const BodyTooLarge&) {
      drop(reply.url);
    }
    return body;
  }

  // Follows redirects; the token goes only to the registry itself.
  Reply follow(Url url, const Fields& fields, bool with_token) {
    for (int redirects = 0;; ++redirects) {
      Fields sent = fields;
      if (with_token && !token.empty() && url.same_origin(registry))
        sent.emplace_back("Authorization", "Bearer " + token);
      Reply reply = exchange(url, sent);
      std::string location = reply.header("location");
      if (!is_redirect(reply.status) || location.empty()) return reply;
      drain(reply);
      if (redirects == kMaxRedirects)
        throw Fatal{"more than " + std::to_string(kMaxRedirects) + " redirects (the last from " +
                    url.host_port() + " to " + printable(location) + ")"};
      auto next = resolve_location(url, location);
      if (!next)
        throw Fatal{url.host_port() + " redirected to an invalid location: " + printable(location)};
      if (url.https && !next->https && !options.insecure)
        throw Fatal{"refused the redirect from " + url.origin() + " to plain HTTP (" +
                    next->origin() + ")"};
      url = *next;
    }
  }

  // GET path on the registry: redirects followed, a bearer token fetched
  // when the registry asks for one.
  Reply open(const std::string& path, const Fields& fields) {
    Url url = registry;
    url.target = path;
    for (int round = 0;; ++round) {
      Reply reply = follow(url, fields, true);
      if (reply.status != 401 || !reply.url.same_origin(registry)) return reply;
      std::vector<std::string> challenges = reply.all("www-authenticate");
      drain(reply);
      auto challenge = bearer_challenge(challenges);
      // A second 401 comes after a token fetched just now (the first may have
      // followed a cached token that expired).
      if (!challenge || round > 0)
        throw Fatal{"registry " + registry.host_port() +
                        " requires authentication; anonymous access was refused",
                    401};
      token = fetch_token(*challenge);
    }
  }

  std::string fetch_token(const Challenge& challenge) {
    std::string from = "registry " + registry.host_port();
    auto url = parse_url(challenge.realm);
    if (!url) throw Fatal{from + " named an invalid token realm: " + printable(challenge.realm)};
    if (registry.https && !url->https && !options.insecure)
      throw Fatal{from + " named a token realm on plain HTTP (" + url->origin() + "); refused"};
    std::string scope =
        challenge.scope.empty() ? "repository:" + ref.repository + ":pull" : challenge.scope;
    std::string query;
    if (!challenge.service.empty())
      query = "service=" + net::percent_encode(challenge.service) + "&";
    query += "scope=" + net::percent_encode(scope);
    url->target += (url->target.find('?') == std::string::npos ? "?" : "&") + query;

    Reply reply = follow(*url, {{"Accept", "application/json"}}, false);
    std::string who = "token server " + reply.url.host_port();
    if (reply.status != 200) status_failure(reply, who);
    std::string body;
    beast::error_code ec = read_body(reply, [&body](const char* data, size_t size) {
      if (body.size() + size > kMaxTokenBytes)
        throw Fatal{"the answer of the token server is larger than " +
                    text::format_bytes(kMaxTokenBytes)};
      body.append(data, size);
    });
    if (ec)
      throw Transient{"read the token from " + reply.url.host_port() + ": " + step_message(ec)};
    json doc = json::parse(body, nullptr, false);
    for (const char* key : {"token", "access_token"}) {
      if (doc.is_object() && doc.contains(key) && doc[key].is_string()) {
        std::string value = doc[key].get<std::string>();
        if (valid_token_text(value)) return value;
      }
    }
    throw Fatal{who + " answered without a usable token"};
  }

  // An answer other than the one wanted: Transient or Fatal, with the
  // server's own message when it sent one.
  [[noreturn]] void status_failure(Reply& reply, const std::string& who) {
    int status = reply.status;
    std::string status_line = reply.status_line;
    std::string retry_after = reply.header("retry-after");
    std::string message = registry_error_message(drain(reply));
    if (is_retryable_status(status)) {
      Transient failure;
      failure.status = status;
      failure.who = who;
      failure.status_line = status_line;
      failure.detail = message;
      if (status == 429 || status == 503) {
        if (auto seconds = text::parse_uint(text::trim(retry_after), 3600))
          failure.retry_after_ms = static_cast<int>(
              std::min<uint64_t>(*seconds * 1000, static_cast<uint64_t>(kMaxRetryAfterMs)));
      }
      throw failure;
    }
    if (!message.empty()) throw Fatal{message + " (" + std::to_string(status) + ")", status};
    throw Fatal{who + " answered " + status_line, status};
  }

  // --- one object, with retries ---

  Fetched fetch_once(const Object& object, Sink& sink, bool resume) {
    Fields fields;
    if (!object.accept.empty()) fields.emplace_back("Accept", object.accept);
    uint64_t offset = resume ? sink.size() : 0;
    if (offset > 0) fields.emplace_back("Range", "bytes=" + std::to_string(offset) + "-");
    Reply reply = open(object.path, fields);
    std::string who = "registry " + reply.url.host_port();
    if (reply.status == 206 && offset > 0 && range_start(reply.header("content-range")) == offset) {
      sink.resumed = true;
    } else if (reply.status == 200) {
      sink.restart();
    } else if (reply.status == 206) {
      std::string range = reply.header("content-range");
      drain(reply);
      sink.restart();
      Transient failure{who + " answered with another range than asked for (" + printable(range) +
                        ")"};
      failure.resumable = false;
      throw failure;
    } else {
      status_failure(reply, who);
    }
    bool ranges =
        iequals(text::trim(reply.header("accept-ranges")), "bytes") || reply.status == 206;
    Fetched fetched{media_type_of(reply.header("content-type")),
                    std::string(text::trim(reply.header("docker-content-digest"))), ""};
    std::optional<uint64_t> total;
    if (object.size >= 0)
      total = static_cast<uint64_t>(object.size);
    else if (reply.content_length)
      total = sink.size() + *reply.content_length;

    beast::error_code ec = read_body(reply, [&](const char* data, size_t size) {
      if (sink.size() + size > object.max_bytes)
        throw Fatal{"larger than the limit of " + text::format_bytes(object.max_bytes)};
      if (object.size >= 0 && sink.size() + size > static_cast<uint64_t>(object.size))
        throw Fatal{"larger than its size of " + std::to_string(object.size) + " bytes"};
      sink.append(data, size);
    });
    if (ec || (total && sink.size() < *total)) {
      Transient failure;
      failure.reason = "the transfer ended after " + std::to_string(sink.size()) +
                       (total ? " of " + std::to_string(*total) : "") + " bytes";
      if (ec) failure.reason += ": " + step_message(ec);
      failure.resumable = object.resume && ranges;
      throw failure;
    }
    fetched.digest = sink.digest();
    if (!object.digest.empty() && fetched.digest != object.digest) {
      if (sink.resumed) {
        // The pieces may not belong together: once more, from the start.
        sink.restart();
        Transient failure{"content does not match its digest after a resumed transfer"};
        failure.resumable = false;
        throw failure;
      }
      throw Fatal{"content does not match its digest (got " + fetched.digest + ")"};
    }
    return fetched;
  }

  Fetched fetch(const Object& object, Sink& sink) {
    bool resume = false;
    for (int attempt = 1;; ++attempt) {
      try {
        return fetch_once(object, sink, resume);
      } catch (const Transient& failure) {
        if (attempt >= options.attempts)
          throw RegistryError(exhausted(object, failure, attempt), failure.status);
        resume = failure.resumable.value_or(resume);
        int delay = failure.retry_after_ms;
        if (delay < 0)
          delay = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(options.backoff_ms)
                                                         << std::min(attempt - 1, 20),
                                                     kMaxBackoffMs));
        std::this_thread::sleep_for(std::chrono::milliseconds(delay));
      } catch (const Fatal& failure) {
        throw RegistryError(object.what + ": " + failure.reason, failure.status);
      } catch (const boost::system::system_error& e) {
        throw RegistryError(object.what + ": " + e.what(), 0);
      }
    }
  }

  static std::string exhausted(const Object& object, const Transient& failure, int attempts) {
    std::string count =
        " (" + std::to_string(attempts) + (attempts == 1 ? " attempt)" : " attempts)");
    std::string detail = failure.detail.empty() ? "" : ": " + failure.detail;
    if (failure.status == 429)
      return failure.who + " rate limited (429) the requests for " + object.what + count + detail;
    if (failure.status != 0)
      return failure.who + " answered " + failure.status_line + " for " + object.what + count +
             detail;
    return object.what + ": " + failure.reason + count;
  }

  std::string blob_what(const std::string& digest) const {
    return "blob " + digest + " from " + ref.name();
  }

  Object blob_object(const std::string& digest) const {
    std::string what = blob_what(digest);
    if (!is_digest(digest)) throw RegistryError(what + ": not a sha256 digest", 0);
    Object object;
    object.what = what;
    object.path = "/v2/" + ref.repository + "/blobs/" + digest;
    object.digest = digest;
    return object;
  }

  // Members in this order: connections and the resolver go before the loop.
  Reference ref;
  RegistryOptions options;
  Url registry;  // scheme, host and port
  std::string token;
  std::vector<char> chunk;
  asio::io_context io;
  std::optional<asio::ssl::context> tls;
  std::unique_ptr<egress::Resolver> resolver;
  std::map<std::string, std::vector<egress::Address>> resolved;
  std::map<std::string, std::unique_ptr<Connection>> connections;  // by origin
};

RegistryClient::RegistryClient(Reference ref, RegistryOptions options)
    : impl_(std::make_unique<Impl>(std::move(ref), std::move(options))) {}

RegistryClient::~RegistryClient() = default;

RegistryClient::Manifest RegistryClient::manifest(const std::string& tag_or_digest) {
  Impl& d = *impl_;
  bool by_digest = is_digest(tag_or_digest);
  Object object;
  object.what = d.ref.name() + (by_digest ? "@" : ":") + tag_or_digest;
  if (!by_digest && !valid_tag(tag_or_digest))
    throw RegistryError(object.what + ": neither a tag nor a sha256 digest", 0);
  object.path = "/v2/" + d.ref.repository + "/manifests/" + tag_or_digest;
  object.accept = kManifestAccept;
  object.max_bytes = kMaxManifestBytes;
  if (by_digest) object.digest = tag_or_digest;

  MemorySink sink;
  Fetched fetched = d.fetch(object, sink);
  if (is_digest(fetched.registry_digest) && fetched.registry_digest != fetched.digest)
    throw RegistryError(object.what + ": the registry's Docker-Content-Digest " +
                            fetched.registry_digest + " does not match the content (" +
                            fetched.digest + ")",
                        0);
  Manifest manifest;
  manifest.media_type = fetched.media_type;
  manifest.body = std::move(sink.data);
  manifest.digest = fetched.digest;
  // Some registries answer application/json or nothing; the body says.
  bool known = manifest.media_type == kMediaTypeOciIndex ||
               manifest.media_type == kMediaTypeOciManifest ||
               manifest.media_type == kMediaTypeDockerManifestList ||
               manifest.media_type == kMediaTypeDockerManifest;
  if (!known) {
    json doc = json::parse(manifest.body, nullptr, false);
    if (doc.is_object() && doc.contains("mediaType") && doc["mediaType"].is_string())
      manifest.media_type = doc["mediaType"].get<std::string>();
  }
  return manifest;
}

std::string RegistryClient::blob(const std::string& digest, size_t max) {
  Object object = impl_->blob_object(digest);
  object.max_bytes = max;
  MemorySink sink;
  impl_->fetch(object, sink);
  return std::move(sink.data);
}

void RegistryClient::blob_to_file(const std::string& digest, int64_t size, const std::string& path,
                                  const std::function<void(uint64_t)>& progress) {
  Object object = impl_->blob_object(digest);
  object.size = size;
  object.resume = true;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) throw RegistryError(object.what + ": " + errno_message("create " + path, errno), 0);
  try {
    FileSink sink(fd.get(), path, progress);
    impl_->fetch(object, sink);
    if (::close(fd.release()) != 0)
      throw RegistryError(object.what + ": " + errno_message("write " + path, errno), 0);
  } catch (...) {
    fd.reset();
    ::unlink(path.c_str());
    throw;
  }
}

}  // namespace openshell::image
