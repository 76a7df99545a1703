#include "auth/certs.h"

#include <arpa/inet.h>
#include <sys/stat.h>

#include <cstdio>
#include <memory>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "../tls_certs.h"
#include "base/files.h"
#include "test_util.h"

namespace openshell::auth {
namespace {

using openshell::testing::error_of;
using openshell::testing::TempDir;
using ::testing::UnorderedElementsAre;

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using Cert = std::unique_ptr<X509, X509Free>;
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;

Cert load_cert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return nullptr;
  Cert c(PEM_read_X509(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return c;
}

Key load_key(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) return nullptr;
  Key k(PEM_read_PrivateKey(f, nullptr, nullptr, nullptr));
  std::fclose(f);
  return k;
}

std::string name_field(X509_NAME* name, int nid) {
  char buf[256] = "";
  if (X509_NAME_get_text_by_NID(name, nid, buf, sizeof buf) < 0) return "";
  return buf;
}

// The key's curve, "" when it is not an EC key.
std::string curve_of(EVP_PKEY* key) {
  if (EVP_PKEY_get_base_id(key) != EVP_PKEY_EC) return "";
  char group[64] = "";
  size_t len = 0;
  EVP_PKEY_get_utf8_string_param(key, OSSL_PKEY_PARAM_GROUP_NAME, group, sizeof group, &len);
  return group;
}

// The subjectAltName entries: "DNS:x", "IP:1.2.3.4", "IP:::1".
std::set<std::string> sans_of(X509* cert) {
  std::set<std::string> out;
  auto* names =
      static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  if (!names) return out;
  for (int i = 0; i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* n = sk_GENERAL_NAME_value(names, i);
    if (n->type == GEN_DNS) {
      out.insert("DNS:" +
                 std::string(reinterpret_cast<const char*>(ASN1_STRING_get0_data(n->d.dNSName)),
                             ASN1_STRING_length(n->d.dNSName)));
    } else if (n->type == GEN_IPADD) {
      char text[INET6_ADDRSTRLEN] = "";
      const int len = ASN1_STRING_length(n->d.iPAddress);
      ::inet_ntop(len == 4 ? AF_INET : AF_INET6, ASN1_STRING_get0_data(n->d.iPAddress), text,
                  sizeof text);
      out.insert(std::string("IP:") + text);
    }
  }
  GENERAL_NAMES_free(names);
  return out;
}

// Whether cert chains to the CA (and is valid now) for the given purpose.
bool verifies(X509* ca, X509* cert, int purpose) {
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, cert, nullptr);
  X509_STORE_CTX_set_purpose(ctx, purpose);
  const bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  return ok;
}

mode_t mode_of(const std::string& path) {
  struct stat st {};
  ::stat(path.c_str(), &st);
  return st.st_mode & 07777;
}

// Days from now to the certificate's end.
int days_left(X509* cert) {
  int days = 0, seconds = 0;
  ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert));
  return days;
}

class CertSet : public ::testing::Test {
 protected:
  CertSet() : dir(tmp.path() + "/tls") {}
  CertSetResult make(std::vector<std::string> sans = {}, bool force = false) {
    return generate_cert_set({dir, std::move(sans), force, "owner"});
  }
  TempDir tmp;
  std::string dir;
};

TEST_F(CertSet, EveryKeyIsP256AndPrivateInAPrivateDirectory) {
  EXPECT_TRUE(make().made);
  EXPECT_EQ(mode_of(dir), 0700u);
  for (const char* k : {"ca.key", "server.key", "client.key"}) {
    EXPECT_EQ(mode_of(dir + "/" + k), 0600u) << k;
    Key key = load_key(dir + "/" + k);
    ASSERT_TRUE(key) << k;
    EXPECT_EQ(curve_of(key.get()), "prime256v1") << k;
  }
  // Each certificate holds the public half of its key.
  for (const char* stem : {"ca", "server", "client"}) {
    Cert cert = load_cert(dir + "/" + std::string(stem) + ".crt");
    Key key = load_key(dir + "/" + std::string(stem) + ".key");
    ASSERT_TRUE(cert && key) << stem;
    EXPECT_EQ(X509_check_private_key(cert.get(), key.get()), 1) << stem;
  }
}

TEST_F(CertSet, SubjectsSansValidityAndChain) {
  make({"gw.example.org", "10.1.2.3", "fd00::7"});
  Cert ca = load_cert(dir + "/ca.crt"), server = load_cert(dir + "/server.crt"),
       client = load_cert(dir + "/client.crt");
  ASSERT_TRUE(ca && server && client);
  EXPECT_EQ(X509_check_ca(ca.get()), 1);
  EXPECT_EQ(X509_check_ca(server.get()), 0);
  EXPECT_EQ(name_field(X509_get_subject_name(ca.get()), NID_organizationName), "openshell");
  EXPECT_EQ(sans_of(server.get()),
            (std::set<std::string>{"DNS:localhost", "IP:127.0.0.1", "IP:::1", "DNS:gw.example.org",
                                   "IP:10.1.2.3", "IP:fd00::7"}));
  // The owner's certificate: CN = the owner, O = openshell, OU = admin.
  X509_NAME* subject = X509_get_subject_name(client.get());
  EXPECT_EQ(name_field(subject, NID_commonName), "owner");
  EXPECT_EQ(name_field(subject, NID_organizationName), "openshell");
  EXPECT_EQ(name_field(subject, NID_organizationalUnitName), "admin");
  // Valid from (a little before) now, for years; the CA longest.
  for (X509* c : {ca.get(), server.get(), client.get()})
    EXPECT_LT(X509_cmp_current_time(X509_get0_notBefore(c)), 0);
  EXPECT_GT(days_left(server.get()), 800);
  EXPECT_GT(days_left(ca.get()), days_left(server.get()));
  // Server for servers, client for clients: both chain to the CA, neither
  // serves as the other.
  EXPECT_TRUE(verifies(ca.get(), server.get(), X509_PURPOSE_SSL_SERVER));
  EXPECT_TRUE(verifies(ca.get(), client.get(), X509_PURPOSE_SSL_CLIENT));
  EXPECT_FALSE(verifies(ca.get(), client.get(), X509_PURPOSE_SSL_SERVER));
  EXPECT_FALSE(verifies(ca.get(), server.get(), X509_PURPOSE_SSL_CLIENT));
  // Not by another set's CA.
  TempDir other;
  generate_cert_set({other.path(), {}, false, "someone"});
  Cert other_ca = load_cert(other.path() + "/ca.crt");
  EXPECT_FALSE(verifies(other_ca.get(), client.get(), X509_PURPOSE_SSL_CLIENT));
}

TEST_F(CertSet, ACompleteSetIsLeftAloneAndAPartialOneRefused) {
  make();
  const std::string ca_before = files::read(dir + "/ca.crt");
  CertSetResult again = make();
  EXPECT_FALSE(again.made);
  EXPECT_EQ(again.found.size(), 6u);
  EXPECT_EQ(files::read(dir + "/ca.crt"), ca_before);
  ::unlink((dir + "/server.key").c_str());
  ::unlink((dir + "/client.crt").c_str());
  EXPECT_EQ(error_of([&] { make(); }),
            "the certificates in " + dir +
                " are incomplete (missing server.key, client.crt): --force makes a new set, "
                "which clients of the old CA no longer trust");
  EXPECT_FALSE(files::exists(dir + "/server.key"));
  EXPECT_TRUE(make({}, true).made);
  EXPECT_NE(files::read(dir + "/ca.crt"), ca_before);
  for (const auto& f : cert_set_files()) EXPECT_TRUE(files::exists(dir + "/" + f)) << f;
}

TEST_F(CertSet, BadNamesAreRefusedBeforeAnythingIsWritten) {
  EXPECT_EQ(error_of([&] { make({"bad name"}); }),
            "--server-san 'bad name': neither a DNS name nor an IP address");
  EXPECT_FALSE(files::exists(dir));
  EXPECT_EQ(error_of([&] { check_principal_name("../etc"); }),
            "principal name '../etc': starts with '.'");
  EXPECT_EQ(error_of([&] { check_principal_name("a b"); }),
            "principal name 'a b': only letters, digits, '.', '_', '-' and '@' are allowed");
  EXPECT_EQ(principal_of_uid(0), "root");
  EXPECT_EQ(principal_of_uid(4000000001u), "uid-4000000001");
}

TEST_F(CertSet, IssueClientSignsAPrincipalsCertificate) {
  make();
  const std::string out = tmp.path() + "/alice";
  issue_client_cert({dir, out, "alice", false, false});
  EXPECT_EQ(mode_of(out), 0700u);
  EXPECT_EQ(mode_of(out + "/client.key"), 0600u);
  EXPECT_EQ(files::read(out + "/ca.crt"), files::read(dir + "/ca.crt"));
  Cert ca = load_cert(dir + "/ca.crt"), alice = load_cert(out + "/client.crt");
  ASSERT_TRUE(alice);
  X509_NAME* subject = X509_get_subject_name(alice.get());
  EXPECT_EQ(name_field(subject, NID_commonName), "alice");
  EXPECT_EQ(name_field(subject, NID_organizationalUnitName), "");
  EXPECT_TRUE(verifies(ca.get(), alice.get(), X509_PURPOSE_SSL_CLIENT));
  Key key = load_key(out + "/client.key");
  EXPECT_EQ(curve_of(key.get()), "prime256v1");
  EXPECT_EQ(X509_check_private_key(alice.get(), key.get()), 1);
  // Once there, it is replaced only when asked.
  EXPECT_EQ(error_of([&] {
              issue_client_cert({dir, out, "alice", true, false});
            }),
            out + "/client.crt exists: --force replaces it");
  issue_client_cert({dir, out, "alice", true, true});
  alice = load_cert(out + "/client.crt");
  EXPECT_EQ(name_field(X509_get_subject_name(alice.get()), NID_organizationalUnitName), "admin");
  // Without a CA: say how to make one.
  EXPECT_EQ(error_of([&] {
              issue_client_cert({tmp.path() + "/none", out, "bob", false, false});
            }),
            tmp.path() +
                "/none/ca.crt: no such file (make the CA with 'openshell gateway "
                "generate-certs')");
}

TEST_F(CertSet, ASummarySaysWhoAndUntilWhen) {
  make();
  CertSummary owner = summarize_cert(dir + "/client.crt");
  EXPECT_EQ(owner.common_name, "owner");
  EXPECT_TRUE(owner.admin);
  EXPECT_FALSE(owner.expired);
  EXPECT_THAT(owner.not_after, ::testing::MatchesRegex("20[0-9][0-9]-[01][0-9]-[0-3][0-9]T.*Z"));
  // One that ended an hour ago.
  openshell::testing::TestCert ca = openshell::testing::make_cert({"ca", "", {}, true});
  openshell::testing::TestCert old =
      openshell::testing::make_cert({"bob", "", {}, false, -7200, -3600}, &ca);
  old.write(tmp.path() + "/old.crt", tmp.path() + "/old.key");
  CertSummary bob = summarize_cert(tmp.path() + "/old.crt");
  EXPECT_EQ(bob.common_name, "bob");
  EXPECT_FALSE(bob.admin);
  EXPECT_TRUE(bob.expired);
  openshell::testing::write_file(tmp.path() + "/junk.crt", "junk");
  EXPECT_THAT(error_of([&] { summarize_cert(tmp.path() + "/junk.crt"); }),
              ::testing::StartsWith(tmp.path() + "/junk.crt: not a PEM certificate"));
}

}  // namespace
}  // namespace openshell::auth
