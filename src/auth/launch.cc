#include "auth/launch.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/pem.h>

#include "base/files.h"
#include "base/text.h"
#include "base/unique_fd.h"

namespace openshell::auth {
namespace {

constexpr std::string_view kHeader = "openshell-launch v1";
constexpr std::string_view kSigPrefix = "sig ";
constexpr size_t kSignatureSize = 64;  // Ed25519

using Json = nlohmann::json;

struct PkeyFree {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* ctx) const { EVP_MD_CTX_free(ctx); }
};
struct BioFree {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;
using MdCtxPtr = std::unique_ptr<EVP_MD_CTX, MdCtxFree>;
using BioPtr = std::unique_ptr<BIO, BioFree>;

// The oldest queued OpenSSL error as text, with the queue emptied so that it
// cannot be blamed on a later call.
std::string openssl_error() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "unknown OpenSSL error";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// Key material held in a std::string is wiped before the memory is freed.
struct WipedString {
  std::string text;
  ~WipedString() {
    if (!text.empty()) OPENSSL_cleanse(text.data(), text.size());
  }
};

// Never prompts for a passphrase: an encrypted key is simply not loadable.
int no_passphrase(char*, int, int, void*) { return -1; }

std::string base64_encode(std::string_view data) {
  std::string out(4 * ((data.size() + 2) / 3) + 1, '\0');  // + the NUL EVP_EncodeBlock writes
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(data.data()),
                          static_cast<int>(data.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

// Strict: only the canonical encoding of some bytes is accepted (EVP_DecodeBlock
// itself skips whitespace and ignores stray low bits).
std::optional<std::string> base64_decode(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0 || text.size() > INT_MAX) return std::nullopt;
  std::string out(text.size() / 4 * 3, '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the padding as zero bytes.
  size_t padding = text.ends_with("==") ? 2 : text.ends_with("=") ? 1 : 0;
  out.resize(static_cast<size_t>(n) - padding);
  if (base64_encode(out) != text) return std::nullopt;
  return out;
}

[[noreturn]] void refuse(LaunchFileError::Kind kind, const std::string& what) {
  throw LaunchFileError(kind, "launch file: " + what);
}
[[noreturn]] void truncated(const std::string& what) {
  refuse(LaunchFileError::Kind::kTruncated, "truncated (" + what + ")");
}
[[noreturn]] void malformed(const std::string& what) {
  refuse(LaunchFileError::Kind::kMalformed, what);
}

// Untrusted text quoted in a message only when short and printable.
std::string quoted_if_printable(std::string_view text) {
  if (text.size() > 32) return "";
  for (char c : text)
    if (c < 0x20 || c > 0x7e) return "";
  return " \"" + std::string(text) + "\"";
}

// The file's three lines, checked for shape only.
struct Lines {
  std::string_view payload;
  std::string signature;  // decoded, any length
};

Lines split(std::string_view bytes) {
  if (bytes.empty()) truncated("empty file");

  size_t header_end = bytes.find('\n');
  std::string_view header = bytes.substr(0, header_end);
  if (header != kHeader) {
    if (header_end == std::string_view::npos && kHeader.starts_with(header))
      truncated("incomplete header line");
    if (header.starts_with("openshell-launch "))
      malformed("unsupported version" + quoted_if_printable(header.substr(17)) +
                " (this openshell reads \"openshell-launch v1\")");
    malformed("not an openshell launch file (the first line is not \"openshell-launch v1\")");
  }
  if (header_end == std::string_view::npos) truncated("no newline after the header line");

  std::string_view rest = bytes.substr(header_end + 1);
  if (rest.empty()) truncated("no payload line");
  size_t payload_end = rest.find('\n');
  if (payload_end == std::string_view::npos) truncated("no signature line");
  Lines lines;
  lines.payload = rest.substr(0, payload_end);
  if (lines.payload.empty()) malformed("empty payload line");

  rest = rest.substr(payload_end + 1);
  if (rest.empty()) truncated("no signature line");
  size_t sig_end = rest.find('\n');
  std::string_view sig_line = rest.substr(0, sig_end);
  if (!sig_line.starts_with(kSigPrefix)) {
    if (sig_end == std::string_view::npos && kSigPrefix.starts_with(sig_line))
      truncated("incomplete signature line");
    malformed("the third line is not a signature line (\"sig <base64>\")");
  }
  if (sig_end == std::string_view::npos) truncated("incomplete signature line");
  if (sig_end + 1 != rest.size()) malformed("unexpected data after the signature line");

  std::string_view encoded = sig_line.substr(kSigPrefix.size());
  if (encoded.empty()) malformed("empty signature");
  std::optional<std::string> signature = base64_decode(encoded);
  if (!signature) malformed("the signature is not valid base64");
  lines.signature = std::move(*signature);
  return lines;
}

const Json& field(const Json& payload, const char* name) {
  auto it = payload.find(name);
  if (it == payload.end()) truncated(std::string("the payload has no field \"") + name + "\"");
  return *it;
}

std::string string_field(const Json& payload, const char* name) {
  const Json& value = field(payload, name);
  if (!value.is_string()) malformed(std::string("field \"") + name + "\" is not a string");
  return value.get<std::string>();
}

int64_t integer_field(const Json& payload, const char* name) {
  const Json& value = field(payload, name);
  if (value.is_number_unsigned() && value.get<uint64_t>() <= uint64_t{INT64_MAX})
    return static_cast<int64_t>(value.get<uint64_t>());
  if (value.is_number_integer() && !value.is_number_unsigned()) return value.get<int64_t>();
  malformed(std::string("field \"") + name + "\" is not an integer (64-bit)");
}

LaunchSpec parse_payload(std::string_view text) {
  Json payload = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (payload.is_discarded()) malformed("the payload is not valid JSON");
  if (!payload.is_object()) malformed("the payload is not a JSON object");
  LaunchSpec spec;
  spec.sandbox_id = string_field(payload, "sandbox_id");
  spec.sandbox_name = string_field(payload, "sandbox_name");
  spec.generation = integer_field(payload, "generation");
  spec.nonce = string_field(payload, "nonce");
  spec.auth_epoch = integer_field(payload, "auth_epoch");
  spec.issued_at = integer_field(payload, "issued_at");
  spec.policy_revision = integer_field(payload, "policy_revision");
  spec.gateway_id = string_field(payload, "gateway_id");
  spec.gateway_socket = string_field(payload, "gateway_socket");
  const Json& sandbox_spec = field(payload, "spec");
  if (!sandbox_spec.is_object()) malformed("field \"spec\" is not a JSON object");
  spec.spec = sandbox_spec.dump();
  return spec;
}

std::string describe_mode(mode_t mode) {
  char text[8];
  std::snprintf(text, sizeof text, "%04o", static_cast<unsigned>(mode & 07777));
  return text;
}

EVP_PKEY* as_pkey(void* key) { return static_cast<EVP_PKEY*>(key); }

}  // namespace

// --- SigningKey ---

SigningKey SigningKey::load_or_create(const std::string& path) {
  SigningKey result;
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd) {
    if (errno != ENOENT) throw_errno("open key file " + path);
    PkeyPtr key(EVP_PKEY_Q_keygen(nullptr, nullptr, "ED25519"));
    if (!key) throw Error("create key " + path + ": " + openssl_error());
    BioPtr bio(BIO_new(BIO_s_mem()));
    if (!bio ||
        PEM_write_bio_PrivateKey(bio.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
      throw Error("create key " + path + ": " + openssl_error());
    char* data = nullptr;
    long size = BIO_get_mem_data(bio.get(), &data);
    WipedString pem{std::string(data, static_cast<size_t>(size))};
    // A memory BIO does not wipe what it held.
    OPENSSL_cleanse(data, static_cast<size_t>(size));
    files::write_atomically(path, pem.text, 0600);
    result.key_ = key.release();
    return result;
  }

  struct stat st;
  if (::fstat(fd.get(), &st) != 0) throw_errno("stat key file " + path);
  if (!S_ISREG(st.st_mode)) throw Error("key file " + path + ": not a regular file");
  if ((st.st_mode & 077) != 0)
    throw Error("key file " + path + " has mode " + describe_mode(st.st_mode) +
                ": group or others may access it; refusing it (chmod 600 it, or remove it to "
                "create a new key)");

  WipedString pem;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      OPENSSL_cleanse(buf, sizeof buf);
      throw_errno("read key file " + path);
    }
    if (n == 0) break;
    pem.text.append(buf, static_cast<size_t>(n));
    if (pem.text.size() > (1 << 20)) break;  // far larger than any key; the parse will fail
  }
  OPENSSL_cleanse(buf, sizeof buf);

  BioPtr bio(BIO_new_mem_buf(pem.text.data(), static_cast<int>(pem.text.size())));
  if (!bio) throw Error("load key " + path + ": " + openssl_error());
  PkeyPtr key(PEM_read_bio_PrivateKey(bio.get(), nullptr, no_passphrase, nullptr));
  ERR_clear_error();
  if (!key || EVP_PKEY_get_id(key.get()) != EVP_PKEY_ED25519)
    throw Error("key file " + path + ": not an Ed25519 private key in PEM (PKCS#8) form");
  result.key_ = key.release();
  return result;
}

SigningKey::SigningKey(SigningKey&& other) noexcept : key_(std::exchange(other.key_, nullptr)) {}

SigningKey& SigningKey::operator=(SigningKey&& other) noexcept {
  if (this != &other) {
    EVP_PKEY_free(as_pkey(key_));
    key_ = std::exchange(other.key_, nullptr);
  }
  return *this;
}

SigningKey::~SigningKey() { EVP_PKEY_free(as_pkey(key_)); }

std::string SigningKey::sign(std::string_view data) const {
  MdCtxPtr ctx(EVP_MD_CTX_new());
  std::string signature(kSignatureSize, '\0');
  size_t size = signature.size();
  // Ed25519 hashes internally: no digest is named, and the data goes in one call.
  if (!key_ || !ctx ||
      EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, as_pkey(key_)) != 1 ||
      EVP_DigestSign(ctx.get(), reinterpret_cast<unsigned char*>(signature.data()), &size,
                     reinterpret_cast<const unsigned char*>(data.data()), data.size()) != 1)
    throw Error("sign: " + openssl_error());
  signature.resize(size);
  return signature;
}

bool SigningKey::verify(std::string_view data, std::string_view signature) const {
  if (!key_ || signature.size() != kSignatureSize) return false;
  MdCtxPtr ctx(EVP_MD_CTX_new());
  bool ok = ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, as_pkey(key_)) == 1 &&
            EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                             signature.size(), reinterpret_cast<const unsigned char*>(data.data()),
                             data.size()) == 1;
  ERR_clear_error();
  return ok;
}

std::string SigningKey::derive(std::string_view purpose) const {
  WipedString secret;
  size_t size = 0;
  auto* key = static_cast<EVP_PKEY*>(key_);
  if (EVP_PKEY_get_raw_private_key(key, nullptr, &size) != 1)
    throw Error("derive a key: " + openssl_error());
  secret.text.resize(size);
  if (EVP_PKEY_get_raw_private_key(key, reinterpret_cast<unsigned char*>(secret.text.data()),
                                   &size) != 1)
    throw Error("derive a key: " + openssl_error());
  std::unique_ptr<EVP_PKEY_CTX, decltype(&EVP_PKEY_CTX_free)> ctx(
      EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr), EVP_PKEY_CTX_free);
  static constexpr unsigned char kSalt[] = "openshell key derivation v1";
  std::string out(32, '\0');
  size_t out_size = out.size();
  if (!ctx || EVP_PKEY_derive_init(ctx.get()) != 1 ||
      EVP_PKEY_CTX_set_hkdf_md(ctx.get(), EVP_sha256()) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_salt(ctx.get(), kSalt, sizeof kSalt - 1) != 1 ||
      EVP_PKEY_CTX_set1_hkdf_key(ctx.get(),
                                 reinterpret_cast<const unsigned char*>(secret.text.data()),
                                 static_cast<int>(secret.text.size())) != 1 ||
      EVP_PKEY_CTX_add1_hkdf_info(ctx.get(), reinterpret_cast<const unsigned char*>(purpose.data()),
                                  static_cast<int>(purpose.size())) != 1 ||
      EVP_PKEY_derive(ctx.get(), reinterpret_cast<unsigned char*>(out.data()), &out_size) != 1 ||
      out_size != out.size())
    throw Error("derive a key: " + openssl_error());
  return out;
}

std::string SigningKey::id() const {
  unsigned char raw[64];
  size_t raw_size = sizeof raw;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_size = 0;
  if (!key_ || EVP_PKEY_get_raw_public_key(as_pkey(key_), raw, &raw_size) != 1 ||
      EVP_Digest(raw, raw_size, digest, &digest_size, EVP_sha256(), nullptr) != 1)
    throw Error("key id: " + openssl_error());
  return text::hex(digest, 8);
}

// --- The launch file ---

std::string encode(const LaunchSpec& spec, const SigningKey& key) {
  Json sandbox_spec = Json::parse(spec.spec, nullptr, /*allow_exceptions=*/false);
  if (sandbox_spec.is_discarded() || !sandbox_spec.is_object())
    throw Error("launch file for sandbox " + spec.sandbox_name +
                ": the sandbox spec is not a JSON object");
  // nlohmann::json keeps object keys sorted, so the same spec always gives the
  // same bytes.
  Json payload = {
      {"sandbox_id", spec.sandbox_id},           {"sandbox_name", spec.sandbox_name},
      {"generation", spec.generation},           {"nonce", spec.nonce},
      {"auth_epoch", spec.auth_epoch},           {"issued_at", spec.issued_at},
      {"policy_revision", spec.policy_revision}, {"gateway_id", spec.gateway_id},
      {"gateway_socket", spec.gateway_socket},   {"spec", std::move(sandbox_spec)},
  };
  std::string line;
  try {
    line = payload.dump();  // compact; control characters escaped, so one line
  } catch (const Json::exception&) {
    throw Error("launch file for sandbox " + spec.sandbox_id + ": a field is not valid UTF-8 text");
  }
  std::string out;
  out.reserve(kHeader.size() + line.size() + 100);
  out.append(kHeader);
  out += '\n';
  out += line;
  out += '\n';
  out.append(kSigPrefix);
  out += base64_encode(key.sign(line));
  out += '\n';
  return out;
}

LaunchSpec decode(std::string_view bytes) { return parse_payload(split(bytes).payload); }

LaunchSpec decode_verified(std::string_view bytes, const SigningKey& key) {
  Lines lines = split(bytes);
  // Checked before the payload is parsed: whatever was changed, the answer is
  // the same.
  if (!key.verify(lines.payload, lines.signature))
    refuse(LaunchFileError::Kind::kBadSignature,
           "signature does not match (tampered, or signed by another gateway)");
  return parse_payload(lines.payload);
}

}  // namespace openshell::auth
