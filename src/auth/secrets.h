// Secrets at rest: a sandbox's environment (its -e values: tokens, keys) is
// kept out of files that need not hold it, and sealed where it must rest.
//
//  - gateway.db holds each sandbox's spec with its env sealed: AES-256-GCM
//    under a data key derived (HKDF-SHA256) from the gateway's Ed25519 key,
//    a fresh 96-bit nonce per value, the sandbox id as additional data (a
//    sealed value copied to another sandbox's row does not open).
//  - The launch file holds only the env's digest; the supervisor gets the
//    values from the gateway in the session's welcome, once its launch file
//    is accepted, and checks them against the digest it was signed with.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "auth/launch.h"
#include "base/error.h"

namespace openshell::auth {

class SecretBox {
 public:
  // key: 32 bytes.
  explicit SecretBox(std::string key);
  // The gateway's data key for values at rest, derived from its signing key.
  static SecretBox for_gateway(const SigningKey& key);
  SecretBox(SecretBox&&) noexcept = default;
  SecretBox& operator=(SecretBox&&) noexcept = default;
  ~SecretBox();

  // "v1:" + base64(nonce || ciphertext || tag).
  std::string seal(std::string_view plaintext, std::string_view aad) const;
  // Throws Error when the text is not one of ours, was changed, or was sealed
  // with another key or other additional data.
  std::string open(std::string_view sealed, std::string_view aad) const;

 private:
  std::string key_;
};

// A spec (JSON text) as it rests in gateway.db: a non-empty "env" becomes
// "env_sealed", bound to the sandbox id. Other specs come back unchanged.
std::string seal_spec_env(const SecretBox& box, const std::string& sandbox_id,
                          const std::string& spec_json);
// The inverse; a spec whose env is in plain text (written before) comes back
// as it is. Throws Error when the sealed env does not open.
std::string open_spec_env(const SecretBox& box, const std::string& sandbox_id,
                          const std::string& spec_json);
// Whether the spec holds env values in plain text.
bool spec_env_in_plain(const std::string& spec_json);

// The spec as the launch file carries it: "env" emptied, and "env_sha256"
// (see env_digest) when it had entries.
std::string spec_for_launch_file(const std::string& spec_json);
// SHA-256 (hex) of the entries, each followed by a NUL.
std::string env_digest(const std::vector<std::string>& env);
// The launch file's "env_sha256" of a spec ("" when it has none).
std::string launch_env_digest(const std::string& spec_json);

// A launch file written before: when its spec holds env values, it is
// signed again with the digest instead (same generation and nonce, so its
// supervisor's next hello is still accepted). A missing file is left alone.
// Returns whether it was rewritten. Throws Error.
bool strip_launch_file_env(const std::string& path, const SigningKey& key);

}  // namespace openshell::auth
