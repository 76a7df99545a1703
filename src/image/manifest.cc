#include "image/manifest.h"

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "image/digest.h"

namespace openshell::image {

using nlohmann::json;

namespace {

json parse_object(const std::string& text, const std::string& what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(what + ": not a JSON object");
  return j;
}

Descriptor parse_descriptor(const json& j, const std::string& what) {
  if (!j.is_object()) throw Error(what + ": a descriptor is not an object");
  Descriptor d;
  try {
    d.media_type = j.value("mediaType", "");
    d.digest = j.at("digest").get<std::string>();
    d.size = j.at("size").get<int64_t>();
    if (j.contains("platform") && j["platform"].is_object()) {
      const json& p = j["platform"];
      d.platform.os = p.value("os", "");
      d.platform.architecture = p.value("architecture", "");
      d.platform.variant = p.value("variant", "");
    } else {
      d.platform.os.clear();
    }
    if (j.contains("annotations") && j["annotations"].is_object())
      for (const auto& [k, v] : j["annotations"].items())
        if (v.is_string()) d.annotations[k] = v.get<std::string>();
  } catch (const json::exception&) {
    throw Error(what + ": a descriptor lacks a digest or size");
  }
  if (!is_digest(d.digest))
    throw Error(what + ": digest '" + d.digest.substr(0, 80) +
                "' is not sha256 (the only algorithm supported)");
  if (d.size < 0) throw Error(what + ": descriptor " + d.digest + " has a negative size");
  return d;
}

}  // namespace

bool is_index(const std::string& text, std::string_view content_type, const std::string& what) {
  json j = parse_object(text, what);
  if (j.value("schemaVersion", 0) == 1 ||
      content_type.find("v1+prettyjws") != std::string_view::npos ||
      content_type == "application/vnd.docker.distribution.manifest.v1+json")
    throw Error(
        what +
        ": Docker manifest schema 1 is not supported (push the image again with a current tool)");
  std::string type = j.value("mediaType", "");
  if (type.empty()) type = std::string(content_type.substr(0, content_type.find(';')));
  if (type == media_type::kOciIndex || type == media_type::kDockerList) return true;
  if (type == media_type::kOciManifest || type == media_type::kDockerManifest) return false;
  if (j.contains("manifests")) return true;
  if (j.contains("layers") && j.contains("config")) return false;
  throw Error(what + ": neither an image manifest nor an index" +
              (type.empty() ? "" : " (" + type + ")"));
}

Index parse_index(const std::string& text, const std::string& what) {
  json j = parse_object(text, what);
  Index index;
  index.media_type = j.value("mediaType", "");
  if (!j.contains("manifests") || !j["manifests"].is_array())
    throw Error(what + ": no manifests list");
  for (const auto& m : j["manifests"]) index.manifests.push_back(parse_descriptor(m, what));
  return index;
}

Manifest parse_manifest(const std::string& text, const std::string& what) {
  json j = parse_object(text, what);
  Manifest m;
  m.media_type = j.value("mediaType", "");
  if (!j.contains("config")) throw Error(what + ": no config");
  m.config = parse_descriptor(j["config"], what);
  if (!j.contains("layers") || !j["layers"].is_array()) throw Error(what + ": no layers list");
  for (const auto& l : j["layers"]) {
    Descriptor d = parse_descriptor(l, what);
    const std::string& t = d.media_type;
    if (t.find("foreign") != std::string::npos || t.find("nondistributable") != std::string::npos)
      throw Error(what + ": layer " + d.digest + " is a foreign layer (" + t +
                  "), which is not supported");
    if (!(t.empty() || t == media_type::kOciLayer || t == media_type::kOciLayerGzip ||
          t == media_type::kOciLayerZstd || t == media_type::kDockerLayer ||
          t == "application/vnd.docker.image.rootfs.diff.tar"))
      throw Error(what + ": layer " + d.digest + " has media type " + t + ", not a tar layer");
    m.layers.push_back(std::move(d));
  }
  return m;
}

const Descriptor& select_platform(const Index& index, const Platform& want,
                                  const std::string& what) {
  const Descriptor* loose = nullptr;
  std::string available;
  for (const auto& d : index.manifests) {
    const Platform& p = d.platform;
    if (p.os == "unknown" || d.annotations.count("vnd.docker.reference.type"))
      continue;  // attestations
    if (!p.os.empty()) available += (available.empty() ? "" : ", ") + p.text();
    if (p.os != want.os || p.architecture != want.architecture) continue;
    if (p.variant == want.variant) return d;
    if (p.variant.empty() || want.variant.empty()) loose = loose ? loose : &d;
  }
  if (loose) return *loose;
  // An index of one manifest without platforms (an OCI layout) serves anyone.
  if (index.manifests.size() == 1 && index.manifests[0].platform.os.empty())
    return index.manifests[0];
  throw Error(what + ": no image for " + want.text() +
              (available.empty() ? "" : " (it has " + available + ")"));
}

std::string make_manifest(const Descriptor& config, const std::vector<Descriptor>& layers) {
  json ls = json::array();
  for (const auto& l : layers)
    ls.push_back({{"mediaType", l.media_type}, {"digest", l.digest}, {"size", l.size}});
  json j = {{"schemaVersion", 2},
            {"mediaType", media_type::kOciManifest},
            {"config",
             {{"mediaType", config.media_type}, {"digest", config.digest}, {"size", config.size}}},
            {"layers", ls}};
  return j.dump();
}

}  // namespace openshell::image
