// Image references as Docker and the OCI distribution spec write them:
// [DOMAIN/]PATH[:TAG][@DIGEST].
//
//   busybox                   -> docker.io/library/busybox:latest
//   localhost:5000/tools/x:1  -> localhost:5000/tools/x:1
//   ghcr.io/o/r@sha256:...    -> ghcr.io/o/r@sha256:...
//
// The first component is a domain when it holds a "." or a ":" or is
// "localhost"; otherwise the domain is docker.io, and a one-component path
// there gets "library/". The store keys images by canonical(); messages and
// listings show familiar().
#pragma once

#include <string>
#include <string_view>

namespace openshell::image {

struct Reference {
  std::string domain;       // "docker.io", "localhost:5000"
  std::string repository;   // "library/busybox"
  std::string tag;          // "latest"; empty only when a digest is given alone
  std::string digest;       // "" or "sha256:<hex>"
  bool short_name = false;  // the text named no registry ("busybox", "org/tool")

  // DOMAIN/REPOSITORY
  std::string name() const { return domain + "/" + repository; }
  // name[:tag][@digest]
  std::string canonical() const;
  // Docker's short form: "busybox:latest", "localhost:5000/x:1".
  std::string familiar() const;
  // Where the registry API is: docker.io's is registry-1.docker.io.
  std::string registry_host() const;
  // Whether plain HTTP is the default (localhost, 127.0.0.0/8, ::1).
  bool is_local_registry() const;
  // The tag, else the digest: what to ask the registry's manifest endpoint for.
  std::string manifest_key() const { return digest.empty() ? tag : digest; }
};

// Throws Error("image reference 'TEXT': reason").
Reference parse_reference(std::string_view text);

}  // namespace openshell::image
