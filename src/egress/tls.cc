// EC_KEY (new_p256_key) is deprecated in OpenSSL 3.0, not removed.
#define OPENSSL_SUPPRESS_DEPRECATED
#include "egress/tls.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <mutex>
#include <string>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/crypto.h>
#include <openssl/ec.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "base/ca_bundles.h"
#include "base/error.h"
#include "base/x509_build.h"

namespace openshell::egress::tls {

namespace {

using x509::add_extension;
using x509::add_name_entry;
using x509::fail;

constexpr long kHour = 60 * 60;
constexpr long kCaDays = 30;

// ALPN's wire form: one length byte, then the protocol's name.
constexpr unsigned char kHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};

// Made as an EC_KEY, OpenSSL's older interface, on purpose: a key from a
// provider (EVP_PKEY_Q_keygen) is encoded into a certificate through
// OpenSSL 3.0's encoders, which search every provider each time. Measured
// here: a provider key's X509_set_pubkey 168 us, PEM 65 us; this one's 5
// and 8 (the key itself 29 and 20). Every launch's CA and every leaf
// pays it.
std::unique_ptr<EVP_PKEY, PkeyFree> new_p256_key() {
  std::unique_ptr<EC_KEY, decltype(&EC_KEY_free)> ec(EC_KEY_new_by_curve_name(NID_X9_62_prime256v1),
                                                     EC_KEY_free);
  std::unique_ptr<EVP_PKEY, PkeyFree> key(EVP_PKEY_new());
  if (!ec || !key || EC_KEY_generate_key(ec.get()) != 1 ||
      EVP_PKEY_assign_EC_KEY(key.get(), ec.get()) != 1)
    fail("generate an ECDSA P-256 key");
  ec.release();  // the EVP_PKEY owns it now
  return key;
}

// A version 3 certificate for key with a random positive serial of 159 bits
// (RFC 5280 allows at most 20 bytes), valid from an hour ago: a client
// whose clock is a little behind accepts it too.
std::unique_ptr<X509, X509Free> new_cert(EVP_PKEY* key) {
  std::unique_ptr<X509, X509Free> cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) fail("make a certificate");
  std::unique_ptr<BIGNUM, decltype(&BN_free)> serial(BN_new(), BN_free);
  if (!serial || BN_rand(serial.get(), 159, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())))
    fail("make a serial number");
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), -kHour)) fail("set the validity");
  if (X509_set_pubkey(cert.get(), key) != 1) fail("set the public key");
  return cert;
}

// A host name as a client may send it in SNI: labels of letters, digits,
// '-' and '_', 1 to 63 each, 253 in all.
bool is_host_name(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  size_t label = 0;
  for (char c : name) {
    if (c == '.') {
      if (label == 0) return false;
      label = 0;
      continue;
    }
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') return false;
    if (++label > 63) return false;
  }
  return label > 0 && name.front() != '-';
}

bool is_address(const std::string& host) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

std::string without_brackets(const std::string& host) {
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    return host.substr(1, host.size() - 2);
  return host;
}

// Only HTTP/1.1 is spoken behind the proxy: a client offering it gets it,
// one offering only h2 (or anything else) gets no ALPN at all and speaks
// HTTP/1.1 by default.
int select_http11(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in,
                  unsigned int inlen, void*) {
  unsigned char* chosen = nullptr;
  if (SSL_select_next_proto(&chosen, outlen, kHttp11, sizeof kHttp11, in, inlen) !=
      OPENSSL_NPN_NEGOTIATED)
    return SSL_TLSEXT_ERR_NOACK;
  *out = chosen;
  return SSL_TLSEXT_ERR_OK;
}

std::string name_text(const X509_NAME* name) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || X509_NAME_print_ex(bio.get(), name, 0, XN_FLAG_RFC2253) < 0) return "?";
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

// The certificate a failed verification stopped at, kept on the SSL for
// verify_failure: once a handshake has failed, OpenSSL keeps no peer
// certificate to look at.
struct FailedCert {
  std::string subject, issuer;
};

void free_failed_cert(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<FailedCert*>(ptr);
}

int failed_cert_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_failed_cert);
  return index;
}

int remember_failure(int ok, X509_STORE_CTX* store) {
  if (ok) return ok;
  auto* ssl =
      static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  X509* cert = X509_STORE_CTX_get_current_cert(store);
  if (ssl && cert && !SSL_get_ex_data(ssl, failed_cert_index()))
    SSL_set_ex_data(ssl, failed_cert_index(),
                    new FailedCert{name_text(X509_get_subject_name(cert)),
                                   name_text(X509_get_issuer_name(cert))});
  return ok;
}

// Resumption of the proxy's own sessions upstream: the last session each
// host:port gave, offered to the next connection there, which then skips
// the certificate chain's verification and the server's signature. The
// cache hangs on the client context (one per extra CA file, so a session
// is only ever resumed under the trust that verified it); each SSL carries
// the host:port its new sessions are for.
class ResumeCache {
 public:
  ~ResumeCache() {
    for (auto& [key, session] : sessions_) SSL_SESSION_free(session);
  }
  void put(const std::string& key, SSL_SESSION* session) {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(key);
    if (it != sessions_.end()) {
      SSL_SESSION_free(it->second);
      it->second = session;
      return;
    }
    if (sessions_.size() >= kMaxLeaves) {
      SSL_SESSION_free(sessions_.begin()->second);
      sessions_.erase(sessions_.begin());
    }
    sessions_.emplace(key, session);
  }
  // The session for `key` (a reference the caller owns), or null. It stays
  // until a newer one replaces it: several connections may offer it at
  // once, and a server that takes a ticket once only answers the others
  // with a full handshake.
  SSL_SESSION* get(const std::string& key) {
    std::lock_guard lock(mutex_);
    auto it = sessions_.find(key);
    if (it == sessions_.end()) return nullptr;
    // A copy: OpenSSL marks a session that an SSL freed without a clean
    // shutdown used as not resumable, and the proxy closes connections
    // upstream without one.
    return SSL_SESSION_dup(it->second);
  }

 private:
  std::mutex mutex_;
  std::map<std::string, SSL_SESSION*> sessions_;
};

void free_resume_cache(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<ResumeCache*>(ptr);
}
void free_resume_key(void*, void* ptr, CRYPTO_EX_DATA*, int, long, void*) {
  delete static_cast<std::string*>(ptr);
}
int resume_cache_index() {
  static const int index =
      SSL_CTX_get_ex_new_index(0, nullptr, nullptr, nullptr, free_resume_cache);
  return index;
}
int resume_key_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, free_resume_key);
  return index;
}

// A new session from a server: kept for the next connection to it.
int keep_session(SSL* ssl, SSL_SESSION* session) {
  auto* cache =
      static_cast<ResumeCache*>(SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), resume_cache_index()));
  const auto* key = static_cast<const std::string*>(SSL_get_ex_data(ssl, resume_key_index()));
  if (!cache || !key || SSL_get_verify_result(ssl) != X509_V_OK) return 0;
  // A copy of its own (see get()); the SSL keeps the one it made.
  if (SSL_SESSION* copy = SSL_SESSION_dup(session)) cache->put(*key, copy);
  return 0;
}

}  // namespace

SandboxCa::SandboxCa(const std::string& sandbox)
    : key_(new_p256_key()), cert_(new_cert(key_.get())) {
  X509* cert = cert_.get();
  if (!X509_gmtime_adj(X509_getm_notAfter(cert), kCaDays * 24 * kHour)) fail("set the validity");
  X509_NAME* name = X509_get_subject_name(cert);
  add_name_entry(name, "O", "openshell");
  // A CN holds at most 64 characters.
  add_name_entry(name, "CN", ("openshell sandbox " + sandbox).substr(0, 64));
  if (X509_set_issuer_name(cert, name) != 1) fail("set the issuer");
  add_extension(cert, cert, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
  add_extension(cert, cert, NID_key_usage, "critical,keyCertSign,cRLSign");
  add_extension(cert, cert, NID_subject_key_identifier, "hash");
  if (X509_sign(cert, key_.get(), EVP_sha256()) <= 0) fail("sign the sandbox's CA certificate");
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) fail("write the CA certificate");
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  cert_pem_.assign(data, static_cast<size_t>(n));
}

std::shared_ptr<SSL_CTX> SandboxCa::leaf_for(const std::string& requested) {
  std::string name = without_brackets(requested);
  const bool ip = is_address(name);
  if (!ip) {
    if (!name.empty() && name.back() == '.') name.pop_back();  // the root's dot
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    if (!is_host_name(name))
      throw Error("a certificate for '" + requested + "': neither a host name nor an address");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = by_name_.find(name); it != by_name_.end()) {
      leaves_.splice(leaves_.begin(), leaves_, it->second);
      return it->second->second;
    }
  }
  // Minted outside the lock: two threads asking for one new name make two,
  // and the second one kept replaces nothing the first one handed out.
  std::shared_ptr<SSL_CTX> ctx = mint(name, ip);
  std::lock_guard<std::mutex> lock(mutex_);
  if (auto it = by_name_.find(name); it != by_name_.end()) return it->second->second;
  leaves_.emplace_front(name, ctx);
  by_name_[name] = leaves_.begin();
  if (leaves_.size() > kMaxLeaves) {
    by_name_.erase(leaves_.back().first);
    leaves_.pop_back();
  }
  return ctx;
}

size_t SandboxCa::cached_leaves() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return leaves_.size();
}

SandboxCa::SandboxCa(std::string cert_pem, std::string key_pem)
    : cert_pem_(std::move(cert_pem)), key_pem_(std::move(key_pem)) {
  if (cert_pem_.empty() || key_pem_.empty())
    throw Error("a sandbox CA without its certificate or key");
}

void SandboxCa::parse() const {
  std::call_once(parsed_, [this] {
    if (key_) return;  // made here
    std::unique_ptr<BIO, decltype(&BIO_free)> cert_bio(
        BIO_new_mem_buf(cert_pem_.data(), static_cast<int>(cert_pem_.size())), BIO_free);
    std::unique_ptr<BIO, decltype(&BIO_free)> key_bio(
        BIO_new_mem_buf(key_pem_.data(), static_cast<int>(key_pem_.size())), BIO_free);
    if (!cert_bio || !key_bio) fail("read the sandbox's CA");
    cert_.reset(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
    key_.reset(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
    if (!cert_ || !key_) fail("read the sandbox's CA certificate and key");
    if (X509_check_private_key(cert_.get(), key_.get()) != 1)
      fail("the sandbox's CA key does not match its certificate");
    OPENSSL_cleanse(key_pem_.data(), key_pem_.size());  // the key lives on in key_ alone
    key_pem_.clear();
  });
}

X509* SandboxCa::cert() const {
  parse();
  return cert_.get();
}

std::string SandboxCa::key_pem() const {
  parse();
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(BIO_new(BIO_s_mem()), BIO_free);
  if (!bio ||
      PEM_write_bio_PrivateKey(bio.get(), key_.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail("write the sandbox's CA key");
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::shared_ptr<SSL_CTX> SandboxCa::mint(const std::string& name, bool ip) {
  parse();
  auto key = new_p256_key();
  auto leaf = new_cert(key.get());
  X509* cert = leaf.get();
  if (X509_set1_notAfter(cert, X509_get0_notAfter(cert_.get())) != 1) fail("set the validity");
  X509_NAME* subject = X509_get_subject_name(cert);
  add_name_entry(subject, "O", "openshell");
  if (name.size() <= 64) add_name_entry(subject, "CN", name);
  if (X509_set_issuer_name(cert, X509_get_subject_name(cert_.get())) != 1) fail("set the issuer");
  add_extension(cert, cert_.get(), NID_basic_constraints, "critical,CA:FALSE");
  add_extension(cert, cert_.get(), NID_key_usage, "critical,digitalSignature");
  add_extension(cert, cert_.get(), NID_ext_key_usage, "serverAuth");
  add_extension(cert, cert_.get(), NID_subject_alt_name, (ip ? "IP:" : "DNS:") + name);
  add_extension(cert, cert_.get(), NID_authority_key_identifier, "keyid:always");
  if (X509_sign(cert, key_.get(), EVP_sha256()) <= 0) fail("sign a certificate for " + name);

  std::shared_ptr<SSL_CTX> ctx(SSL_CTX_new(TLS_server_method()), SSL_CTX_free);
  if (!ctx) fail("make a TLS context");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_RENEGOTIATION);
  if (SSL_CTX_use_certificate(ctx.get(), cert) != 1 ||
      SSL_CTX_use_PrivateKey(ctx.get(), key.get()) != 1)
    fail("use the certificate for " + name);
  SSL_CTX_set_alpn_select_cb(ctx.get(), select_http11, nullptr);
  return ctx;
}

std::unique_ptr<SSL_CTX, SslCtxFree> upstream_context(const std::string& extra_ca_file) {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) fail("make a TLS context");
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  SSL_CTX_set_default_verify_paths(ctx.get());
  if (const std::string bundle = ca_bundles::host_path(); !bundle.empty())
    SSL_CTX_load_verify_locations(ctx.get(), bundle.c_str(), nullptr);
  ERR_clear_error();  // a default that is missing is no error
  if (!extra_ca_file.empty() &&
      SSL_CTX_load_verify_locations(ctx.get(), extra_ca_file.c_str(), nullptr) != 1)
    fail("ca_file " + extra_ca_file + ": no PEM certificate read");
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, remember_failure);
  if (SSL_CTX_set_alpn_protos(ctx.get(), kHttp11, sizeof kHttp11) != 0) fail("offer ALPN http/1.1");
  auto cache = std::make_unique<ResumeCache>();
  if (SSL_CTX_set_ex_data(ctx.get(), resume_cache_index(), cache.get()) != 1)
    fail("make a TLS session cache");
  cache.release();  // the context's now
  SSL_CTX_set_session_cache_mode(ctx.get(),
                                 SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  SSL_CTX_sess_set_new_cb(ctx.get(), keep_session);
  return ctx;
}

void prepare_upstream(SSL* ssl, const std::string& host, uint16_t port) {
  const std::string name = without_brackets(host);
  if (port != 0) {
    auto key = std::make_unique<std::string>(name + ":" + std::to_string(port));
    if (auto* cache = static_cast<ResumeCache*>(
            SSL_CTX_get_ex_data(SSL_get_SSL_CTX(ssl), resume_cache_index()))) {
      if (SSL_SESSION* session = cache->get(*key)) {
        SSL_set_session(ssl, session);  // takes a reference of its own
        SSL_SESSION_free(session);
      }
    }
    if (SSL_set_ex_data(ssl, resume_key_index(), key.get()) == 1) key.release();
  }
  if (is_address(name)) {
    // No SNI for an address (RFC 6066); the certificate must name it.
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) != 1)
      fail("check the certificate for " + name);
    return;
  }
  SSL_set_hostflags(ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
  if (SSL_set_tlsext_host_name(ssl, name.c_str()) != 1 || SSL_set1_host(ssl, name.c_str()) != 1)
    fail("check the certificate for " + name);
}

std::string verify_failure(const SSL* ssl, const std::string& host) {
  const long result = SSL_get_verify_result(ssl);
  if (result == X509_V_OK) return "";
  const std::string of = "the server's certificate for " + host;
  const auto* failed = static_cast<const FailedCert*>(SSL_get_ex_data(ssl, failed_cert_index()));
  switch (result) {
    case X509_V_ERR_HOSTNAME_MISMATCH:
    case X509_V_ERR_IP_ADDRESS_MISMATCH:
      return "the server's certificate is not for " + host +
             (failed ? " (it is " + failed->subject + ")" : "");
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
    case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
    case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
    case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      return of + " is signed by a CA this host does not trust" +
             (failed ? " (issuer " + failed->issuer + ")" : "") +
             "; an endpoint's ca_file may name it";
    case X509_V_ERR_CERT_HAS_EXPIRED:
      return of + " has expired";
    case X509_V_ERR_CERT_NOT_YET_VALID:
      return of + " is not valid yet";
    default:
      return of + " did not verify: " + X509_verify_cert_error_string(result);
  }
}

}  // namespace openshell::egress::tls
