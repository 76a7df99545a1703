// SHA-256 digests in the OCI form "sha256:<64 lowercase hex>".
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace openshell::image {

// Incremental SHA-256 (OpenSSL's EVP).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t size);
  void update(std::string_view data) { update(data.data(), data.size()); }
  // "sha256:<hex>"; the object may not be updated afterwards.
  std::string digest();
  uint64_t bytes() const { return bytes_; }

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
  uint64_t bytes_ = 0;
};

// "sha256:<hex>" of data.
std::string sha256_digest(std::string_view data);

// Whether text is "sha256:" followed by 64 lowercase hex digits (the only
// algorithm accepted).
bool is_digest(std::string_view text);

// The hex part of a valid digest; throws Error naming `what` otherwise.
std::string digest_hex(std::string_view digest, const std::string& what);

}  // namespace openshell::image
