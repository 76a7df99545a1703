// TLS for the API: contexts (TLS 1.3, client certificates required), the
// peer's subject, the pump between a TLS stream and a socketpair, and the
// words for every way a client fails to reach a TCP endpoint.
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/write.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "base/error.h"
#include "net/http_internal.h"

namespace openshell::net::detail {

namespace {

constexpr size_t kPumpChunk = 64u << 10;

// What OpenSSL's error queue says, or ec's message.
std::string ssl_reason(const beast::system_error& e) {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code != 0) {
    char text[256];
    ERR_error_string_n(code, text, sizeof text);
    if (const char* reason = ERR_reason_error_string(code)) return reason;
    return text;
  }
  return e.code().message();
}

template <class F>
void load(const std::string& what, const std::string& file, F&& body) {
  try {
    body();
  } catch (const beast::system_error& e) {
    throw Error("load the " + what + " " + file + ": " + ssl_reason(e));
  }
}

std::shared_ptr<ssl::context> tls13_context(ssl::context::method method) {
  auto context = std::make_shared<ssl::context>(method);
  SSL_CTX* native = context->native_handle();
  SSL_CTX_set_min_proto_version(native, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(native, TLS1_3_VERSION);
  return context;
}

void load_own(ssl::context& context, const TlsFiles& files) {
  load("certificate", files.cert, [&] { context.use_certificate_chain_file(files.cert); });
  load("key", files.key, [&] { context.use_private_key_file(files.key, ssl::context::pem); });
  if (SSL_CTX_check_private_key(context.native_handle()) != 1) {
    ERR_clear_error();
    throw Error("the key " + files.key + " does not belong to the certificate " + files.cert);
  }
}

bool is_ip_address(const std::string& host) {
  beast::error_code ec;
  asio::ip::make_address(host, ec);
  return !ec;
}

// The texts of a certificate subject's entries of one kind (its common names).
std::vector<std::string> subject_entries(X509_NAME* name, int nid) {
  std::vector<std::string> entries;
  for (int i = X509_NAME_get_index_by_NID(name, nid, -1); i >= 0;
       i = X509_NAME_get_index_by_NID(name, nid, i)) {
    ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(name, i));
    unsigned char* utf8 = nullptr;
    int length = ASN1_STRING_to_UTF8(&utf8, data);
    if (length < 0) continue;
    entries.emplace_back(reinterpret_cast<char*>(utf8), static_cast<size_t>(length));
    OPENSSL_free(utf8);
  }
  return entries;
}

}  // namespace

std::shared_ptr<ssl::context> server_tls_context(const TlsFiles& files) {
  auto context = tls13_context(ssl::context::tls_server);
  load_own(*context, files);
  load("CA", files.ca, [&] { context->load_verify_file(files.ca); });
  // The CA's name in the CertificateRequest helps a client with several
  // certificates pick the right one.
  if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.ca.c_str()))
    SSL_CTX_set_client_CA_list(context->native_handle(), names);
  ERR_clear_error();
  context->set_verify_mode(ssl::verify_peer | ssl::verify_fail_if_no_peer_cert);
  // Our clients never resume a session: tickets would only be bytes sent
  // after every handshake.
  SSL_CTX_set_num_tickets(context->native_handle(), 0);
  SSL_CTX_set_session_cache_mode(context->native_handle(), SSL_SESS_CACHE_OFF);
  return context;
}

namespace {

std::shared_ptr<ssl::context> load_client_context(const TlsFiles& files) {
  auto context = tls13_context(ssl::context::tls_client);
  if (files.ca.empty()) throw Error("a TLS gateway needs the CA that signed its certificate");
  load("CA", files.ca, [&] { context->load_verify_file(files.ca); });
  if (!files.cert.empty()) load_own(*context, files);
  context->set_verify_mode(ssl::verify_peer);
  return context;
}

// What changes when a file is rewritten or replaced ("" when it is missing).
std::string file_stamp(const std::string& path) {
  struct stat st;
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return "";
  return std::to_string(st.st_dev) + ":" + std::to_string(st.st_ino) + ":" +
         std::to_string(st.st_size) + ":" + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

}  // namespace

// One context per set of files and their versions, for the whole process:
// with OpenSSL 3 a context's making (its providers, the PEM decoders) costs
// more than the handshake itself, and one command opens several connections.
std::shared_ptr<ssl::context> client_tls_context(const TlsFiles& files) {
  std::string key;
  for (const std::string* path : {&files.ca, &files.cert, &files.key})
    key += *path + "\n" + file_stamp(*path) + "\n";
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<ssl::context>> made;
  std::lock_guard lock(mutex);
  auto it = made.find(key);
  if (it != made.end()) return it->second;
  auto context = load_client_context(files);
  made[key] = context;
  return context;
}

void expect_server_name(TlsStream& stream, const std::string& host) {
  SSL* native = stream.native_handle();
  X509_VERIFY_PARAM* param = SSL_get0_param(native);
  if (is_ip_address(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  } else {
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), host.size());
    SSL_set_tlsext_host_name(native, host.c_str());
  }
}

PeerCredentials tls_peer(TlsStream& stream, const std::string& address) {
  PeerCredentials peer;
  peer.transport = PeerCredentials::Transport::kTls;
  // No uid: a TLS peer must never read as root.
  peer.pid = 0;
  peer.uid = static_cast<uid_t>(-1);
  peer.gid = static_cast<gid_t>(-1);
  peer.address = address;
  X509* cert = SSL_get1_peer_certificate(stream.native_handle());
  if (!cert) return peer;
  X509_NAME* name = X509_get_subject_name(cert);
  auto common_names = subject_entries(name, NID_commonName);
  if (common_names.size() == 1) peer.subject = common_names[0];
  for (const auto& unit : subject_entries(name, NID_organizationalUnitName))
    if (unit == "admin") peer.admin = true;
  X509_free(cert);
  return peer;
}

std::string address_text(const Tcp::endpoint& endpoint) {
  auto address = endpoint.address();
  std::string host = address.to_string();
  if (address.is_v6()) host = "[" + host + "]";
  return host + ":" + std::to_string(endpoint.port());
}

std::string connect_failure(const Endpoint& endpoint, const beast::error_code& ec, SSL* ssl) {
  const std::string url = endpoint.url();
  const bool tls = endpoint.kind == Endpoint::Kind::kTls;
  if (ec == asio::error::connection_refused) return "nothing listens at " + url;
  if (ec.category() == asio::error::get_ssl_category()) {
    int reason = ERR_GET_REASON(static_cast<unsigned long>(ec.value()));
    switch (reason) {
      case SSL_R_CERTIFICATE_VERIFY_FAILED: {
        long result = ssl ? SSL_get_verify_result(ssl) : X509_V_OK;
        if (result == X509_V_ERR_HOSTNAME_MISMATCH || result == X509_V_ERR_IP_ADDRESS_MISMATCH)
          return "the gateway's certificate at " + url + " is not issued for " + endpoint.host +
                 " (its subject alternative names do not include it)";
        if (result == X509_V_ERR_CERT_HAS_EXPIRED)
          return "the gateway's certificate at " + url + " has expired";
        if (result == X509_V_ERR_CERT_NOT_YET_VALID)
          return "the gateway's certificate at " + url + " is not valid yet";
        return "the gateway's certificate at " + url + " is not signed by the CA in " +
               endpoint.tls.ca + " (" + X509_verify_cert_error_string(result) + ")";
      }
      case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
        return "the gateway at " + url +
               " refused our certificate: it is not signed by a CA the gateway trusts";
      case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
        return "the gateway at " + url + " refused our certificate: it has expired";
      case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
        return "the gateway at " + url +
               " refused the connection: it requires a client certificate and we gave none";
      case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
      case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
      case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
      case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
        return "the gateway at " + url + " refused our certificate (" +
               ERR_reason_error_string(static_cast<unsigned long>(ec.value())) + ")";
      case SSL_R_WRONG_VERSION_NUMBER:
      case SSL_R_PACKET_LENGTH_TOO_LONG:
      case SSL_R_HTTP_REQUEST:
      case SSL_R_RECORD_LENGTH_MISMATCH:
        return "the server at " + endpoint.host_port() +
               " answered in plain HTTP where TLS was expected (an --insecure-listen port is "
               "reached with http://" +
               endpoint.host_port() + ")";
      case SSL_R_TLSV1_ALERT_PROTOCOL_VERSION:
      case SSL_R_UNSUPPORTED_PROTOCOL:
        return "the server at " + url + " does not speak TLS 1.3";
      default:
        break;
    }
  }
  if (tls && (ec == asio::error::eof || ec == ssl::error::stream_truncated ||
              ec == asio::error::connection_reset))
    return "the gateway at " + url + " closed the connection during the TLS handshake";
  return "connect " + url + ": " + ec.message();
}

// --- the pump ----------------------------------------------------------------------

TlsPump::TlsPump(std::shared_ptr<ssl::context> context, std::unique_ptr<TlsStream> stream,
                 Local::socket local)
    : context_(std::move(context)),
      stream_(std::move(stream)),
      local_(std::move(local)),
      from_tls_(kPumpChunk),
      from_local_(kPumpChunk) {}

void TlsPump::start() {
  read_tls();
  read_local();
}

void TlsPump::read_tls() {
  stream_->async_read_some(
      asio::buffer(from_tls_), [self = shared_from_this()](beast::error_code ec, size_t n) {
        if (self->closed_) return;
        if (ec) {
          // The peer's end (with or without close_notify: every message of
          // the API says its own length) lets the local side finish.
          if (ec != asio::error::eof && ec != ssl::error::stream_truncated) {
            self->tls_error_ = ec;
            self->close_all();
            return;
          }
          beast::error_code ignored;
          self->local_.shutdown(Local::socket::shutdown_send, ignored);
          return;
        }
        asio::async_write(self->local_, asio::buffer(self->from_tls_.data(), n),
                          [self](beast::error_code write_ec, size_t) {
                            if (self->closed_) return;
                            if (write_ec) {
                              self->close_all();
                              return;
                            }
                            self->read_tls();
                          });
      });
}

void TlsPump::read_local() {
  local_.async_read_some(
      asio::buffer(from_local_), [self = shared_from_this()](beast::error_code ec, size_t n) {
        if (self->closed_) return;
        if (ec) {
          // The local side is done (it closes its end once it has said all).
          // No close_notify: asio's ssl::stream cannot shut down while a read
          // is pending, and nothing the API sends relies on it.
          self->close_all();
          return;
        }
        asio::async_write(*self->stream_, asio::buffer(self->from_local_.data(), n),
                          [self](beast::error_code write_ec, size_t) {
                            if (self->closed_) return;
                            if (write_ec) {
                              self->tls_error_ = write_ec;
                              self->close_all();
                              return;
                            }
                            self->read_local();
                          });
      });
}

void TlsPump::close_all() {
  if (closed_) return;
  closed_ = true;
  beast::error_code ignored;
  stream_->lowest_layer().shutdown(Tcp::socket::shutdown_both, ignored);
  stream_->lowest_layer().close(ignored);
  local_.close(ignored);
}

Local::socket pump_through_socketpair(asio::io_context& io, std::shared_ptr<ssl::context> context,
                                      std::unique_ptr<TlsStream> stream,
                                      std::shared_ptr<TlsPump>* pump) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds) != 0)
    throw_errno("socketpair for a TLS connection");
  UniqueFd near(fds[0]), far(fds[1]);
  Local::socket pumped(io), returned(io);
  pumped.assign(Local(), near.get());
  near.release();
  returned.assign(Local(), far.get());
  far.release();
  auto started =
      std::make_shared<TlsPump>(std::move(context), std::move(stream), std::move(pumped));
  started->start();
  if (pump) *pump = started;
  return returned;
}

}  // namespace openshell::net::detail
