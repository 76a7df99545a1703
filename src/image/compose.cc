#include "image/compose.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/time.h"
#include "base/unique_fd.h"
#include "image/digest.h"
#include "image/manifest.h"
#include "image/unpack.h"

namespace openshell::image {

using nlohmann::json;

namespace {

// A tmp/ directory removed however the work ends.
class Scratch {
 public:
  explicit Scratch(const Store& store) : path_(store.make_temp_dir()) {}
  ~Scratch() {
    try {
      if (files::exists(path_)) files::remove_tree(path_);
    } catch (const Error&) {
      // prune removes what is left
    }
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string env_key(const std::string& entry) { return entry.substr(0, entry.find('=')); }

json history_json(const HistoryEntry& h, const std::string& created) {
  json j = json::object();
  j["created"] = h.created.empty() ? created : h.created;
  if (!h.created_by.empty()) j["created_by"] = h.created_by;
  if (!h.comment.empty()) j["comment"] = h.comment;
  if (!h.author.empty()) j["author"] = h.author;
  if (h.empty_layer) j["empty_layer"] = true;
  return j;
}

// The same bytes under the OCI name for them.
std::string oci_layer_type(const std::string& type) {
  if (type == media_type::kDockerLayer) return std::string(media_type::kOciLayerGzip);
  if (type == "application/vnd.docker.image.rootfs.diff.tar")
    return std::string(media_type::kOciLayer);
  return type;
}

}  // namespace

LayerBlob store_layer_blob(const Store& store, const std::string& blob_path,
                           const std::string& what) {
  Scratch scratch(store);
  const std::string work = scratch.path() + "/layer";
  const std::string root = work + "/root";
  if (::mkdir(work.c_str(), 0700) != 0) throw_errno("create " + work);
  if (::mkdir(root.c_str(), 0755) != 0) throw_errno("create " + root);
  UniqueFd in(::open(blob_path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) throw_errno("open " + blob_path);
  UnpackResult unpacked = unpack_layer(in.get(), root, UnpackOptions{}, what);
  in.reset();
  LayerBlob blob;
  blob.diff_id = unpacked.diff_id;
  blob.digest = unpacked.compressed_digest;
  blob.size = unpacked.compressed_size;
  blob.content_bytes = unpacked.content_bytes;
  blob.entries = unpacked.entries;
  if (!store.has_layer(blob.diff_id)) store.commit_layer(work, blob.diff_id, blob.content_bytes);
  store.keep_blob(blob_path, blob.digest);
  return blob;
}

LayerBlob add_layer(const Store& store, const std::vector<LayerSource>& sources,
                    const LayerWriteOptions& options, const std::string& what) {
  Scratch scratch(store);
  const std::string blob_path = scratch.path() + "/blob";
  LayerBlob written;
  {
    UniqueFd out(::open(blob_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!out) throw_errno("create " + blob_path);
    written = write_layer(sources, out.get(), options, what);
    if (::fsync(out.get()) != 0) throw_errno("write " + blob_path);
  }
  LayerBlob stored = store_layer_blob(store, blob_path, what);
  if (stored.diff_id != written.diff_id || stored.digest != written.digest)
    throw Error(what + ": the layer written does not read back the same");
  stored.tar_size = written.tar_size;
  return stored;
}

std::string compose_config(const std::string& base_config_json, const NewImage& image,
                           const std::string& created) {
  json j;
  if (base_config_json.empty()) {
    const Platform p = host_platform();
    j = {{"architecture", p.architecture},
         {"os", p.os},
         {"config", json::object()},
         {"rootfs", {{"type", "layers"}, {"diff_ids", json::array()}}}};
    if (!p.variant.empty()) j["variant"] = p.variant;
  } else {
    j = json::parse(base_config_json, nullptr, false);
    if (j.is_discarded() || !j.is_object()) throw Error("base image config: not a JSON object");
  }
  j["created"] = created;
  const ConfigEdits& e = image.edits;
  if (e.author) j["author"] = *e.author;
  if (!j.contains("config") || !j["config"].is_object()) j["config"] = json::object();
  json& c = j["config"];
  if (!e.env.empty()) {
    std::vector<std::string> env;
    if (c.contains("Env") && c["Env"].is_array()) env = c["Env"].get<std::vector<std::string>>();
    for (const auto& entry : e.env) {
      bool replaced = false;
      for (auto& old : env)
        if (env_key(old) == env_key(entry)) old = entry, replaced = true;
      if (!replaced) env.push_back(entry);
    }
    c["Env"] = env;
  }
  if (e.entrypoint) c["Entrypoint"] = *e.entrypoint;
  if (e.cmd) c["Cmd"] = *e.cmd;
  if (e.working_dir) c["WorkingDir"] = *e.working_dir;
  if (e.user) c["User"] = *e.user;
  if (!e.labels.empty()) {
    if (!c.contains("Labels") || !c["Labels"].is_object()) c["Labels"] = json::object();
    for (const auto& [k, v] : e.labels) c["Labels"][k] = v;
  }
  if (!e.exposed_ports.empty()) {
    if (!c.contains("ExposedPorts") || !c["ExposedPorts"].is_object())
      c["ExposedPorts"] = json::object();
    for (const auto& port : e.exposed_ports) c["ExposedPorts"][port] = json::object();
  }
  if (!j.contains("rootfs") || !j["rootfs"].is_object())
    j["rootfs"] = {{"type", "layers"}, {"diff_ids", json::array()}};
  for (const auto& layer : image.layers) j["rootfs"]["diff_ids"].push_back(layer.diff_id);
  if (!j.contains("history") || !j["history"].is_array()) j["history"] = json::array();
  if (image.history.empty())
    for (size_t i = 0; i < image.layers.size(); ++i)
      j["history"].push_back(history_json(HistoryEntry{}, created));
  for (const auto& h : image.history) j["history"].push_back(history_json(h, created));
  return j.dump();
}

ImageRecord put_image(const Store& store, const NewImage& image) {
  const std::string created =
      image.created.empty() ? time::format_ns(time::now_ns()) : image.created;
  std::vector<Descriptor> layers;
  std::string base_config;
  if (image.base) {
    const std::string what = "base image " + image.base->name;
    auto manifest = files::try_read(store.blob_path(image.base->manifest_digest));
    auto config = files::try_read(store.blob_path(image.base->config_digest));
    if (!manifest || !config) throw Error(what + ": its manifest or config is not in the store");
    for (auto d : parse_manifest(*manifest, what).layers) {
      d.media_type = oci_layer_type(d.media_type);
      layers.push_back(std::move(d));
    }
    base_config = *config;
  }
  for (const auto& l : image.layers) {
    if (!store.has_layer(l.diff_id) || !store.has_blob(l.digest))
      throw Error("image " + image.name + ": layer " + l.diff_id + " is not in the store");
    Descriptor d;
    d.media_type = std::string(media_type::kOciLayerGzip);
    d.digest = l.digest;
    d.size = static_cast<int64_t>(l.size);
    layers.push_back(std::move(d));
  }
  const std::string config_json = compose_config(base_config, image, created);
  std::vector<std::string> diff_ids;
  ImageConfig config = parse_config(config_json, "image " + image.name + ": config", &diff_ids);
  if (diff_ids.size() != layers.size())
    throw Error("image " + image.name + ": its base's config and manifest disagree on its layers");
  Descriptor config_desc;
  config_desc.media_type = std::string(media_type::kOciConfig);
  config_desc.digest = store.put_blob(config_json);
  config_desc.size = static_cast<int64_t>(config_json.size());

  ImageRecord record;
  record.name = image.name;
  record.config_digest = config_desc.digest;
  record.manifest_digest = store.put_blob(make_manifest(config_desc, layers));
  record.diff_ids = diff_ids;
  for (const auto& d : diff_ids) record.layer_sizes.push_back(store.layer_size(d));
  record.stored_at = time::format_ns(time::now_ns());
  record.source = image.source;
  record.config = config;
  store.put(record);
  return record;
}

}  // namespace openshell::image
