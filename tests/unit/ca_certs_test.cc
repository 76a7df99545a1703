#include "spec/ca_certs.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../test_ca.h"
#include "base/error.h"
#include "spec/sandbox_spec.h"

namespace openshell::spec {
namespace {

using ::testing::ElementsAre;

std::string error_of(const std::string& text) {
  try {
    pem_certificates(text, "f.pem");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CaCerts, CertificatesComeBackAsPemWithoutWhatSurroundsThem) {
  EXPECT_EQ(pem_certificates(kTestCa, "f.pem"), kTestCa);
  // Text around and between blocks (as `openssl x509 -text` writes) goes.
  std::string two = std::string("subject: test\n") + kTestCa + "\nmore text\n" + kTestCa;
  EXPECT_EQ(pem_certificates(two, "f.pem"), std::string(kTestCa) + kTestCa);
}

TEST(CaCerts, AnythingElseIsRefusedNamingTheFile) {
  EXPECT_EQ(error_of("hello\n"),
            "--ca-cert f.pem: not a PEM certificate (expected -----BEGIN CERTIFICATE-----, as "
            "openssl x509 writes)");
  EXPECT_EQ(error_of("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"),
            "--ca-cert f.pem: not a PEM certificate (it holds a PRIVATE KEY)");
  EXPECT_EQ(error_of(std::string(kTestCa) +
                     "-----BEGIN CERTIFICATE-----\n!!\n-----END CERTIFICATE-----\n"),
            "--ca-cert f.pem: not a PEM certificate (certificate 2 does not decode)");
  EXPECT_EQ(error_of(""), error_of("hello\n"));
}

TEST(CaCerts, TheBundleIsTheHostsThenTheSandboxsCaThenOurs) {
  EXPECT_EQ(ca_bundle("base", {kTestCa}),
            std::string("base\n# openshell: --ca-cert 1\n") + kTestCa);
  EXPECT_EQ(ca_bundle("", {kTestCa, kTestCa}), std::string("# openshell: --ca-cert 1\n") + kTestCa +
                                                   "# openshell: --ca-cert 2\n" + kTestCa);
  EXPECT_EQ(ca_bundle("base", {kTestCa}, "SANDBOX CA\n"),
            std::string("base\n# openshell: this sandbox's CA\nSANDBOX CA\n# openshell: --ca-cert "
                        "1\n") +
                kTestCa);
  EXPECT_EQ(ca_bundle("", {}, "SANDBOX CA\n"), "# openshell: this sandbox's CA\nSANDBOX CA\n");
  EXPECT_THAT(ca_bundle_env(), ElementsAre("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
                                           "REQUESTS_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
                                           "CURL_CA_BUNDLE=/etc/ssl/certs/ca-certificates.crt",
                                           "NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt",
                                           "GIT_SSL_CAINFO=/etc/ssl/certs/ca-certificates.crt"));
  EXPECT_THAT(
      ca_bundle_env("/etc/ssl/cert.pem"),
      ElementsAre("SSL_CERT_FILE=/etc/ssl/cert.pem", "REQUESTS_CA_BUNDLE=/etc/ssl/cert.pem",
                  "CURL_CA_BUNDLE=/etc/ssl/cert.pem", "NODE_EXTRA_CA_CERTS=/etc/ssl/cert.pem",
                  "GIT_SSL_CAINFO=/etc/ssl/cert.pem"));
}

TEST(CaCerts, TravelInTheSpecAndAreCheckedThere) {
  SandboxSpec spec;
  spec.ca_certs = {kTestCa};
  EXPECT_EQ(SandboxSpec::from_json(spec.to_json()).ca_certs, spec.ca_certs);
  spec.validate();
  spec.ca_certs.push_back("junk");
  EXPECT_THROW(spec.validate(), Error);
}

}  // namespace
}  // namespace openshell::spec
