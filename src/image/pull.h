// Bringing images into the store: from a registry (pull), or from a file
// (import: an OCI image layout, as a directory or a tar archive, or a
// `docker save` archive). Both verify every digest, unpack each layer the
// store lacks once, and name the image only when all of it is in place.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "image/store.h"

namespace openshell::image {

// What a pull or import reports on its way (from several threads: calls are
// serialised by the caller of these functions, never concurrent).
class Progress {
 public:
  virtual ~Progress() = default;
  // The image's layers are known: `missing` of them need fetching, of
  // `bytes` (compressed) together.
  virtual void start(const std::string& /*image*/, size_t /*layers*/, size_t /*missing*/,
                     uint64_t /*bytes*/) {}
  // Bytes of compressed layer data read so far, all layers together.
  virtual void advance(uint64_t /*bytes*/) {}
  // One layer is unpacked and stored.
  virtual void layer_done(const std::string& /*diff_id*/, uint64_t /*size*/) {}
  virtual void finish() {}
};

struct PullOptions {
  bool insecure = false;             // plain HTTP to this registry
  std::optional<Platform> platform;  // default: the host's
  Progress* progress = nullptr;
  int jobs = 3;      // layers fetched at once
  int attempts = 4;  // per request, for transient failures
  // The most the image may unpack to, in bytes (see image/budget.h); 0:
  // OPENSHELL_MAX_UNPACKED when set, else min(32 GiB, 90% of the store's
  // free space).
  uint64_t max_unpacked = 0;
};

// Pulls ref into the store and names it ref.canonical(). Throws Error (one
// line: what failed, at which registry).
ImageRecord pull(const Store& store, const Reference& ref, const PullOptions& options);

struct ImportOptions {
  std::string name;  // what to call it; default: the name the archive gives
  std::optional<Platform> platform;
  Progress* progress = nullptr;
  uint64_t max_unpacked = 0;  // as PullOptions::max_unpacked
};

// Imports an OCI image layout (directory or tar) or a docker save archive
// (tar, possibly gzip/zstd/xz-compressed). Throws Error.
ImageRecord import_image(const Store& store, const std::string& path, const ImportOptions& options);

}  // namespace openshell::image
