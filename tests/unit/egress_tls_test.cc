#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include "base/files.h"
#include "base/unique_fd.h"
#include "egress/tls.h"
#include "test_util.h"

namespace openshell::egress::tls {
namespace {

using openshell::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

using Cert = std::unique_ptr<X509, X509Free>;
struct SslFree {
  void operator()(SSL* ssl) const { SSL_free(ssl); }
};
using Ssl = std::unique_ptr<SSL, SslFree>;

Cert parse(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  return Cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
}

std::string subject_of(X509* cert) {
  char text[256];
  X509_NAME_oneline(X509_get_subject_name(cert), text, sizeof text);
  return text;
}

// X509_V_OK when `leaf` chains to `ca` and names `host` (a name or, with
// ip, an address).
long verify(X509* leaf, X509* ca, const std::string& host, bool ip = false) {
  std::unique_ptr<X509_STORE, decltype(&X509_STORE_free)> store(X509_STORE_new(), X509_STORE_free);
  X509_STORE_add_cert(store.get(), ca);
  std::unique_ptr<X509_STORE_CTX, decltype(&X509_STORE_CTX_free)> ctx(X509_STORE_CTX_new(),
                                                                      X509_STORE_CTX_free);
  X509_STORE_CTX_init(ctx.get(), store.get(), leaf, nullptr);
  X509_VERIFY_PARAM* param = X509_STORE_CTX_get0_param(ctx.get());
  X509_VERIFY_PARAM_set_purpose(param, X509_PURPOSE_SSL_SERVER);
  if (ip)
    X509_VERIFY_PARAM_set1_ip_asc(param, host.c_str());
  else
    X509_VERIFY_PARAM_set1_host(param, host.c_str(), 0);
  X509_verify_cert(ctx.get());
  return X509_STORE_CTX_get_error(ctx.get());
}

// Both ends of a TLS connection over a socketpair, driven in turn until
// both are done or one fails; true when the handshake completed.
bool handshake(SSL* client, SSL* server) {
  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) return false;
  UniqueFd a(fds[0]), b(fds[1]);
  SSL_set_fd(client, a.get());
  SSL_set_fd(server, b.get());
  bool client_done = false, server_done = false;
  for (int round = 0; round < 100 && !(client_done && server_done); ++round) {
    if (!client_done) {
      const int r = SSL_connect(client);
      if (r == 1)
        client_done = true;
      else if (SSL_get_error(client, r) != SSL_ERROR_WANT_READ)
        break;
    }
    if (!server_done) {
      const int r = SSL_accept(server);
      if (r == 1)
        server_done = true;
      else if (SSL_get_error(server, r) != SSL_ERROR_WANT_READ)
        break;
    }
  }
  ERR_clear_error();
  // The fds go with this scope: each side has done all it will.
  return client_done && server_done;
}

std::string alpn_of(SSL* ssl) {
  const unsigned char* data = nullptr;
  unsigned int len = 0;
  SSL_get0_alpn_selected(ssl, &data, &len);
  return std::string(reinterpret_cast<const char*>(data), len);
}

// A client that trusts only `ca`.
std::unique_ptr<SSL_CTX, SslCtxFree> client_trusting(X509* ca) {
  std::unique_ptr<SSL_CTX, SslCtxFree> ctx(SSL_CTX_new(TLS_client_method()));
  X509_STORE_add_cert(SSL_CTX_get_cert_store(ctx.get()), ca);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  return ctx;
}

TEST(EgressTls, TheCaIsACaThatNamesItsSandbox) {
  const auto start = std::chrono::steady_clock::now();
  SandboxCa ca("build-42");
  std::printf(
      "SandboxCa: made in %.1f us\n",
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  Cert cert = parse(ca.cert_pem());
  ASSERT_TRUE(cert);
  EXPECT_EQ(subject_of(cert.get()), "/O=openshell/CN=openshell sandbox build-42");
  EXPECT_EQ(X509_check_ca(cert.get()), 1);
  EXPECT_EQ(X509_get_pathlen(cert.get()), 0);
  EXPECT_EQ(X509_get_key_usage(cert.get()), static_cast<uint32_t>(KU_KEY_CERT_SIGN | KU_CRL_SIGN));
  EXPECT_EQ(X509_check_issued(cert.get(), cert.get()), X509_V_OK);  // self-signed
  EVP_PKEY* key = X509_get0_pubkey(cert.get());
  char group[64] = "";
  EVP_PKEY_get_group_name(key, group, sizeof group, nullptr);
  EXPECT_STREQ(group, "prime256v1");
  // Short-lived: valid now, not in 31 days.
  time_t now = std::time(nullptr), later = now + 31 * 86400;
  EXPECT_LT(X509_cmp_time(X509_get0_notBefore(cert.get()), &now), 0);
  EXPECT_GT(X509_cmp_time(X509_get0_notAfter(cert.get()), &now), 0);
  EXPECT_LT(X509_cmp_time(X509_get0_notAfter(cert.get()), &later), 0);
  // The PEM is the certificate alone: its key never leaves the process.
  EXPECT_THAT(ca.cert_pem(), Not(HasSubstr("PRIVATE KEY")));
  // Each CA is a new one.
  SandboxCa other("build-42");
  EXPECT_NE(other.cert_pem(), ca.cert_pem());
}

TEST(EgressTls, ALeafChainsToTheCaForItsNameAndNoOther) {
  SandboxCa ca("s");
  auto ctx = ca.leaf_for("API.Example.com.");
  X509* leaf = SSL_CTX_get0_certificate(ctx.get());
  ASSERT_NE(leaf, nullptr);
  EXPECT_EQ(verify(leaf, ca.cert(), "api.example.com"), X509_V_OK);
  EXPECT_EQ(verify(leaf, ca.cert(), "evil.example.com"), X509_V_ERR_HOSTNAME_MISMATCH);
  EXPECT_EQ(X509_check_ca(leaf), 0);
  // Another CA does not vouch for it.
  SandboxCa stranger("s");
  EXPECT_EQ(verify(leaf, stranger.cert(), "api.example.com"),
            X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY);

  // An address gets an IP subjectAltName.
  auto v4 = ca.leaf_for("192.0.2.7");
  EXPECT_EQ(verify(SSL_CTX_get0_certificate(v4.get()), ca.cert(), "192.0.2.7", true), X509_V_OK);
  EXPECT_EQ(verify(SSL_CTX_get0_certificate(v4.get()), ca.cert(), "192.0.2.8", true),
            X509_V_ERR_IP_ADDRESS_MISMATCH);
  auto v6 = ca.leaf_for("[2001:db8::1]");
  EXPECT_EQ(verify(SSL_CTX_get0_certificate(v6.get()), ca.cert(), "2001:db8::1", true), X509_V_OK);

  EXPECT_THAT(openshell::testing::error_of([&] { ca.leaf_for("a b"); }),
              HasSubstr("'a b': neither a host name nor an address"));
  EXPECT_THAT(openshell::testing::error_of([&] { ca.leaf_for(""); }),
              HasSubstr("neither a host name nor an address"));
}

// The gateway makes a sandbox's CA and hands its PEM over: the supervisor's
// copy signs leaves that chain to the same certificate.
TEST(EgressTls, ACaFromItsPemSignsAsTheOriginal) {
  SandboxCa made("s");
  SandboxCa taken(made.cert_pem(), made.key_pem());
  EXPECT_EQ(taken.cert_pem(), made.cert_pem());
  auto ctx = taken.leaf_for("api.example.com");
  X509* leaf = SSL_CTX_get0_certificate(ctx.get());
  ASSERT_NE(leaf, nullptr);
  EXPECT_EQ(verify(leaf, made.cert(), "api.example.com"), X509_V_OK);
  EXPECT_EQ(X509_cmp(taken.cert(), made.cert()), 0);

  // A key that is not the certificate's is refused at the first leaf.
  SandboxCa other("s");
  SandboxCa mismatched(made.cert_pem(), other.key_pem());
  EXPECT_THAT(openshell::testing::error_of([&] { mismatched.leaf_for("api.example.com"); }),
              HasSubstr("the sandbox's CA key does not match its certificate"));
  EXPECT_THAT(openshell::testing::error_of([&] { SandboxCa("", "KEY"); }),
              HasSubstr("without its certificate or key"));
  SandboxCa garbage("not a certificate", "not a key");
  EXPECT_THAT(openshell::testing::error_of([&] { garbage.leaf_for("a.example"); }),
              HasSubstr("read the sandbox's CA"));
}

TEST(EgressTls, TheCacheKeepsTheRecentlyUsedNames) {
  SandboxCa ca("s");
  auto t0 = std::chrono::steady_clock::now();
  auto first = ca.leaf_for("one.example");
  auto t1 = std::chrono::steady_clock::now();
  auto again = ca.leaf_for("ONE.example");
  auto t2 = std::chrono::steady_clock::now();
  EXPECT_EQ(first.get(), again.get());
  std::printf("leaf_for: minted in %.1f us, cached lookup in %.2f us\n",
              std::chrono::duration<double, std::micro>(t1 - t0).count(),
              std::chrono::duration<double, std::micro>(t2 - t1).count());

  // 256 names at most: the least recently used goes.
  auto kept = ca.leaf_for("kept.example");
  for (size_t i = 0; i < kMaxLeaves; ++i) {
    ca.leaf_for(std::to_string(i) + ".n.example");
    if (i == kMaxLeaves / 2) ca.leaf_for("kept.example");  // used again: stays
  }
  EXPECT_EQ(ca.cached_leaves(), kMaxLeaves);
  EXPECT_EQ(ca.leaf_for("kept.example").get(), kept.get());
  EXPECT_NE(ca.leaf_for("one.example").get(), first.get());  // it was minted again
}

TEST(EgressTls, AClientTrustingTheCaCompletesAHandshakeAndGetsHttp11Only) {
  SandboxCa ca("s");
  auto server_ctx = ca.leaf_for("api.example.com");
  auto client_ctx = client_trusting(ca.cert());
  struct Case {
    std::string offered;  // ALPN wire form
    std::string selected;
  };
  for (const Case& c : {Case{std::string("\x02h2\x08http/1.1", 12), "http/1.1"},
                        Case{std::string("\x02h2", 3), ""}, Case{"", ""}}) {
    Ssl client(SSL_new(client_ctx.get())), server(SSL_new(server_ctx.get()));
    SSL_set_tlsext_host_name(client.get(), "api.example.com");
    SSL_set1_host(client.get(), "api.example.com");
    if (!c.offered.empty())
      SSL_set_alpn_protos(client.get(), reinterpret_cast<const unsigned char*>(c.offered.data()),
                          static_cast<unsigned>(c.offered.size()));
    ASSERT_TRUE(handshake(client.get(), server.get())) << c.selected;
    EXPECT_EQ(SSL_get_verify_result(client.get()), X509_V_OK);
    EXPECT_EQ(alpn_of(client.get()), c.selected);
    EXPECT_EQ(alpn_of(server.get()), c.selected);
    EXPECT_GE(SSL_version(client.get()), TLS1_2_VERSION);
  }

  // A client that wants another name refuses the leaf.
  Ssl client(SSL_new(client_ctx.get())), server(SSL_new(server_ctx.get()));
  SSL_set1_host(client.get(), "other.example.com");
  EXPECT_FALSE(handshake(client.get(), server.get()));
}

TEST(EgressTls, UpstreamRefusesAnUnknownCaAndAWrongName) {
  // A CA of the test's own, as a private server's would be.
  SandboxCa test_ca("upstream-test");
  TempDir dir;
  const std::string ca_file = dir.path() + "/ca.pem";
  files::write_atomically(ca_file, test_ca.cert_pem(), 0644);

  auto try_upstream = [&](SSL_CTX* ctx, const std::string& host, std::string* why) {
    // The server presents upstream.test's certificate, or 127.0.0.1's to
    // a client that sends no name.
    auto server_ctx = test_ca.leaf_for(host == "127.0.0.2"    ? "127.0.0.1"
                                       : host == "other.test" ? "upstream.test"
                                                              : host);
    Ssl client(SSL_new(ctx)), server(SSL_new(server_ctx.get()));
    prepare_upstream(client.get(), host);
    const bool ok = handshake(client.get(), server.get());
    *why = verify_failure(client.get(), host);
    return ok;
  };
  std::string why;
  auto with_ca = upstream_context(ca_file);
  EXPECT_TRUE(try_upstream(with_ca.get(), "upstream.test", &why)) << why;
  EXPECT_EQ(why, "");
  EXPECT_TRUE(try_upstream(with_ca.get(), "127.0.0.1", &why)) << why;
  EXPECT_FALSE(try_upstream(with_ca.get(), "other.test", &why));
  EXPECT_EQ(why,
            "the server's certificate is not for other.test (it is CN=upstream.test,O=openshell)");
  EXPECT_FALSE(try_upstream(with_ca.get(), "127.0.0.2", &why));
  EXPECT_THAT(why, HasSubstr("the server's certificate is not for 127.0.0.2"));

  // The host's store alone does not know the test CA.
  auto host_only = upstream_context();
  EXPECT_FALSE(try_upstream(host_only.get(), "upstream.test", &why));
  EXPECT_EQ(why,
            "the server's certificate for upstream.test is signed by a CA this host does not "
            "trust (issuer CN=openshell sandbox upstream-test,O=openshell); an endpoint's ca_file "
            "may name it");

  EXPECT_THAT(openshell::testing::error_of([&] { upstream_context(dir.path() + "/none.pem"); }),
              HasSubstr("ca_file " + dir.path() + "/none.pem: no PEM certificate read"));
}

TEST(EgressTls, UpstreamOffersHttp11) {
  SandboxCa ca("s");
  auto server_ctx = ca.leaf_for("127.0.0.1");
  TempDir dir;
  const std::string ca_file = dir.path() + "/ca.pem";
  files::write_atomically(ca_file, ca.cert_pem(), 0644);
  auto client_ctx = upstream_context(ca_file);
  Ssl client(SSL_new(client_ctx.get())), server(SSL_new(server_ctx.get()));
  prepare_upstream(client.get(), "127.0.0.1");
  ASSERT_TRUE(handshake(client.get(), server.get())) << verify_failure(client.get(), "127.0.0.1");
  EXPECT_EQ(alpn_of(server.get()), "http/1.1");
}

// The proxy's connections upstream resume the last session of the same
// host and port (the chain's verification and the server's signature are
// then skipped), and never another host:port's.
TEST(EgressTls, UpstreamResumesTheLastSessionOfTheSameHostAndPort) {
  SandboxCa ca("s");
  auto server_ctx = ca.leaf_for("upstream.test");
  TempDir dir;
  const std::string ca_file = dir.path() + "/ca.pem";
  files::write_atomically(ca_file, ca.cert_pem(), 0644);
  auto client_ctx = upstream_context(ca_file);
  // One connection, a byte from the server (with which a TLS 1.3 client
  // reads the session tickets the server sent); whether it was resumed.
  auto connect = [&](uint16_t port) {
    Ssl client(SSL_new(client_ctx.get())), server(SSL_new(server_ctx.get()));
    prepare_upstream(client.get(), "upstream.test", port);
    int fds[2];
    EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
    UniqueFd a(fds[0]), b(fds[1]);
    SSL_set_fd(client.get(), a.get());
    SSL_set_fd(server.get(), b.get());
    std::thread accept([&] { EXPECT_EQ(SSL_accept(server.get()), 1); });
    EXPECT_EQ(SSL_connect(client.get()), 1) << verify_failure(client.get(), "upstream.test");
    accept.join();
    EXPECT_EQ(SSL_write(server.get(), "x", 1), 1);
    char byte = 0;
    EXPECT_EQ(SSL_read(client.get(), &byte, 1), 1);
    EXPECT_EQ(byte, 'x');
    return SSL_session_reused(client.get()) == 1;
  };
  EXPECT_FALSE(connect(443)) << "the first connection has nothing to resume";
  EXPECT_TRUE(connect(443)) << "the second resumes the first's session";
  EXPECT_TRUE(connect(443)) << "and the third the second's";
  EXPECT_FALSE(connect(8443)) << "another port of the same host resumes nothing";
}

}  // namespace
}  // namespace openshell::egress::tls
