// Registry transport: resolving, TCP and TLS connections, requests, redirects.
// Names resolve through net::dns; one connection is kept per origin.
#include <fcntl.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "base/error.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "image/registry_internal.h"

namespace openshell::image {
namespace {

// The distributions' CA bundles; a static binary cannot rely on OpenSSL's
// compiled-in directory existing on the host.
constexpr const char* kCaBundles[] = {
    "/etc/ssl/certs/ca-certificates.crt",                 // Debian, Ubuntu, Arch, Gentoo
    "/etc/pki/tls/certs/ca-bundle.crt",                   // Fedora, RHEL
    "/etc/ssl/ca-bundle.pem",                             // openSUSE
    "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",  // CentOS, RHEL
    "/etc/ssl/cert.pem",                                  // Alpine
};

}  // namespace

namespace registry_detail {

asio::ip::address to_asio(const Address& address) {
  if (address.family == AF_INET) {
    asio::ip::address_v4::bytes_type bytes;
    std::memcpy(bytes.data(), address.bytes, bytes.size());
    return asio::ip::address_v4(bytes);
  }
  asio::ip::address_v6::bytes_type bytes;
  std::memcpy(bytes.data(), address.bytes, bytes.size());
  return asio::ip::address_v6(bytes);
}

}  // namespace registry_detail

std::string RegistryClient::Impl::step_message(const beast::error_code& ec) const {
  if (ec == beast::error::timeout) return "timed out after " + duration_text(options.timeout_ms);
  if (ec == bhttp::error::partial_message || ec == bhttp::error::end_of_stream ||
      ec == asio::error::eof || ec == asio::ssl::error::stream_truncated)
    return "the server closed the connection";
  return ec.message();
}

std::vector<Address> RegistryClient::Impl::addresses_of(const std::string& host) {
  if (auto literal = Address::parse(host)) return {*literal};
  if (auto it = resolved.find(host); it != resolved.end()) return it->second;
  if (!resolver) {
    try {
      resolver =
          std::make_unique<net::dns::Resolver>(io, net::dns::ResolverConfig::from_environment());
    } catch (const Error& e) {
      throw Fatal{std::string("resolve ") + host + ": " + e.what()};
    }
  }
  struct Lookup {
    bool done = false, expired = false;
    std::vector<Address> addresses;
    std::string error;
  };
  // Shared with the callbacks: a lookup that timed out may still answer.
  auto lookup = std::make_shared<Lookup>();
  resolver->resolve(host, [lookup](std::vector<Address> addresses, std::string error) {
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
    throw Transient{"resolve " + host + ": no answer within " + duration_text(options.timeout_ms)};
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

asio::ssl::context& RegistryClient::Impl::tls_context() {
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

void RegistryClient::Impl::connect(Connection& connection, const Url& url) {
  std::vector<Address> addresses = addresses_of(url.host);
  bool named = !Address::parse(url.host);
  std::string last_error;
  for (const Address& address : addresses) {
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

void RegistryClient::Impl::handshake(Connection& connection, const Url& url) {
  connection.tls.emplace(std::move(*connection.tcp), tls_context());
  connection.tcp.reset();
  SSL* ssl = connection.tls->native_handle();
  if (Address::parse(url.host)) {
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
Connection& RegistryClient::Impl::connection_for(const Url& url) {
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

// Sends a GET and reads the answer's header. A kept-alive connection that
// the server had closed meanwhile is replaced once, at no cost.
Reply RegistryClient::Impl::exchange(const Url& url, const Fields& fields, const Send& send) {
  for (bool replaced = false;; replaced = true) {
    Connection& connection = connection_for(url);
    bool reused = connection.answers > 0;
    bhttp::request<bhttp::string_body> request{send.method, url.target, 11};
    request.set(bhttp::field::host, url.host_port());
    request.set(bhttp::field::user_agent, options.user_agent);
    for (const auto& [name, value] : fields) request.set(name, value);
    if (send.method != bhttp::verb::get && send.method != bhttp::verb::head) {
      if (!send.content_type.empty())
        request.set(bhttp::field::content_type, std::string(send.content_type));
      request.body().assign(send.body.data(), send.body.size());
      request.content_length(send.body.size());
    }

    auto parser = std::make_unique<Parser>();
    if (send.method == bhttp::verb::head) parser->skip(true);  // a length, but no body
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
beast::error_code RegistryClient::Impl::read_body(
    Reply& reply, const std::function<void(const char*, size_t)>& sink) {
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
std::string RegistryClient::Impl::drain(Reply& reply) {
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
Reply RegistryClient::Impl::follow(Url url, const Fields& fields, bool with_token) {
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

}  // namespace openshell::image
