// The gateway's signing key and the signed launch file.
//
// One file per sandbox, launch.cred, holds the whole identity of one launch:
// sandbox id and name, generation, a fresh session nonce, auth epoch, issue
// time, policy revision, the gateway's id and socket, and the launch spec
// (everything the supervisor needs to start the sandbox). The gateway signs
// it with its Ed25519 key and writes it atomically; the supervisor reads only
// this file and presents it; the gateway accepts only a valid signature for
// the sandbox's current generation. There is no second file to drift.
//
// File format (text, three lines):
//   openshell-launch v1
//   <payload: compact JSON, one line>
//   sig <base64 of the Ed25519 signature over the payload line's bytes>
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "base/error.h"

namespace openshell::auth {

// The gateway's Ed25519 key (OpenSSL).
class SigningKey {
 public:
  // Loads the PEM (PKCS#8) private key at path, or creates one there (mode
  // 0600; the parent directory must exist). Refuses a key file readable by
  // others. Throws Error.
  static SigningKey load_or_create(const std::string& path);

  SigningKey(SigningKey&&) noexcept;
  SigningKey& operator=(SigningKey&&) noexcept;
  SigningKey(const SigningKey&) = delete;
  SigningKey& operator=(const SigningKey&) = delete;
  ~SigningKey();

  std::string sign(std::string_view data) const;  // 64 raw bytes
  bool verify(std::string_view data, std::string_view signature) const;
  // First 16 hex digits of SHA-256 of the raw public key: the gateway's id.
  std::string id() const;
  // 32 bytes for `purpose`, derived from the private key (HKDF-SHA256): keys
  // that live and go with this one. Throws Error.
  std::string derive(std::string_view purpose) const;

 private:
  SigningKey() = default;
  void* key_ = nullptr;  // EVP_PKEY*
};

struct LaunchSpec {
  std::string sandbox_id;
  std::string sandbox_name;
  int64_t generation = 0;
  std::string nonce;  // 32 random bytes, hex
  int64_t auth_epoch = 1;
  int64_t issued_at = 0;  // seconds since the epoch
  int64_t policy_revision = 0;
  std::string gateway_id;
  std::string gateway_socket;
  std::string spec;  // the sandbox spec: a JSON object, kept as text
};

// Why a launch file was refused.
class LaunchFileError : public Error {
 public:
  enum class Kind { kTruncated, kMalformed, kBadSignature };
  LaunchFileError(Kind kind, const std::string& message) : Error(message), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

// The file's bytes.
std::string encode(const LaunchSpec& spec, const SigningKey& key);
// Parses without checking the signature (what the supervisor does). Throws
// LaunchFileError: kTruncated (missing lines/fields, empty file), kMalformed.
LaunchSpec decode(std::string_view bytes);
// Parses and checks the signature (what the gateway does). Throws
// LaunchFileError, kBadSignature when the signature does not match.
LaunchSpec decode_verified(std::string_view bytes, const SigningKey& key);

}  // namespace openshell::auth
