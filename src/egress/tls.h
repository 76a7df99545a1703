// TLS for inspected egress (OpenSSL 3): the sandbox's own CA, which the
// sandbox trusts; the leaf certificates it issues, one per name the
// sandbox's clients ask for (their SNI), as ready server contexts; and the
// client context of the proxy's own connections upstream, which trust what
// the host trusts.
//
// The CA is made afresh at every start of a sandbox and its key lives in
// the supervisor's memory only: nothing the sandbox can read holds it, and
// a certificate it signed is worth nothing once the sandbox has stopped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include <openssl/ssl.h>
#include <openssl/x509.h>

namespace openshell::egress::tls {

struct SslCtxFree {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
struct X509Free {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};

// The most leaf contexts a CA keeps; the least recently used goes first.
inline constexpr size_t kMaxLeaves = 256;

class SandboxCa {
 public:
  // A new CA: an ECDSA P-256 key, and a self-signed certificate whose CN is
  // "openshell sandbox <sandbox>" (O=openshell), CA:TRUE with pathlen 0,
  // keyCertSign and cRLSign, a random serial, valid from an hour ago for 30
  // days. Throws Error.
  explicit SandboxCa(const std::string& sandbox);
  // A CA made elsewhere (the gateway makes each sandbox's: its OpenSSL is
  // warm, and a supervisor's first key and signature cost milliseconds of
  // OpenSSL's start), from its certificate and key, PEM. They are parsed
  // when first needed (the first leaf), so a start pays nothing for them.
  SandboxCa(std::string cert_pem, std::string key_pem);
  SandboxCa(const SandboxCa&) = delete;
  SandboxCa& operator=(const SandboxCa&) = delete;

  // The certificate, PEM: what goes into the sandbox's CA bundle.
  const std::string& cert_pem() const { return cert_pem_; }
  // The private key, PEM (unencrypted): for the one who hands it over.
  std::string key_pem() const;
  X509* cert() const;

  // A server context for `name` (an SNI host name, or an IP address
  // literal, IPv6 with or without brackets): its leaf certificate (ECDSA
  // P-256, serverAuth, the name as a DNS or IP subjectAltName) signed by
  // this CA, TLS 1.2 and later, and ALPN that selects "http/1.1" and
  // nothing else (a client offering only h2 gets no protocol, that is
  // HTTP/1.1). The same context for the same name while it is cached.
  // Throws Error naming the name when it is neither a host name nor an
  // address. Safe from several threads.
  std::shared_ptr<SSL_CTX> leaf_for(const std::string& name);
  size_t cached_leaves() const;

 private:
  std::shared_ptr<SSL_CTX> mint(const std::string& name, bool ip);
  void parse() const;  // key_pem_ and cert_pem_ into key_ and cert_, once

  mutable std::once_flag parsed_;
  mutable std::unique_ptr<EVP_PKEY, PkeyFree> key_;
  mutable std::unique_ptr<X509, X509Free> cert_;
  std::string cert_pem_;
  mutable std::string key_pem_;  // until parsed, for a CA from PEM
  mutable std::mutex mutex_;
  // Most recently used first.
  std::list<std::pair<std::string, std::shared_ptr<SSL_CTX>>> leaves_;
  std::unordered_map<std::string, decltype(leaves_)::iterator> by_name_;
};

// The client context of connections upstream: TLS 1.2 and later, the peer
// verified against the host's CA store (its distribution's bundle, and
// SSL_CERT_FILE / SSL_CERT_DIR as OpenSSL reads them) and, when given,
// extra_ca_file's certificates too (an endpoint's ca_file, for a private
// server); ALPN offers "http/1.1" only. Throws Error naming the file when it
// holds no certificate.
std::unique_ptr<SSL_CTX, SslCtxFree> upstream_context(const std::string& extra_ca_file = "");

// Readies a connection of upstream_context() for `host` (a name or an
// address literal): SNI for a name, and the certificate checked for that
// name or address (a wildcard only as a whole label). With a port, the last
// session that host:port gave this context (after a verified handshake) is
// offered for resumption, and the session this connection gets is kept
// for the next (256 host:ports at most). Throws Error.
void prepare_upstream(SSL* ssl, const std::string& host, uint16_t port = 0);

// Why the peer's certificate did not verify, in one line ("the server's
// certificate is not for api.example.com", "... is signed by an unknown
// CA (CN=...)"); "" when it verified.
std::string verify_failure(const SSL* ssl, const std::string& host);

}  // namespace openshell::egress::tls
