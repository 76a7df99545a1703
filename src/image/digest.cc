#include "image/digest.h"

#include <openssl/evp.h>

#include "base/error.h"
#include "base/text.h"

namespace openshell::image {

struct Sha256::Ctx {
  EVP_MD_CTX* md = nullptr;
  ~Ctx() { EVP_MD_CTX_free(md); }
};

Sha256::Sha256() : ctx_(std::make_unique<Ctx>()) {
  ctx_->md = EVP_MD_CTX_new();
  if (!ctx_->md || EVP_DigestInit_ex(ctx_->md, EVP_sha256(), nullptr) != 1)
    throw Error("sha256: cannot initialise OpenSSL's digest");
}

Sha256::~Sha256() = default;

void Sha256::update(const void* data, size_t size) {
  if (size == 0) return;
  EVP_DigestUpdate(ctx_->md, data, size);
  bytes_ += size;
}

std::string Sha256::digest() {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx_->md, out, &len);
  return "sha256:" + text::hex(out, len);
}

std::string sha256_digest(std::string_view data) {
  Sha256 h;
  h.update(data);
  return h.digest();
}

bool is_digest(std::string_view text) {
  if (text.size() != 71 || text.substr(0, 7) != "sha256:") return false;
  for (char c : text.substr(7))
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string digest_hex(std::string_view digest, const std::string& what) {
  if (!is_digest(digest))
    throw Error(what + ": not a sha256 digest: '" + std::string(digest.substr(0, 80)) + "'");
  return std::string(digest.substr(7));
}

}  // namespace openshell::image
