#include "spec/ca_certs.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "spec/sandbox_spec.h"

namespace openshell::spec {
namespace {

using ::testing::ElementsAre;

constexpr const char* kCa = R"(-----BEGIN CERTIFICATE-----
MIIBljCCAT2gAwIBAgIUdjU/N9EhRLqNMFH9kJft8BIciEEwCgYIKoZIzj0EAwIw
IDEeMBwGA1UEAwwVb3BlbnNoZWxsLWUyZS10ZXN0LWNhMCAXDTI2MTIwMTExNDE1
MFoYDzIxMjYxMTA3MTE0MTUwWjAgMR4wHAYDVQQDDBVvcGVuc2hlbGwtZTJlLXRl
c3QtY2EwWTATBgcqhkjOPQIBBggqhkjOPQMBBwNCAARmZ8dx3pqZZBrwZ2b2dleM
xqa4cuVBze5NIWMGHNDpDficAanb4Uuzt5QVJIWao7+SSx8SBa6n2vUBsPSrUtlj
o1MwUTAdBgNVHQ4EFgQUpNX/qBYaTEFQMLgQsIb/oIe6d0IwHwYDVR0jBBgwFoAU
pNX/qBYaTEFQMLgQsIb/oIe6d0IwDwYDVR0TAQH/BAUwAwEB/zAKBggqhkjOPQQD
AgNHADBEAiApI0T/jfLf7A8iEVuZBZM0j4/Dw8X8fx9I5WbL6kGrhwIgGApdE+Fo
RhgEhedqotnvgpPVvfHb1r6BFu52qQTvHJo=
-----END CERTIFICATE-----
)";

std::string error_of(const std::string& text) {
  try {
    pem_certificates(text, "f.pem");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CaCerts, CertificatesComeBackAsPemWithoutWhatSurroundsThem) {
  EXPECT_EQ(pem_certificates(kCa, "f.pem"), kCa);
  // Text around and between blocks (as `openssl x509 -text` writes) goes.
  std::string two = std::string("subject: test\n") + kCa + "\nmore text\n" + kCa;
  EXPECT_EQ(pem_certificates(two, "f.pem"), std::string(kCa) + kCa);
}

TEST(CaCerts, AnythingElseIsRefusedNamingTheFile) {
  EXPECT_EQ(error_of("hello\n"),
            "--ca-cert f.pem: not a PEM certificate (expected -----BEGIN CERTIFICATE-----, as "
            "openssl x509 writes)");
  EXPECT_EQ(error_of("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
            "--ca-cert f.pem: not a PEM certificate (it holds a PRIVATE KEY)");
  EXPECT_EQ(
      error_of(std::string(kCa) + "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n"),
      "--ca-cert f.pem: not a PEM certificate (certificate 2 does not decode)");
  EXPECT_EQ(error_of(""), error_of("hello\n"));
}

TEST(CaCerts, TheBundleIsTheRootsOwnThenOurs) {
  EXPECT_EQ(ca_bundle("base", {kCa}), std::string("base\n# openshell: --ca-cert 1\n") + kCa);
  EXPECT_EQ(ca_bundle("", {kCa, kCa}),
            std::string("# openshell: --ca-cert 1\n") + kCa + "# openshell: --ca-cert 2\n" + kCa);
  EXPECT_THAT(ca_bundle_env(), ElementsAre("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                                           "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
                                           "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt",
                                           "GIT_SSL_CAINFO=/etc/ssl/certs/ca-certificates.crt"));
}

TEST(CaCerts, TravelInTheSpecAndAreCheckedThere) {
  SandboxSpec spec;
  spec.ca_certs = {kCa};
  EXPECT_EQ(SandboxSpec::from_json(spec.to_json()).ca_certs, spec.ca_certs);
  spec.validate();
  spec.ca_certs.push_back("junk");
  EXPECT_THROW(spec.validate(), Error);
}

}  // namespace
}  // namespace openshell::spec
