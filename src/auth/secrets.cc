#include "auth/secrets.h"

#include <cerrno>
#include <climits>
#include <memory>
#include <utility>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/rand.h>

#include "base/files.h"
#include "base/text.h"

namespace openshell::auth {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kPrefix = "v1:";
constexpr size_t kKeySize = 32, kNonceSize = 12, kTagSize = 16;
constexpr std::string_view kPurpose = "openshell sandbox env at rest v1";

struct CipherCtxFree {
  void operator()(EVP_CIPHER_CTX* ctx) const { EVP_CIPHER_CTX_free(ctx); }
};
using CipherCtx = std::unique_ptr<EVP_CIPHER_CTX, CipherCtxFree>;

const unsigned char* bytes(std::string_view s) {
  return reinterpret_cast<const unsigned char*>(s.data());
}
unsigned char* bytes(std::string& s) { return reinterpret_cast<unsigned char*>(s.data()); }

std::string base64(std::string_view data) {
  std::string out(4 * ((data.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(bytes(out), bytes(data), static_cast<int>(data.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::optional<std::string> unbase64(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0 || text.size() > INT_MAX) return std::nullopt;
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(bytes(out), bytes(text), static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  size_t padding = text.ends_with("==") ? 2 : text.ends_with("=") ? 1 : 0;
  out.resize(static_cast<size_t>(n) - padding);
  return out;
}

std::string env_aad(const std::string& sandbox_id) {
  return "openshell sandbox env\n" + sandbox_id;
}

}  // namespace

SecretBox::SecretBox(std::string key) : key_(std::move(key)) {
  if (key_.size() != kKeySize) throw Error("secret box: the key must be 32 bytes");
}

SecretBox SecretBox::for_gateway(const SigningKey& key) { return SecretBox(key.derive(kPurpose)); }

SecretBox::~SecretBox() {
  if (!key_.empty()) OPENSSL_cleanse(key_.data(), key_.size());
}

std::string SecretBox::seal(std::string_view plaintext, std::string_view aad) const {
  if (plaintext.size() > INT_MAX / 2 || aad.size() > INT_MAX) throw Error("seal: value too large");
  std::string out(kNonceSize + plaintext.size() + kTagSize, '\0');
  if (RAND_bytes(bytes(out), kNonceSize) != 1) throw Error("seal: no random bytes");
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  if (!ctx ||
      EVP_EncryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, bytes(key_), bytes(out)) != 1 ||
      EVP_EncryptUpdate(ctx.get(), nullptr, &n, bytes(aad), static_cast<int>(aad.size())) != 1 ||
      EVP_EncryptUpdate(ctx.get(), bytes(out) + kNonceSize, &n, bytes(plaintext),
                        static_cast<int>(plaintext.size())) != 1 ||
      EVP_EncryptFinal_ex(ctx.get(), bytes(out) + kNonceSize + n, &n) != 1 ||
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_GET_TAG, kTagSize,
                          bytes(out) + kNonceSize + plaintext.size()) != 1)
    throw Error("seal: AES-256-GCM failed");
  return std::string(kPrefix) + base64(out);
}

std::string SecretBox::open(std::string_view sealed, std::string_view aad) const {
  if (!sealed.starts_with(kPrefix)) throw Error("sealed value: unknown format");
  auto raw = unbase64(sealed.substr(kPrefix.size()));
  if (!raw || raw->size() < kNonceSize + kTagSize || aad.size() > INT_MAX)
    throw Error("sealed value: malformed");
  const size_t size = raw->size() - kNonceSize - kTagSize;
  std::string out(size, '\0');
  CipherCtx ctx(EVP_CIPHER_CTX_new());
  int n = 0;
  std::string tag = raw->substr(kNonceSize + size);
  bool ok =
      ctx &&
      EVP_DecryptInit_ex(ctx.get(), EVP_aes_256_gcm(), nullptr, bytes(key_), bytes(*raw)) == 1 &&
      EVP_DecryptUpdate(ctx.get(), nullptr, &n, bytes(aad), static_cast<int>(aad.size())) == 1 &&
      EVP_DecryptUpdate(ctx.get(), bytes(out), &n, bytes(*raw) + kNonceSize,
                        static_cast<int>(size)) == 1 &&
      EVP_CIPHER_CTX_ctrl(ctx.get(), EVP_CTRL_GCM_SET_TAG, kTagSize, tag.data()) == 1 &&
      EVP_DecryptFinal_ex(ctx.get(), bytes(out) + n, &n) == 1;
  if (!ok) {
    OPENSSL_cleanse(out.data(), out.size());
    throw Error(
        "sealed value: does not open (changed, or sealed with another key or for another sandbox)");
  }
  return out;
}

std::string seal_spec_env(const SecretBox& box, const std::string& sandbox_id,
                          const std::string& spec_json) {
  Json j = Json::parse(spec_json, nullptr, false);
  if (!j.is_object() || !j.contains("env") || !j["env"].is_array() || j["env"].empty())
    return spec_json;
  j["env_sealed"] = box.seal(j["env"].dump(), env_aad(sandbox_id));
  j.erase("env");
  return j.dump();
}

std::string open_spec_env(const SecretBox& box, const std::string& sandbox_id,
                          const std::string& spec_json) {
  Json j = Json::parse(spec_json, nullptr, false);
  if (!j.is_object() || !j.contains("env_sealed")) return spec_json;
  if (!j["env_sealed"].is_string()) throw Error("spec: env_sealed: not a string");
  Json env = Json::parse(box.open(j["env_sealed"].get<std::string>(), env_aad(sandbox_id)), nullptr,
                         false);
  if (!env.is_array()) throw Error("spec: env_sealed: not a list");
  j["env"] = std::move(env);
  j.erase("env_sealed");
  return j.dump();
}

bool spec_env_in_plain(const std::string& spec_json) {
  Json j = Json::parse(spec_json, nullptr, false);
  return j.is_object() && j.contains("env") && j["env"].is_array() && !j["env"].empty();
}

std::string env_digest(const std::vector<std::string>& env) {
  std::string joined;
  for (const auto& e : env) joined += e + '\0';
  unsigned char md[32];
  unsigned int size = 0;
  if (EVP_Digest(joined.data(), joined.size(), md, &size, EVP_sha256(), nullptr) != 1)
    throw Error("sha256 failed");
  OPENSSL_cleanse(joined.data(), joined.size());
  return text::hex(md, size);
}

std::string spec_for_launch_file(const std::string& spec_json) {
  Json j = Json::parse(spec_json, nullptr, false);
  if (!j.is_object() || !spec_env_in_plain(spec_json)) return spec_json;
  std::vector<std::string> env;
  for (const auto& e : j["env"])
    if (e.is_string()) env.push_back(e.get<std::string>());
  j["env_sha256"] = env_digest(env);
  j["env"] = Json::array();
  return j.dump();
}

bool strip_launch_file_env(const std::string& path, const SigningKey& key) {
  std::string bytes;
  if (int err = files::read_into(path, &bytes)) {
    if (err == ENOENT) return false;
    throw_errno("read " + path, err);
  }
  LaunchSpec launch = decode_verified(bytes, key);
  if (!spec_env_in_plain(launch.spec)) return false;
  launch.spec = spec_for_launch_file(launch.spec);
  files::write_atomically(path, encode(launch, key));
  return true;
}

std::string launch_env_digest(const std::string& spec_json) {
  Json j = Json::parse(spec_json, nullptr, false);
  if (!j.is_object() || !j.contains("env_sha256") || !j["env_sha256"].is_string()) return "";
  return j["env_sha256"].get<std::string>();
}

}  // namespace openshell::auth
