// OCI image manifests and indexes (and Docker's schema 2 equivalents): the
// JSON that says which config and layers make an image, and which image
// serves which platform.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "image/store.h"

namespace openshell::image {

namespace media_type {
inline constexpr std::string_view kOciIndex = "application/vnd.oci.image.index.v1+json";
inline constexpr std::string_view kOciManifest = "application/vnd.oci.image.manifest.v1+json";
inline constexpr std::string_view kOciConfig = "application/vnd.oci.image.config.v1+json";
inline constexpr std::string_view kOciLayer = "application/vnd.oci.image.layer.v1.tar";
inline constexpr std::string_view kOciLayerGzip = "application/vnd.oci.image.layer.v1.tar+gzip";
inline constexpr std::string_view kOciLayerZstd = "application/vnd.oci.image.layer.v1.tar+zstd";
inline constexpr std::string_view kDockerList =
    "application/vnd.docker.distribution.manifest.list.v2+json";
inline constexpr std::string_view kDockerManifest =
    "application/vnd.docker.distribution.manifest.v2+json";
inline constexpr std::string_view kDockerConfig = "application/vnd.docker.container.image.v1+json";
inline constexpr std::string_view kDockerLayer =
    "application/vnd.docker.image.rootfs.diff.tar.gzip";
}  // namespace media_type

struct Descriptor {
  std::string media_type;
  std::string digest;
  int64_t size = -1;
  Platform platform;  // index entries only (empty fields elsewhere)
  std::map<std::string, std::string> annotations;
};

struct Manifest {
  std::string media_type;
  Descriptor config;
  std::vector<Descriptor> layers;
};

struct Index {
  std::string media_type;
  std::vector<Descriptor> manifests;
};

// Whether the JSON is an index (or manifest list) rather than a manifest:
// its mediaType field, else the content type it came with, else its shape.
// Throws Error for anything else (Docker schema 1 included) naming `what`.
bool is_index(const std::string& json, std::string_view content_type, const std::string& what);

Index parse_index(const std::string& json, const std::string& what);
// Checks the layers' media types (tar, gzip, zstd; foreign layers refused).
Manifest parse_manifest(const std::string& json, const std::string& what);

// The index entry for the platform: os and architecture must match; a
// variant, when both name one, too. Attestation entries are skipped. Throws
// Error listing the platforms the index has.
const Descriptor& select_platform(const Index& index, const Platform& want,
                                  const std::string& what);

// A minimal OCI manifest for a config and layers (for images that came
// without one: docker save archives).
std::string make_manifest(const Descriptor& config, const std::vector<Descriptor>& layers);

}  // namespace openshell::image
