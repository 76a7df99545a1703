#include "spec/ca_certs.h"

#include <memory>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "base/error.h"
#include "base/files.h"

namespace openshell::spec {

namespace {

using Bio = std::unique_ptr<BIO, decltype(&BIO_free)>;
using Cert = std::unique_ptr<X509, decltype(&X509_free)>;

// Each PEM block in the text: its type and the bytes after it.
bool only_certificate_blocks(const std::string& text, std::string* other) {
  const std::string begin = "-----BEGIN ";
  for (size_t at = text.find(begin); at != std::string::npos; at = text.find(begin, at + 1)) {
    size_t end = text.find("-----", at + begin.size());
    if (end == std::string::npos) return false;
    std::string type = text.substr(at + begin.size(), end - at - begin.size());
    if (type != "CERTIFICATE") {
      *other = type;
      return false;
    }
  }
  return true;
}

}  // namespace

std::vector<std::string> ca_bundle_env(const std::string& path) {
  std::vector<std::string> env;
  for (const char* var : {"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE",
                          "NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO"})
    env.push_back(std::string(var) + "=" + path);
  return env;
}

std::string pem_certificates(const std::string& text, const std::string& source) {
  const std::string prefix = "--ca-cert " + source + ": not a PEM certificate";
  std::string other;
  if (!only_certificate_blocks(text, &other))
    throw Error(prefix +
                (other.empty() ? " (a PEM block without its end)" : " (it holds a " + other + ")"));
  Bio in(BIO_new_mem_buf(text.data(), static_cast<int>(text.size())), BIO_free);
  Bio out(BIO_new(BIO_s_mem()), BIO_free);
  if (!in || !out) throw Error("--ca-cert " + source + ": out of memory");
  size_t count = 0;
  for (;;) {
    Cert cert(PEM_read_bio_X509(in.get(), nullptr, nullptr, nullptr), X509_free);
    if (!cert) break;
    if (!PEM_write_bio_X509(out.get(), cert.get()))
      throw Error("--ca-cert " + source + ": cannot write the certificate out");
    ++count;
  }
  unsigned long err = ERR_peek_last_error();
  ERR_clear_error();
  // The loop ends at the end of the text (no start line found), or at a
  // block that does not decode.
  bool at_end = ERR_GET_REASON(err) == PEM_R_NO_START_LINE || err == 0;
  if (count == 0)
    throw Error(prefix + " (expected -----BEGIN CERTIFICATE-----, as openssl x509 writes)");
  if (!at_end)
    throw Error(prefix + " (certificate " + std::to_string(count + 1) + " does not decode)");
  BUF_MEM* mem = nullptr;
  BIO_get_mem_ptr(out.get(), &mem);
  return std::string(mem->data, mem->length);
}

std::string read_ca_cert(const std::string& path) {
  std::string text;
  if (int err = files::read_into(path, &text)) throw_errno("--ca-cert " + path, err);
  if (text.size() > (1u << 20)) throw Error("--ca-cert " + path + ": larger than 1 MiB");
  return pem_certificates(text, path);
}

std::string ca_bundle(const std::string& base, const std::vector<std::string>& certs,
                      const std::string& sandbox_ca) {
  std::string out = base;
  if (!out.empty() && out.back() != '\n') out += '\n';
  if (!sandbox_ca.empty()) out += std::string(kSandboxCaLine) + "\n" + sandbox_ca;
  for (size_t i = 0; i < certs.size(); ++i)
    out += "# openshell: --ca-cert " + std::to_string(i + 1) + "\n" + certs[i];
  return out;
}

}  // namespace openshell::spec
