// A client for OCI distribution registries (the Docker Registry HTTP API v2):
// manifests and blobs, pulled anonymously.
//
// Transport: HTTP/1.1 over TCP, or TLS with the system's CAs (OpenSSL's
// default verify paths, which honour SSL_CERT_FILE and SSL_CERT_DIR, and the
// distribution's CA bundle), the server's name checked against its
// certificate. Plain HTTP only for local registries (localhost, 127.0.0.0/8,
// ::1) and those marked insecure. Host names resolve through
// net::dns::Resolver (the hosts file, then the nameservers), never glibc.
//
// Pushing (image/push.h) uses the same client: HEAD of a blob, a
// cross-repository mount, an upload in chunks (POST, PATCH with
// Content-Range, PUT ?digest=), a manifest PUT.
//
// Authentication: the anonymous bearer-token flow only (a 401 with a Bearer
// challenge, a token from its realm, the request again with the token).
// Credentials (docker login, Basic auth, credential helpers) are not
// supported: a registry that refuses anonymous pulls is an error.
//
// Each network step (resolve, connect, TLS handshake, each read and write)
// has a deadline; failures that may pass (network errors, timeouts, broken
// transfers, 429 and 5xx answers) are retried with a growing delay. Errors
// are RegistryError, one line naming the registry and the object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/error.h"
#include "image/reference.h"

namespace openshell::image {

inline constexpr char kMediaTypeOciIndex[] = "application/vnd.oci.image.index.v1+json";
inline constexpr char kMediaTypeOciManifest[] = "application/vnd.oci.image.manifest.v1+json";
inline constexpr char kMediaTypeDockerManifestList[] =
    "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr char kMediaTypeDockerManifest[] =
    "application/vnd.docker.distribution.manifest.v2+json";

inline constexpr size_t kMaxManifestBytes = 4u << 20;

struct RegistryOptions {
  // Plain HTTP to this registry (and redirects from HTTPS to HTTP allowed).
  // Local registries use plain HTTP anyway; all others use HTTPS.
  bool insecure = false;
  // Tries per request, for failures that may pass.
  int attempts = 4;
  // The delay before the second try, doubled for each further one, at most
  // 4 s. A Retry-After (in seconds) on a 429 or 503 replaces it, up to 30 s.
  int backoff_ms = 250;
  // The deadline of each network step.
  int timeout_ms = 30000;
  // Empty: "openshell/<version>".
  std::string user_agent;
};

class RegistryError : public Error {
 public:
  // status: the HTTP status of the registry's final answer (404, 401, 500...),
  // 0 when the failure was not an HTTP error (network, TLS, digest, limits).
  RegistryError(const std::string& message, int status) : Error(message), status(status) {}
  int status;
};

// One registry repository (the reference's registry and repository; its tag
// and digest are not used). Not thread-safe; keeps one open connection per
// host between requests, and the bearer token for its lifetime.
class RegistryClient {
 public:
  explicit RegistryClient(Reference ref, RegistryOptions options = {});
  ~RegistryClient();
  RegistryClient(const RegistryClient&) = delete;
  RegistryClient& operator=(const RegistryClient&) = delete;

  struct Manifest {
    std::string media_type;  // the Content-Type, else the body's "mediaType"
    std::string body;
    std::string digest;  // "sha256:<hex>" of body
  };

  // The manifest or index for a tag or a digest, asking for OCI indexes and
  // manifests and Docker manifest lists and v2 manifests. At most
  // kMaxManifestBytes. Checks the body against the digest asked for, and
  // against the registry's Docker-Content-Digest when that is a sha256 digest.
  Manifest manifest(const std::string& tag_or_digest);

  // A small blob (a config) in memory: at most max bytes, digest checked.
  std::string blob(const std::string& digest, size_t max);

  // A blob streamed into path, a new file (O_EXCL, mode 0600); its size
  // (when size >= 0) and digest are checked while it is written, and
  // progress gets the bytes written so far. A transfer that breaks is
  // resumed with a Range request when the server accepts byte ranges, else
  // started again. On failure the file is removed and RegistryError thrown
  // (also when path exists, which is then left alone).
  void blob_to_file(const std::string& digest, int64_t size, const std::string& path,
                    const std::function<void(uint64_t)>& progress);

  // ---- pushing to the reference's repository (tokens ask for pull,push) ----

  // Whether the repository has the blob (HEAD: 200 yes, 404 no).
  bool has_blob(const std::string& digest);
  enum class BlobPush { kUploaded, kMounted };
  // Sends the file (size bytes, whose digest the caller knows) as a blob, in
  // chunks; with mount_from (a repository of the same registry), asks the
  // registry to mount it from there first, and uploads only when it does
  // not. A failed try starts again from the beginning, up to `attempts`.
  BlobPush push_blob(const std::string& path, const std::string& digest, uint64_t size,
                     const std::string& mount_from, const std::function<void(uint64_t)>& progress);
  // A small blob (a config) from memory.
  void push_blob_bytes(const std::string& bytes, const std::string& digest);
  // PUTs a manifest under tag with its media type; checks the registry's
  // Docker-Content-Digest against the body's.
  void push_manifest(const std::string& tag, const std::string& body,
                     const std::string& media_type);

  // The client's state; its definition is private to src/image.
  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace openshell::image
