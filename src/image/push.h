// Sending a store image to a registry (`openshell image push`): its layer
// blobs as the store keeps them (never recompressed, so the digests stay),
// its config, then its manifest under the tag.
//
// For each blob: a HEAD first (a blob the repository has is not sent);
// else, where the store knows a repository of the same registry that has
// the image (ImageRecord::origin: where it was pulled from or last pushed
// to), a cross-repository mount; else an upload in chunks. After a push the
// record's origin is the repository pushed to.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "image/reference.h"
#include "image/store.h"

namespace openshell::image {

// What a push reports on its way (one thread).
class PushProgress {
 public:
  virtual ~PushProgress() = default;
  virtual void start(const std::string& /*image*/, size_t /*blobs*/, uint64_t /*bytes*/) {}
  // Bytes of one blob sent so far (index: the layer's, config last).
  virtual void advance(size_t /*index*/, uint64_t /*bytes*/) {}
  // One blob is in the repository: "exists", "mounted" or "uploaded".
  virtual void blob_done(size_t /*index*/, const std::string& /*digest*/, uint64_t /*size*/,
                         const std::string& /*how*/) {}
  virtual void finish() {}
};

struct PushOptions {
  bool insecure = false;  // plain HTTP to this registry (local ones use it anyway)
  int attempts = 4;
  PushProgress* progress = nullptr;
};

struct PushResult {
  std::string reference;  // canonical, with its tag
  std::string manifest_digest;
  std::string config_digest;
  struct Blob {
    std::string digest;
    uint64_t size = 0;
    std::string how;  // "exists", "mounted", "uploaded"
  };
  std::vector<Blob> layers;
  Blob config;
};

// Pushes the image to dest (a tag; not a digest). Throws Error (one line,
// naming the registry and the object) when the registry fails, and when the
// store lacks a layer blob of the image (stored before blobs were kept:
// pull or import it again).
PushResult push(const Store& store, const ImageRecord& image, const Reference& dest,
                const PushOptions& options);

}  // namespace openshell::image
