#include "auth/certs.h"

#include <arpa/inet.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <ctime>
#include <memory>

#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/x509_build.h"

namespace openshell::auth {

namespace {

using x509::add_extension;
using x509::add_name_entry;
using x509::fail;

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;

constexpr long kDay = 24 * 60 * 60;
constexpr long kCaDays = 3650;
constexpr long kLeafDays = 825;

Key new_p256_key() {
  Key key(EVP_PKEY_Q_keygen(nullptr, nullptr, "EC", "P-256"));
  if (!key) fail("generate an ECDSA P-256 key");
  return key;
}

std::string pem_of_key(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail("write a private key");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

std::string pem_of_cert(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (!bio || PEM_write_bio_X509(bio.get(), cert) != 1) fail("write a certificate");
  char* data = nullptr;
  long n = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, static_cast<size_t>(n));
}

Key read_key(const std::string& path) {
  std::string pem;
  if (int err = files::read_into(path, &pem)) throw_errno("read " + path, err);
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Key key(PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (!key) fail(path + ": not a PEM private key");
  return key;
}

Cert read_cert(const std::string& path) {
  std::string pem;
  if (int err = files::read_into(path, &pem)) throw_errno("read " + path, err);
  Bio bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (!cert) fail(path + ": not a PEM certificate");
  return cert;
}

struct Subject {
  std::string common_name;
  bool admin = false;
};

// A certificate for `key`'s public half, issued by issuer (by itself when
// issuer is null: the CA), to be signed once its extensions are all there.
Cert make_cert(EVP_PKEY* key, const Subject& subject, long days, X509* issuer) {
  Cert cert(X509_new());
  if (!cert || X509_set_version(cert.get(), 2) != 1) fail("make a certificate");
  // A random positive serial of 159 bits, as RFC 5280 allows at most 20 bytes.
  std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>> serial(BN_new());
  if (!serial || BN_rand(serial.get(), 159, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY) != 1 ||
      !BN_to_ASN1_INTEGER(serial.get(), X509_get_serialNumber(cert.get())))
    fail("make a serial number");
  // From a little before now: a peer whose clock is behind accepts it too.
  if (!X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300) ||
      !X509_gmtime_adj(X509_getm_notAfter(cert.get()), days * kDay))
    fail("set the validity");
  X509_NAME* name = X509_get_subject_name(cert.get());
  add_name_entry(name, "O", "openshell");
  if (subject.admin) add_name_entry(name, "OU", "admin");
  add_name_entry(name, "CN", subject.common_name);
  X509* signer = issuer ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1) fail("set the issuer");
  if (X509_set_pubkey(cert.get(), key) != 1) fail("set the public key");
  add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  if (!issuer) {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
  }
  return cert;
}

void sign(X509* cert, EVP_PKEY* issuer_key) {
  if (X509_sign(cert, issuer_key, EVP_sha256()) <= 0) fail("sign a certificate");
}

// "DNS:localhost,IP:127.0.0.1,..." from names and addresses.
std::string subject_alt_names(const std::vector<std::string>& extra) {
  std::vector<std::string> names = {"localhost", "127.0.0.1", "::1"};
  for (const auto& n : extra)
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  std::string out;
  for (const auto& n : names) {
    unsigned char buf[16];
    std::string host = n;
    if (host.size() > 2 && host.front() == '[' && host.back() == ']')
      host = host.substr(1, host.size() - 2);
    const bool ip = ::inet_pton(AF_INET, host.c_str(), buf) == 1 ||
                    ::inet_pton(AF_INET6, host.c_str(), buf) == 1;
    if (!ip) {
      const bool valid = !host.empty() && host.size() <= 253 &&
                         std::all_of(host.begin(), host.end(),
                                     [](char c) {
                                       return std::isalnum(static_cast<unsigned char>(c)) ||
                                              c == '-' || c == '.' || c == '*';
                                     }) &&
                         host.front() != '.' && host.front() != '-';
      if (!valid) throw Error("--server-san '" + n + "': neither a DNS name nor an IP address");
    }
    out += (out.empty() ? "" : ",") + std::string(ip ? "IP:" : "DNS:") + host;
  }
  return out;
}

void make_private_dir(const std::string& dir) {
  for (size_t pos = 1; pos <= dir.size(); ++pos) {
    if (pos != dir.size() && dir[pos] != '/') continue;
    const std::string prefix = dir.substr(0, pos);
    if (::mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + prefix);
  }
  if (::chmod(dir.c_str(), 0700) != 0) throw_errno("chmod " + dir);
}

// A client's certificate and key in dir, signed by the CA.
void write_client(const std::string& dir, const Subject& subject, X509* ca, EVP_PKEY* ca_key) {
  Key key = new_p256_key();
  Cert cert = make_cert(key.get(), subject, kLeafDays, ca);
  add_extension(cert.get(), ca, NID_ext_key_usage, "clientAuth");
  sign(cert.get(), ca_key);
  files::write_atomically(dir + "/client.key", pem_of_key(key.get()), 0600);
  files::write_atomically(dir + "/client.crt", pem_of_cert(cert.get()), 0644);
}

}  // namespace

const std::vector<std::string>& cert_set_files() {
  static const std::vector<std::string> kFiles = {"ca.crt",     "ca.key",     "server.crt",
                                                  "server.key", "client.crt", "client.key"};
  return kFiles;
}

void check_principal_name(const std::string& name) {
  const std::string why = name.empty()       ? "empty"
                          : name.size() > 64 ? "longer than 64 characters"
                          : name[0] == '-' || name[0] == '.'
                              ? "starts with '" + name.substr(0, 1) + "'"
                          : std::all_of(name.begin(), name.end(),
                                        [](char c) {
                                          return std::isalnum(static_cast<unsigned char>(c)) ||
                                                 c == '.' || c == '_' || c == '-' || c == '@';
                                        })
                              ? ""
                              : "only letters, digits, '.', '_', '-' and '@' are allowed";
  if (!why.empty()) throw Error("principal name '" + name + "': " + why);
}

// /etc/passwd read as a file, as the gateway reads it for the socket's
// principals (gateway/principal.h): NSS (getpwuid) would load the host's
// shared libraries into this static binary, which crashes it for a uid
// that the file does not list.
std::string principal_of_uid(unsigned uid) {
  const std::string number = std::to_string(uid);
  for (const auto& line : text::split(files::try_read("/etc/passwd").value_or(""), '\n')) {
    auto fields = text::split(line, ':');
    if (fields.size() >= 3 && !fields[0].empty() && fields[2] == number) return fields[0];
  }
  return "uid-" + number;
}

CertSetResult generate_cert_set(const CertSetOptions& options) {
  check_principal_name(options.owner);
  CertSetResult result;
  std::vector<std::string> missing;
  for (const auto& f : cert_set_files())
    (files::exists(options.dir + "/" + f) ? result.found : missing).push_back(f);
  // Checked before anything is written: a bad name leaves the set as it was.
  const std::string sans = subject_alt_names(options.server_sans);
  if (!options.force) {
    if (missing.empty()) return result;
    if (!result.found.empty()) {
      std::string list;
      for (const auto& f : missing) list += (list.empty() ? "" : ", ") + f;
      throw Error("the certificates in " + options.dir + " are incomplete (missing " + list +
                  "): --force makes a new set, which clients of the old CA no longer trust");
    }
  }
  make_private_dir(options.dir);
  Key ca_key = new_p256_key();
  Cert ca = make_cert(ca_key.get(), {"openshell CA", false}, kCaDays, nullptr);
  sign(ca.get(), ca_key.get());

  Key server_key = new_p256_key();
  Cert server = make_cert(server_key.get(), {"openshell gateway", false}, kLeafDays, ca.get());
  add_extension(server.get(), ca.get(), NID_ext_key_usage, "serverAuth");
  add_extension(server.get(), ca.get(), NID_subject_alt_name, sans);
  sign(server.get(), ca_key.get());

  // The CA's key last: a set cut short by a crash is partial, never a
  // complete set with a server certificate from another CA.
  files::write_atomically(options.dir + "/server.key", pem_of_key(server_key.get()), 0600);
  files::write_atomically(options.dir + "/server.crt", pem_of_cert(server.get()), 0644);
  write_client(options.dir, {options.owner, true}, ca.get(), ca_key.get());
  files::write_atomically(options.dir + "/ca.crt", pem_of_cert(ca.get()), 0644);
  files::write_atomically(options.dir + "/ca.key", pem_of_key(ca_key.get()), 0600);
  result.made = true;
  return result;
}

CertSummary summarize_cert(const std::string& path) {
  Cert cert = read_cert(path);
  CertSummary summary;
  X509_NAME* subject = X509_get_subject_name(cert.get());
  auto field = [&](int nid) {
    char buf[256] = "";
    return X509_NAME_get_text_by_NID(subject, nid, buf, sizeof buf) < 0 ? std::string()
                                                                        : std::string(buf);
  };
  summary.common_name = field(NID_commonName);
  summary.admin = field(NID_organizationalUnitName) == "admin";
  struct tm end {};
  if (ASN1_TIME_to_tm(X509_get0_notAfter(cert.get()), &end) == 1) {
    char text[32];
    std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &end);
    summary.not_after = text;
  }
  summary.expired = X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0;
  return summary;
}

void issue_client_cert(const ClientCertOptions& options) {
  check_principal_name(options.name);
  const std::string ca_crt = options.ca_dir + "/ca.crt", ca_key_file = options.ca_dir + "/ca.key";
  for (const auto& f : {ca_crt, ca_key_file})
    if (!files::exists(f))
      throw Error(f + ": no such file (make the CA with 'openshell gateway generate-certs')");
  Cert ca = read_cert(ca_crt);
  Key ca_key = read_key(ca_key_file);
  if (X509_check_private_key(ca.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    throw Error(ca_key_file + " is not the key of " + ca_crt);
  }
  if (!options.force && files::exists(options.out_dir + "/client.crt"))
    throw Error(options.out_dir + "/client.crt exists: --force replaces it");
  make_private_dir(options.out_dir);
  write_client(options.out_dir, {options.name, options.admin}, ca.get(), ca_key.get());
  if (options.out_dir != options.ca_dir)
    files::write_atomically(options.out_dir + "/ca.crt", pem_of_cert(ca.get()), 0644);
}

}  // namespace openshell::auth
