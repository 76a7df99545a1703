// A sandbox's CA bundle: the host's roots, the sandbox's own CA (new at
// each start, its key never inside) and the certificates of sandbox create
// --ca-cert, over the root's system bundles without writing the root they
// come from; the usual variables name it. `openshell run` gets the same
// when its policy has an endpoint the proxy inspects, or with --ca-cert.
#include <glob.h>
#include <unistd.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "../test_ca.h"
#include "harness.h"

namespace e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr const char* kBundle = "/etc/ssl/certs/ca-certificates.crt";
constexpr const char* kSandboxCaLine = "# openshell: this sandbox's CA\n";

// The host's roots, as the sandbox's bundle starts with them: the first
// distribution bundle the host has (src/base/ca_bundles.h).
std::string host_roots() {
  for (const char* path :
       {"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt",
        "/etc/ssl/ca-bundle.pem", "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
        "/etc/ssl/cert.pem"})
    if (::access(path, R_OK) == 0) return file_contents(path);
  return "";
}

// The sandbox's own CA in a bundle: the certificate after its line.
std::string sandbox_ca_of(const std::string& bundle) {
  const size_t at = bundle.find(kSandboxCaLine);
  if (at == std::string::npos) return "";
  const std::string end = "-----END CERTIFICATE-----\n";
  const size_t stop = bundle.find(end, at);
  if (stop == std::string::npos) return "";
  const size_t start = at + std::string(kSandboxCaLine).size();
  return bundle.substr(start, stop + end.size() - start);
}

// "/O=openshell/CN=..." of a PEM certificate; "" when it is none.
std::string subject_of(const std::string& pem) {
  std::unique_ptr<BIO, decltype(&BIO_free)> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())), BIO_free);
  std::unique_ptr<X509, decltype(&X509_free)> cert(
      PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr), X509_free);
  if (!cert) return "";
  char text[256];
  X509_NAME_oneline(X509_get_subject_name(cert.get()), text, sizeof text);
  return text;
}

class CaCert : public GatewayTest {
 protected:
  CaCert() : GatewayTest("cahome", false) {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    static int counter = 0;
    dir_ = make_dir(mode(), "cafiles-" + mode_name(mode()) + "-" + std::to_string(++counter), 0755);
  }
  std::string dir_;
};
E2E_ALL_MODES(CaCert);

TEST_P(CaCert, JoinsTheSystemBundleAndTheVariablesNameIt) {
  GatewayGuard gateway(mode(), home_);
  const std::string ca = write_file(dir_ + "/ca.pem", kTestCa);
  const std::string show =
      "echo \"$SSL_CERT_FILE $REQUESTS_CA_BUNDLE $CURL_CA_BUNDLE $NODE_EXTRA_CA_CERTS "
      "$GIT_SSL_CAINFO\"; cat " +
      std::string(kBundle);
  const std::string vars =
      std::string(kBundle) + " " + kBundle + " " + kBundle + " " + kBundle + " " + kBundle;
  const std::string roots = host_roots();

  // A directory root (owned by root, as a distribution's would be) with a
  // bundle of its own: the host's roots in its place, then the sandbox's CA
  // and ours; its file as it was.
  const std::string root = scratch() + "/ca-root-" + mode_name(mode());
  const std::string own = "# the root's own bundle\n";
  ASSERT_EQ(std::system(("rm -rf '" + root + "' && cp -a '" + rootfs() + "' '" + root +
                         "' && mkdir -p '" + root + "/etc/ssl/certs'")
                            .c_str()),
            0);
  write_file(root + kBundle, own);
  Result created = os({"sandbox", "create", "--name", "ca", "--from", root, "--ca-cert", ca});
  ASSERT_EQ(created.status, 0) << created.err;
  Result r = os({"sandbox", "exec", "ca", "--", "sh", "-c", show});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(vars + "\n" + roots));
  EXPECT_THAT(r.out, HasSubstr(std::string(kSandboxCaLine) + "-----BEGIN CERTIFICATE-----"));
  EXPECT_THAT(r.out, HasSubstr(std::string("# openshell: --ca-cert 1\n") + kTestCa));
  EXPECT_EQ(file_contents(root + kBundle), own);
  // It stays across a stop and a start, and the sandbox cannot change it.
  ASSERT_EQ(os({"sandbox", "stop", "ca"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "ca"}).status, 0);
  Result again = os({"sandbox", "exec", "ca", "--", "cat", kBundle});
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.out.substr(0, roots.size()), roots);
  EXPECT_THAT(again.out, HasSubstr(kTestCa));
  Result write =
      os({"sandbox", "exec", "ca", "--", "sh", "-c", std::string("echo x >> ") + kBundle});
  EXPECT_EQ(write.status, 1);
  EXPECT_THAT(write.err, HasSubstr("Read-only file system"));

  // A root without a bundle gets one for --ca-cert. (Rootless, the
  // mount point cannot be made yet in a root the user may not write: issue
  // 10, item 1.)
  if (!is_rootless(mode())) {
    Result bare =
        os({"sandbox", "create", "--name", "cabare", "--from", rootfs(), "--ca-cert", ca});
    ASSERT_EQ(bare.status, 0) << bare.err;
    Result b = os({"sandbox", "exec", "cabare", "--", "sh", "-c", show});
    EXPECT_EQ(b.status, 0) << b.err;
    EXPECT_THAT(b.out, StartsWith(vars + "\n" + roots));
    EXPECT_THAT(b.out, HasSubstr(std::string("# openshell: --ca-cert 1\n") + kTestCa));
  }

  // The host's root: its certificates and ours, and the host's file as it was.
  const std::string host_bundle = file_contents(kBundle);
  if (host_bundle.empty()) GTEST_SKIP() << kBundle << " is missing on this machine";
  Result on_host = os({"sandbox", "create", "--name", "cahost", "--from", "host", "--ca-cert", ca});
  ASSERT_EQ(on_host.status, 0) << on_host.err;
  Result h = os({"sandbox", "exec", "cahost", "--", "sh", "-c", show});
  EXPECT_EQ(h.status, 0) << h.err;
  EXPECT_THAT(h.out, StartsWith(vars + "\n" + roots));
  EXPECT_THAT(h.out, HasSubstr(kTestCa));
  EXPECT_EQ(file_contents(kBundle), host_bundle);
}

TEST_P(CaCert, TheSandboxTrustsItsOwnCaWhoseKeyStaysOutside) {
  GatewayGuard gateway(mode(), home_);
  // A root with a Debian and a Fedora bundle, and no --ca-cert.
  const std::string fedora = "/etc/pki/tls/certs/ca-bundle.crt";
  const std::string root = scratch() + "/ca-own-" + mode_name(mode());
  ASSERT_EQ(
      std::system(("rm -rf '" + root + "' && cp -a '" + rootfs() + "' '" + root +
                   "' && mkdir -p '" + root + "/etc/ssl/certs' '" + root + "/etc/pki/tls/certs'")
                      .c_str()),
      0);
  write_file(root + kBundle, "# the root's own\n");
  write_file(root + fedora, "# the root's own\n");
  Result created = os({"sandbox", "create", "--name", "trust", "--from", root});
  ASSERT_EQ(created.status, 0) << created.err;

  const std::string show =
      "for v in SSL_CERT_FILE REQUESTS_CA_BUNDLE CURL_CA_BUNDLE NODE_EXTRA_CA_CERTS "
      "GIT_SSL_CAINFO; do eval echo \\$v=\\$$v; done; cat \"$SSL_CERT_FILE\"";
  Result r = os({"sandbox", "exec", "trust", "--", "sh", "-c", show});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string vars = std::string("SSL_CERT_FILE=") + kBundle +
                           "\nREQUESTS_CA_BUNDLE=" + kBundle + "\nCURL_CA_BUNDLE=" + kBundle +
                           "\nNODE_EXTRA_CA_CERTS=" + kBundle + "\nGIT_SSL_CAINFO=" + kBundle +
                           "\n";
  ASSERT_THAT(r.out, StartsWith(vars));
  const std::string bundle = r.out.substr(vars.size());
  // The host's roots are still there, then the sandbox's CA, named for it.
  EXPECT_EQ(bundle.substr(0, host_roots().size()), host_roots());
  const std::string ca = sandbox_ca_of(bundle);
  EXPECT_EQ(subject_of(ca), "/O=openshell/CN=openshell sandbox trust");
  EXPECT_THAT(bundle, Not(HasSubstr("PRIVATE KEY")));
  // Fedora's path holds the same; the root's files are as they were.
  Result f = os({"sandbox", "exec", "trust", "--", "cat", fedora});
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(f.out, bundle);
  EXPECT_EQ(file_contents(root + kBundle), "# the root's own\n");
  // Nor is the key in the environment of any process the sandbox can read
  // (its main process's among them; the init's is not readable).
  Result env = os({"sandbox", "exec", "trust", "--", "sh", "-c",
                   "for f in /proc/[0-9]*/environ; do cat $f 2>/dev/null; echo; done"});
  EXPECT_EQ(env.status, 0) << env.err;
  EXPECT_THAT(env.out, HasSubstr(std::string("CURL_CA_BUNDLE=") + kBundle));
  EXPECT_THAT(env.out, Not(HasSubstr("PRIVATE KEY")));

  // Each start makes a new CA.
  ASSERT_EQ(os({"sandbox", "stop", "trust"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "trust"}).status, 0);
  Result again = os({"sandbox", "exec", "trust", "--", "cat", kBundle});
  EXPECT_EQ(again.status, 0) << again.err;
  const std::string next = sandbox_ca_of(again.out);
  EXPECT_EQ(subject_of(next), "/O=openshell/CN=openshell sandbox trust");
  EXPECT_NE(next, ca);
}

// The directories runs keep their bundle in while they start: none should
// outlive a run.
std::vector<std::string> run_ca_dirs() {
  std::vector<std::string> dirs;
  glob_t g{};
  if (::glob("/tmp/openshell-ca.*", 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) dirs.push_back(g.gl_pathv[i]);
  ::globfree(&g);
  return dirs;
}

// The variables, then the Debian bundle.
const std::string kShowTrust =
    "for v in SSL_CERT_FILE REQUESTS_CA_BUNDLE CURL_CA_BUNDLE NODE_EXTRA_CA_CERTS "
    "GIT_SSL_CAINFO; do eval echo \\$v=\\$$v; done; cat " +
    std::string(kBundle);

TEST_P(CaCert, RunWithAnInspectingPolicyTrustsACaOfItsOwn) {
  // A directory root (owned by root) with a Debian and a Fedora bundle.
  const std::string fedora = "/etc/pki/tls/certs/ca-bundle.crt";
  const std::string root = scratch() + "/ca-run-" + mode_name(mode());
  ASSERT_EQ(
      std::system(("rm -rf '" + root + "' && cp -a '" + rootfs() + "' '" + root +
                   "' && mkdir -p '" + root + "/etc/ssl/certs' '" + root + "/etc/pki/tls/certs'")
                      .c_str()),
      0);
  const std::string own = "# the root's own\n";
  write_file(root + kBundle, own);
  write_file(root + fedora, own);
  const std::string inspected = write_file(
      dir_ + "/l7.toml",
      "version = 1\n[network_policies.api]\nendpoints = [ { host = \"api.example.com\", port = "
      "443, protocol = \"rest\", access = \"read-only\" } ]\n");
  const std::string layer4 =
      write_file(dir_ + "/l4.toml",
                 "version = 1\n[network_policies.api]\nendpoints = [ { host = "
                 "\"api.example.com\", port = 443 } ]\n");
  const std::vector<std::string> dirs_before = run_ca_dirs();
  auto run = [&](const std::string& from, const std::string& policy,
                 const std::vector<std::string>& command) {
    std::vector<std::string> args = {"run",  "--rootfs",   from,     "--policy",
                                     policy, "--hostname", "ca-run", "--"};
    args.insert(args.end(), command.begin(), command.end());
    return openshell(mode(), args);
  };
  const std::string vars = std::string("SSL_CERT_FILE=") + kBundle +
                           "\nREQUESTS_CA_BUNDLE=" + kBundle + "\nCURL_CA_BUNDLE=" + kBundle +
                           "\nNODE_EXTRA_CA_CERTS=" + kBundle + "\nGIT_SSL_CAINFO=" + kBundle +
                           "\n";

  Result r = run(root, inspected, {"sh", "-c", kShowTrust});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_THAT(r.out, StartsWith(vars));
  const std::string bundle = r.out.substr(vars.size());
  // The host's roots, then the sandbox's CA, named after its host name.
  EXPECT_EQ(bundle.substr(0, host_roots().size()), host_roots());
  const std::string ca = sandbox_ca_of(bundle);
  EXPECT_EQ(subject_of(ca), "/O=openshell/CN=openshell sandbox ca-run");
  EXPECT_THAT(bundle, Not(HasSubstr("PRIVATE KEY")));
  // Fedora's path holds the same; the root's files are as they were, and
  // the run left no directory of its bundle behind.
  Result f = run(root, inspected, {"cat", fedora});
  EXPECT_EQ(f.status, 0) << f.err;
  EXPECT_EQ(subject_of(sandbox_ca_of(f.out)), "/O=openshell/CN=openshell sandbox ca-run");
  EXPECT_EQ(file_contents(root + kBundle), own);
  EXPECT_EQ(file_contents(root + fedora), own);
  EXPECT_EQ(run_ca_dirs(), dirs_before);
  // Each run makes a new CA (the second one above had its own too).
  EXPECT_NE(sandbox_ca_of(f.out), ca);
  Result again = run(root, inspected, {"cat", kBundle});
  EXPECT_EQ(again.status, 0) << again.err;
  const std::string next = sandbox_ca_of(again.out);
  EXPECT_EQ(subject_of(next), "/O=openshell/CN=openshell sandbox ca-run");
  EXPECT_NE(next, ca);

  // A layer-4 policy: no CA, the root's bundle as it is, no variables.
  Result l4 = run(root, layer4, {"sh", "-c", kShowTrust});
  EXPECT_EQ(l4.status, 0) << l4.err;
  EXPECT_EQ(l4.out,
            "SSL_CERT_FILE=\nREQUESTS_CA_BUNDLE=\nCURL_CA_BUNDLE=\nNODE_EXTRA_CA_CERTS=\n"
            "GIT_SSL_CAINFO=\n" +
                own);

  // The host's root: its bundle, mounted over in the sandbox only.
  const std::string host_bundle = file_contents(kBundle);
  if (host_bundle.empty()) GTEST_SKIP() << kBundle << " is missing on this machine";
  Result h = run("host", inspected, {"sh", "-c", kShowTrust});
  ASSERT_EQ(h.status, 0) << h.err;
  ASSERT_THAT(h.out, StartsWith(vars + host_roots()));
  const std::string on_host = sandbox_ca_of(h.out.substr(vars.size()));
  EXPECT_EQ(subject_of(on_host), "/O=openshell/CN=openshell sandbox ca-run");
  EXPECT_NE(on_host, ca);
  EXPECT_EQ(file_contents(kBundle), host_bundle);
  Result h4 = run("host", layer4, {"cat", kBundle});
  EXPECT_EQ(h4.status, 0) << h4.err;
  EXPECT_EQ(h4.out, host_bundle);
  EXPECT_EQ(run_ca_dirs(), dirs_before);
}

TEST_P(CaCert, RunTakesCaCertAndRefusesWhatIsNotOne) {
  const std::string root = scratch() + "/ca-runcert-" + mode_name(mode());
  ASSERT_EQ(std::system(("rm -rf '" + root + "' && cp -a '" + rootfs() + "' '" + root +
                         "' && mkdir -p '" + root + "/etc/ssl/certs'")
                            .c_str()),
            0);
  write_file(root + kBundle, "# the root's own\n");
  const std::string ca = write_file(dir_ + "/run-ca.pem", kTestCa);
  // No policy, no network: the certificates still join the bundle, without
  // a CA of the sandbox's (nothing is inspected).
  Result r = openshell(mode(), {"run", "--rootfs", root, "--ca-cert", ca, "--", "sh", "-c",
                                "echo $SSL_CERT_FILE; cat $SSL_CERT_FILE"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, StartsWith(std::string(kBundle) + "\n" + host_roots()));
  EXPECT_THAT(r.out, HasSubstr(std::string("# openshell: --ca-cert 1\n") + kTestCa));
  EXPECT_THAT(r.out, Not(HasSubstr(kSandboxCaLine)));
  EXPECT_EQ(file_contents(root + kBundle), "# the root's own\n");
  const std::string key = write_file(
      dir_ + "/run-key.pem", "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n");
  Result k = openshell(mode(), {"run", "--rootfs", root, "--ca-cert", key, "--", "true"});
  EXPECT_EQ(k.status, 125);
  EXPECT_EQ(k.err,
            "openshell: --ca-cert " + key + ": not a PEM certificate (it holds a PRIVATE KEY)\n");
}

TEST_P(CaCert, WhatIsNotACertificateIsRefusedInOneLine) {
  const std::string key = write_file(
      dir_ + "/key.pem", "-----BEGIN PRIVATE KEY-----\nMIGH\n-----END PRIVATE KEY-----\n");
  const std::string text = write_file(dir_ + "/notes.txt", "just some text\n");
  const std::string broken =
      write_file(dir_ + "/broken.pem",
                 "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n");
  Result k = os({"sandbox", "create", "--name", "x", "--from", rootfs(), "--ca-cert", key});
  EXPECT_EQ(k.status, 125);
  EXPECT_EQ(k.err,
            "openshell: --ca-cert " + key + ": not a PEM certificate (it holds a PRIVATE KEY)\n");
  Result t = os({"sandbox", "create", "--name", "x", "--from", rootfs(), "--ca-cert", text});
  EXPECT_EQ(t.status, 125);
  EXPECT_EQ(t.err, "openshell: --ca-cert " + text +
                       ": not a PEM certificate (expected -----BEGIN CERTIFICATE-----, as openssl "
                       "x509 writes)\n");
  Result b = os({"sandbox", "create", "--name", "x", "--from", rootfs(), "--ca-cert", broken});
  EXPECT_EQ(b.status, 125);
  EXPECT_EQ(b.err, "openshell: --ca-cert " + broken +
                       ": not a PEM certificate (expected -----BEGIN CERTIFICATE-----, as openssl "
                       "x509 writes)\n");
  Result missing =
      os({"sandbox", "create", "--name", "x", "--from", rootfs(), "--ca-cert", dir_ + "/none.pem"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_EQ(missing.err, "openshell: --ca-cert " + dir_ + "/none.pem: No such file or directory\n");
}

}  // namespace
}  // namespace e2e
