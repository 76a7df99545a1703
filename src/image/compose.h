// Making images in the store from parts: a layer written from directories
// (image/layer_writer.h), and a new image of a base (or none) plus such
// layers and config edits. What `image build` and `sandbox commit` store.
//
// A layer is kept twice, as every pulled one is: its gzip blob in
// blobs/sha256/ (what push sends) and unpacked in layers/<diff id>/ (what
// sandboxes stack). The unpacked tree is made by unpacking the blob just
// written with the verified unpacker, so it is exactly what a pull of the
// pushed image would make.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "image/layer_writer.h"
#include "image/store.h"

namespace openshell::image {

// Writes the sources as a layer into the store (blob and unpacked tree).
// Throws Error naming `what`. Hold store.begin_work() from the first
// add_layer to put_image: prune waits for it, and would otherwise remove
// layers no image names yet.
LayerBlob add_layer(const Store& store, const std::vector<LayerSource>& sources,
                    const LayerWriteOptions& options, const std::string& what);

// A gzip layer blob written elsewhere (a file in the store's tmp/, e.g. by
// write_layer in a helper process) into the store: unpacked with the
// verified unpacker, its digests taken from that pass, then kept. The file
// is moved into blobs/. Throws Error naming `what`.
LayerBlob store_layer_blob(const Store& store, const std::string& blob_path,
                           const std::string& what);

// One entry of the config's history (OCI image spec): a step that made a
// layer, or only changed the config (empty_layer).
struct HistoryEntry {
  std::string created;  // RFC 3339; "" = the image's created time
  std::string created_by;
  std::string comment;
  std::string author;
  bool empty_layer = false;
};

// What the new image's config changes from its base's. Unset fields keep
// the base's value.
struct ConfigEdits {
  std::vector<std::string> env;  // KEY=VALUE, each replacing the base's KEY or added
  std::optional<std::vector<std::string>> entrypoint;
  std::optional<std::vector<std::string>> cmd;
  std::optional<std::string> working_dir;
  std::optional<std::string> user;
  std::map<std::string, std::string> labels;  // added or replaced
  std::vector<std::string> exposed_ports;     // "8080/tcp", added
  std::optional<std::string> author;
};

struct NewImage {
  std::string name;                 // canonical reference (local_reference(...).canonical())
  std::optional<ImageRecord> base;  // none: from scratch, for the host's platform
  std::vector<LayerBlob> layers;    // made by add_layer, bottom first, above the base's
  // Appended to the base's history; one entry with empty_layer false per
  // layer, in order. When it has none, one entry per layer is made.
  std::vector<HistoryEntry> history;
  ConfigEdits edits;
  std::string created;  // RFC 3339; "" = now
  std::string source;   // ImageRecord::source, e.g. "commit sandbox NAME"
};

// The OCI config JSON of the new image (the base's own JSON, unknown fields
// kept, with the edits, the history and rootfs.diff_ids appended). Pure:
// `base_config_json` is "" for scratch.
std::string compose_config(const std::string& base_config_json, const NewImage& image,
                           const std::string& created);

// Writes the config and an OCI manifest (the base's layers as its manifest
// names them, then the new gzip layers) as blobs, and names the image last.
// Throws Error when a layer or the base's manifest is not in the store.
ImageRecord put_image(const Store& store, const NewImage& image);

}  // namespace openshell::image
