#include "image/push.h"

#include <sys/stat.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "image/digest.h"
#include "image/manifest.h"
#include "image/registry.h"

namespace openshell::image {

namespace {

uint64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// The repository of dest's registry that already holds the image, if the
// store knows one ("" when none, or when it is dest itself).
std::string mount_source(const ImageRecord& image, const Reference& dest) {
  const std::string prefix = dest.domain + "/";
  if (image.origin.compare(0, prefix.size(), prefix) != 0) return "";
  const std::string repository = image.origin.substr(prefix.size());
  return repository == dest.repository ? "" : repository;
}

}  // namespace

PushResult push(const Store& store, const ImageRecord& image, const Reference& dest,
                const PushOptions& options) {
  const std::string target = dest.familiar();
  if (!dest.digest.empty())
    throw Error("push to " + target + ": give a tag, not a digest (the registry computes it)");
  const std::string what = "image " + parse_reference(image.name).familiar();
  auto manifest_json = files::try_read(store.blob_path(image.manifest_digest));
  auto config_json = files::try_read(store.blob_path(image.config_digest));
  if (!manifest_json || !config_json)
    throw Error(what + ": its manifest or config is not in the store: pull or import it again");
  const Manifest manifest = parse_manifest(*manifest_json, what);
  std::string media_type = manifest.media_type;
  if (media_type.empty()) media_type = std::string(media_type::kOciManifest);

  PushResult result;
  uint64_t bytes = config_json->size();
  for (const auto& layer : manifest.layers) {
    if (!store.has_blob(layer.digest))
      throw Error(what + ": layer blob " + layer.digest +
                  " is not in the store (the image was stored before layer blobs were kept): "
                  "pull or import it again");
    bytes += file_size(store.blob_path(layer.digest));
  }
  PushProgress none;
  PushProgress& progress = options.progress ? *options.progress : none;
  progress.start(target, manifest.layers.size() + 1, bytes);

  RegistryOptions registry_options;
  registry_options.insecure = options.insecure;
  registry_options.attempts = options.attempts;
  RegistryClient client(dest, registry_options);
  const std::string from = mount_source(image, dest);
  for (size_t i = 0; i < manifest.layers.size(); ++i) {
    const std::string& digest = manifest.layers[i].digest;
    const std::string path = store.blob_path(digest);
    PushResult::Blob blob{digest, file_size(path), "exists"};
    if (!client.has_blob(digest)) {
      auto how = client.push_blob(path, digest, blob.size, from,
                                  [&, i](uint64_t done) { progress.advance(i, done); });
      blob.how = how == RegistryClient::BlobPush::kMounted ? "mounted" : "uploaded";
    }
    progress.blob_done(i, digest, blob.size, blob.how);
    result.layers.push_back(blob);
  }
  result.config = {image.config_digest, config_json->size(), "exists"};
  if (!client.has_blob(image.config_digest)) {
    client.push_blob_bytes(*config_json, image.config_digest);
    result.config.how = "uploaded";
  }
  progress.blob_done(manifest.layers.size(), image.config_digest, config_json->size(),
                     result.config.how);
  client.push_manifest(dest.tag.empty() ? "latest" : dest.tag, *manifest_json, media_type);
  progress.finish();

  result.reference = dest.canonical();
  result.manifest_digest = image.manifest_digest;
  result.config_digest = image.config_digest;
  // The registry now holds it: a later push there mounts from here.
  ImageRecord updated = image;
  updated.origin = dest.name();
  try {
    auto now = store.find(image.name);
    if (now && now->config_digest == image.config_digest) store.put(updated);
  } catch (const Error&) {
    // Removed meanwhile: nothing to remember it by.
  }
  return result;
}

}  // namespace openshell::image
