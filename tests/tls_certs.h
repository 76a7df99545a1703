// Certificates for the TLS tests, made with OpenSSL's API: a CA, and server
// and client certificates it signs (ECDSA P-256, as `gateway generate-certs`
// makes them), with any validity window, so that an expired one is as easy
// to make as a good one.
#pragma once

#include <sys/stat.h>

#include <cstdio>
#include <ctime>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <openssl/bio.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

namespace openshell::testing {

struct TestCert {
  std::shared_ptr<EVP_PKEY> key;
  std::shared_ptr<X509> cert;

  std::string cert_pem() const {
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_X509(bio, cert.get());
    return drain(bio);
  }
  std::string key_pem() const {
    BIO* bio = BIO_new(BIO_s_mem());
    PEM_write_bio_PrivateKey(bio, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
    return drain(bio);
  }
  void write(const std::string& cert_path, const std::string& key_path) const {
    write_text(cert_path, cert_pem());
    write_text(key_path, key_pem());
    ::chmod(key_path.c_str(), 0600);
  }

  // A certificate and its key from PEM files (a CA that generate-certs made).
  static TestCert load(const std::string& cert_path, const std::string& key_path) {
    TestCert loaded;
    if (FILE* in = std::fopen(cert_path.c_str(), "r")) {
      loaded.cert = {PEM_read_X509(in, nullptr, nullptr, nullptr), X509_free};
      std::fclose(in);
    }
    if (FILE* in = std::fopen(key_path.c_str(), "r")) {
      loaded.key = {PEM_read_PrivateKey(in, nullptr, nullptr, nullptr), EVP_PKEY_free};
      std::fclose(in);
    }
    if (!loaded.cert || !loaded.key)
      throw std::runtime_error("load " + cert_path + " and " + key_path);
    return loaded;
  }

  static void write_text(const std::string& path, const std::string& text) {
    // A new file each time (rename), as a rotation does: a reader never sees half of one.
    std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text;
      if (!out) throw std::runtime_error("write " + tmp);
    }
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error("rename " + tmp);
  }

 private:
  static std::string drain(BIO* bio) {
    char* data = nullptr;
    long n = BIO_get_mem_data(bio, &data);
    std::string text(data, static_cast<size_t>(n));
    BIO_free(bio);
    return text;
  }
};

struct CertSpec {
  std::string common_name;
  std::string unit;               // "admin" for an admin's certificate
  std::vector<std::string> sans;  // "DNS:localhost", "IP:127.0.0.1"
  bool ca = false;
  long not_before = -3600;  // seconds from now
  long not_after = 86400;
};

inline std::shared_ptr<EVP_PKEY> make_p256_key() {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  if (!key) throw std::runtime_error("EVP_EC_gen");
  return {key, EVP_PKEY_free};
}

// Signed by issuer, or self-signed when issuer is null.
inline TestCert make_cert(const CertSpec& spec, const TestCert* issuer = nullptr) {
  static long serial = 1000;
  TestCert made;
  made.key = make_p256_key();
  X509* cert = X509_new();
  made.cert = {cert, X509_free};
  X509_set_version(cert, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert), ++serial + std::time(nullptr));
  X509_gmtime_adj(X509_getm_notBefore(cert), spec.not_before);
  X509_gmtime_adj(X509_getm_notAfter(cert), spec.not_after);
  X509_set_pubkey(cert, made.key.get());
  X509_NAME* name = X509_get_subject_name(cert);
  auto add = [&](const char* field, const std::string& value) {
    X509_NAME_add_entry_by_txt(name, field, MBSTRING_UTF8,
                               reinterpret_cast<const unsigned char*>(value.c_str()), -1, -1, 0);
  };
  add("O", "openshell");
  if (!spec.unit.empty()) add("OU", spec.unit);
  if (!spec.common_name.empty()) add("CN", spec.common_name);
  X509* issuer_cert = issuer ? issuer->cert.get() : cert;
  X509_set_issuer_name(cert, X509_get_subject_name(issuer_cert));
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer_cert, cert, nullptr, nullptr, 0);
  auto extend = [&](int nid, const std::string& value) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value.c_str());
    if (!ext) throw std::runtime_error("extension " + value);
    X509_add_ext(cert, ext, -1);
    X509_EXTENSION_free(ext);
  };
  if (spec.ca) {
    extend(NID_basic_constraints, "critical,CA:TRUE");
    extend(NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    extend(NID_basic_constraints, "critical,CA:FALSE");
    extend(NID_ext_key_usage, "serverAuth,clientAuth");
  }
  extend(NID_subject_key_identifier, "hash");
  if (!spec.sans.empty()) {
    std::string list;
    for (const auto& san : spec.sans) list += (list.empty() ? "" : ",") + san;
    extend(NID_subject_alt_name, list);
  }
  EVP_PKEY* signer = issuer ? issuer->key.get() : made.key.get();
  if (X509_sign(cert, signer, EVP_sha256()) == 0) throw std::runtime_error("X509_sign");
  return made;
}

// A CA with a server certificate for localhost, 127.0.0.1 and ::1, and
// client certificates, written into dir as generate-certs lays them out.
struct TestPki {
  TestCert ca;
  TestCert server;
  TestCert client;  // CN=owner, OU=admin

  explicit TestPki(const std::string& ca_name = "openshell test CA") {
    ca = make_cert({.common_name = ca_name, .ca = true, .not_after = 10 * 86400});
    server = make_cert(
        {.common_name = "openshell gateway", .sans = {"DNS:localhost", "IP:127.0.0.1", "IP:::1"}},
        &ca);
    client = make_cert({.common_name = "owner", .unit = "admin"}, &ca);
  }

  TestCert issue_client(const std::string& name, const std::string& unit = "",
                        long not_after = 86400, long not_before = -3600) const {
    return make_cert(
        {.common_name = name, .unit = unit, .not_before = not_before, .not_after = not_after}, &ca);
  }

  // ca.crt, server.crt, server.key, client.crt, client.key in dir (no ca.key:
  // the tests never issue from files).
  void write(const std::string& dir) const {
    TestCert::write_text(dir + "/ca.crt", ca.cert_pem());
    server.write(dir + "/server.crt", dir + "/server.key");
    client.write(dir + "/client.crt", dir + "/client.key");
  }
};

}  // namespace openshell::testing
