// Image references as Docker and the OCI distribution spec write them:
// [DOMAIN/]PATH[:TAG][@DIGEST].
//
//   localhost:5000/tools/x:1     -> localhost:5000/tools/x:1
//   registry.example/o/r@sha256: -> registry.example/o/r@sha256:...
//   busybox                      -> DEFAULT/[PREFIX/]busybox:latest
//
// The first component is a domain when it holds a "." or a ":" or is
// "localhost"; otherwise the name is short, and its registry is the
// configured default (image/registries.h), with the configured prefix on a
// one-component path. No default: a short name is refused. The store keys
// images by canonical(); messages and listings show familiar().
#pragma once

#include <string>
#include <string_view>

#include "image/registries.h"

namespace openshell::image {

struct Reference {
  std::string domain;       // "registry.example", "localhost:5000"
  std::string repository;   // "library/busybox"
  std::string tag;          // "latest"; empty only when a digest is given alone
  std::string digest;       // "" or "sha256:<hex>"
  bool short_name = false;  // the text named no registry ("busybox", "org/tool")

  // DOMAIN/REPOSITORY
  std::string name() const { return domain + "/" + repository; }
  // name[:tag][@digest]
  std::string canonical() const;
  // The short form: without the default registry (and its one-component
  // prefix) when that is this reference's: "busybox:latest",
  // "localhost:5000/x:1".
  std::string familiar() const { return familiar(registry_config()); }
  std::string familiar(const RegistryConfig& config) const;
  // Where the registry's API is: a configured location, else the domain.
  std::string registry_host() const { return registry_host(registry_config()); }
  std::string registry_host(const RegistryConfig& config) const;
  // Whether plain HTTP is the default: the registry's API (registry_host)
  // is on localhost, 127.0.0.0/8 or ::1.
  bool is_local_registry() const;
  // The tag, else the digest: what to ask the registry's manifest endpoint for.
  std::string manifest_key() const { return digest.empty() ? tag : digest; }
};

// Throws Error("image reference 'TEXT': reason"); a short name with no
// default registry configured is refused with the two ways to fix it.
Reference parse_reference(std::string_view text, const RegistryConfig& config);
inline Reference parse_reference(std::string_view text) {
  return parse_reference(text, registry_config());
}

// The text as written, a short name left without a domain (domain "",
// short_name true, no prefix added): for names that resolve elsewhere
// (store.h local_reference). Throws as parse_reference.
Reference parse_reference_text(std::string_view text);

}  // namespace openshell::image
