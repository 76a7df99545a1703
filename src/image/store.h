// The image store: images pulled or imported, kept under the state directory
// (see base/paths.h) so that sandboxes start from them without a network.
//
//   images/
//     lock                   flock: writers of images.json and layers/
//     active                 flock: shared by pulls and imports, exclusive for prune
//     images.json            name -> image record, replaced atomically
//     blobs/sha256/<hex>     manifests, configs and compressed layers,
//                            content-addressed, verified
//     layers/<hex>/root/     one unpacked layer per diff id (the sha256 of
//                            its uncompressed tar), an overlayfs lower dir,
//                            shared by every image and sandbox that uses it
//     layers/<hex>/info.json its size; written before the layer is committed
//     holds/<sandbox id>     the diff ids a sandbox's root is made of
//     tmp/<pid>.<random>/    work in progress; never referenced
//
// Nothing becomes visible before it is whole and verified: a layer is
// unpacked in tmp/ and renamed into layers/ only when its diff id matches
// the image config; an image's name is written last. A pull that fails or
// is killed leaves at most a tmp/ entry, removed by the next pull or prune.
// Layer blobs (the compressed tars) are kept beside their unpacked trees, so
// that push sends them as they came; records stored before that have none
// (push says so: pull or import the image again).
//
// Short names: "base" names localhost/base:latest when the store has it
// (images built or imported here without a registry get the "localhost"
// domain), else the default registry's (image/registries.h); with no default
// configured a short name finds only a local image.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"
#include "image/reference.h"

namespace openshell::image {

// The parts of an OCI image config that shape a sandbox.
struct ImageConfig {
  std::vector<std::string> env;  // KEY=VALUE
  std::vector<std::string> entrypoint;
  std::vector<std::string> cmd;
  std::string working_dir;
  std::string user;
  std::string os;
  std::string architecture;
  std::string variant;
  std::string created;  // RFC 3339, as the config says
};

struct ImageRecord {
  std::string name;                   // canonical reference, "registry.example/tools/busybox:1"
  std::string manifest_digest;        // "sha256:..."
  std::string config_digest;          // the image's id
  std::vector<std::string> diff_ids;  // layers, bottom first
  std::vector<uint64_t> layer_sizes;  // unpacked bytes of each
  std::string stored_at;              // RFC 3339 UTC
  std::string source;                 // "pull REF" or "import FILE"
  // Where a pull found it: "registry.example/tools/busybox" (domain and
  // repository); "" for images made or imported here. Push mounts its blobs
  // from there when pushing to the same registry.
  std::string origin;
  ImageConfig config;

  uint64_t size() const;
  std::string id() const { return config_digest; }
  std::string short_id() const { return config_digest.substr(7, 12); }
};

// The OCI config JSON -> ImageConfig (and its diff ids). Throws Error naming
// `what` on a malformed config.
ImageConfig parse_config(const std::string& json, const std::string& what,
                         std::vector<std::string>* diff_ids);

// Host's platform in OCI terms: "linux", "amd64" / "arm64" (variant "v8"), ...
struct Platform {
  std::string os = "linux";
  std::string architecture;
  std::string variant;
  std::string text() const;
};
Platform host_platform();
// "linux/arm64/v8" -> Platform; throws Error.
Platform parse_platform(std::string_view text);

class Store {
 public:
  // The store at dir (created when missing, mode 0700).
  explicit Store(std::string dir);

  const std::string& dir() const { return dir_; }
  // The layer's directory, and its root (what overlayfs stacks).
  std::string layer_dir(const std::string& diff_id) const;
  std::string layer_root(const std::string& diff_id) const { return layer_dir(diff_id) + "/root"; }
  bool has_layer(const std::string& diff_id) const;
  // Unpacked bytes of a stored layer (0 when unknown).
  uint64_t layer_size(const std::string& diff_id) const;
  std::string blob_path(const std::string& digest) const;
  bool has_blob(const std::string& digest) const;

  // Looks an image up by name (short names as above), by id or digest, or
  // by a prefix of 4 or more hex digits of its id.
  std::optional<ImageRecord> find(std::string_view text) const;
  std::vector<ImageRecord> list() const;

  // ---- writing ---------------------------------------------------------------

  // Held by pulls and imports for their whole run: prune waits for them.
  UniqueFd begin_work() const;
  // A fresh directory under tmp/ (and removes stale ones of dead processes).
  std::string make_temp_dir() const;

  // Moves a layer from tmp/ into layers/: temp_dir holds root/ (unpacked);
  // info.json is written here. An existing layer wins, and temp_dir is
  // removed.
  void commit_layer(const std::string& temp_dir, const std::string& diff_id, uint64_t size) const;
  // Writes a small blob (manifest, config); returns its digest.
  std::string put_blob(std::string_view bytes) const;
  // Moves the file at path (on the store's file system, e.g. in tmp/) into
  // blobs/ as `digest`, which the caller has verified; an existing blob
  // wins and path is removed.
  void keep_blob(const std::string& path, const std::string& digest) const;
  // Names an image; every layer and blob it names must be in the store.
  // Replaces what the name pointed at before.
  void put(const ImageRecord& record) const;

  // Removes names (any form find() takes; an id removes every name of that
  // image). Layers stay until prune. Returns what was removed; throws Error
  // for a name the store does not have.
  std::vector<ImageRecord> remove(std::string_view text) const;

  struct PruneResult {
    int layers = 0;
    int blobs = 0;
    int vm_disks = 0;
    uint64_t bytes = 0;
  };
  // Removes layers and blobs no image and no sandbox uses (an image uses its
  // manifest, its config and the layer blobs its manifest names), the
  // micro-VM disks of images no longer named, and leftovers in tmp/. Waits for pulls and imports in
  // progress.
  PruneResult prune() const;

  // A sandbox's root uses these layers: prune leaves them until release().
  // Throws Error when a layer is missing (pruned since the lookup).
  void hold(const std::string& sandbox_id, const std::vector<std::string>& diff_ids) const;
  void release(const std::string& sandbox_id) const;

 private:
  UniqueFd lock() const;  // exclusive flock on images/lock
  std::vector<ImageRecord> read_records() const;
  void write_records(const std::vector<ImageRecord>& records) const;

  std::string dir_;
};

// The file at `path` (relative) in the topmost of the layer roots (top
// first) that has it; "" when none has it, or a whiteout hides it. Read as
// files::read_in_root reads it from that layer: symlinks resolve inside the
// layer (a link that is the file itself is looked up in the layers again),
// a regular file only, at most 4 MiB (else Error).
std::string read_from_layers(const std::vector<std::string>& layer_roots_top_first,
                             const std::string& path);

// The name an image built or imported here gets from the user's text: as
// parse_reference, but a name without a registry gets "localhost".
Reference local_reference(std::string_view text);

}  // namespace openshell::image
