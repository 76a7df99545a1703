// osh-fake-registry: serves an OCI image layout as a registry (the Docker
// Registry HTTP API v2, pull only) on 127.0.0.1, for end-to-end tests of the
// command line, and misbehaves on request.
//
//   osh-fake-registry --layout DIR --port-file FILE [--mode MODE] [--token] [--verbose]
//
// Every repository name serves the one layout; its tags are the
// "org.opencontainers.image.ref.name" annotations in DIR/index.json. The port
// goes into FILE (written whole, by rename) once the server listens; SIGTERM
// or SIGINT stops it. GET and HEAD of manifests, blobs (with Range: bytes=N-
// and N-M) and tags/list.
//
// MODE:
//   ok             behave
//   wrong-digest   layer blobs come with one byte flipped
//   truncate       layer blobs stop halfway and the connection closes
//   truncate-once  like truncate, the first time each layer is asked for
//   500            every request answers 500
//   500-once       each path answers 500 the first time, then works
//   429            every request answers 429 with Retry-After: 1
//   401            every request answers 401 with a Basic challenge
//   404-blobs      manifests work, blobs answer 404
// --token: requests need the bearer token that /token hands out (the
// anonymous token flow of Docker Hub and most registries).

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "../fake_http_server.h"
#include "image/digest.h"

namespace {

using json = nlohmann::json;
using openshell::testing::FakeHttpServer;
using openshell::testing::FakeReply;
using openshell::testing::FakeRequest;

constexpr char kToken[] = "osh-fake-registry-token";
constexpr char kService[] = "osh-fake-registry";
constexpr char kOciManifest[] = "application/vnd.oci.image.manifest.v1+json";
const std::set<std::string> kModes = {"ok",       "wrong-digest", "truncate", "truncate-once",
                                      "500",      "500-once",     "429",      "401",
                                      "404-blobs"};

struct Options {
  std::string layout;
  std::string port_file;
  std::string mode = "ok";
  bool token = false;
  bool verbose = false;
};

[[noreturn]] void usage(const std::string& problem) {
  std::fprintf(stderr,
               "osh-fake-registry: %s\n"
               "usage: osh-fake-registry --layout DIR --port-file FILE [--mode MODE] [--token] "
               "[--verbose]\n",
               problem.c_str());
  std::exit(2);
}

Options parse_options(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--layout")
      options.layout = value();
    else if (arg == "--port-file")
      options.port_file = value();
    else if (arg == "--mode")
      options.mode = value();
    else if (arg == "--token")
      options.token = true;
    else if (arg == "--verbose" || arg == "-v")
      options.verbose = true;
    else
      usage("unknown argument " + arg);
  }
  if (options.layout.empty() || options.port_file.empty())
    usage("--layout and --port-file are required");
  if (!kModes.count(options.mode)) usage("unknown mode " + options.mode);
  return options;
}

std::string read_whole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

bool is_index(const std::string& media_type) {
  return media_type == "application/vnd.oci.image.index.v1+json" ||
         media_type == "application/vnd.docker.distribution.manifest.list.v2+json";
}

struct Descriptor {
  std::string digest;
  std::string media_type;
};

class Layout {
 public:
  explicit Layout(std::string dir) : dir_(std::move(dir)) {
    json index = json::parse(read_whole(dir_ + "/index.json"));
    for (const json& entry : index.value("manifests", json::array())) {
      Descriptor descriptor = descriptor_of(entry);
      if (entry.contains("annotations")) {
        const json& annotations = entry["annotations"];
        auto name = annotations.find("org.opencontainers.image.ref.name");
        if (name != annotations.end() && name->is_string())
          tags_[name->get<std::string>()] = descriptor;
      }
      visit(descriptor, 0);
    }
  }

  // The blob's bytes, or nullopt when it is not in the layout.
  std::optional<std::string> blob(const std::string& digest) const {
    if (!openshell::image::is_digest(digest)) return std::nullopt;
    try {
      return read_whole(blob_path(digest));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }

  std::optional<Descriptor> tag(const std::string& name) const {
    auto it = tags_.find(name);
    if (it == tags_.end()) return std::nullopt;
    return it->second;
  }

  std::vector<std::string> tags() const {
    std::vector<std::string> names;
    for (const auto& [name, descriptor] : tags_) names.push_back(name);
    return names;
  }

  bool is_layer(const std::string& digest) const { return layers_.count(digest) > 0; }

  // A manifest's media type: its descriptor's, else its own "mediaType".
  std::string media_type_of(const std::string& digest, const std::string& body) const {
    auto it = media_types_.find(digest);
    if (it != media_types_.end() && !it->second.empty()) return it->second;
    json doc = json::parse(body, nullptr, false);
    if (doc.is_object() && doc.contains("mediaType") && doc["mediaType"].is_string())
      return doc["mediaType"].get<std::string>();
    return kOciManifest;
  }

 private:
  static Descriptor descriptor_of(const json& entry) {
    return Descriptor{entry.value("digest", ""), entry.value("mediaType", "")};
  }

  std::string blob_path(const std::string& digest) const {
    return dir_ + "/blobs/sha256/" + digest.substr(7);
  }

  // Records the layers of a manifest, and of the manifests of an index.
  void visit(const Descriptor& descriptor, int depth) {
    if (depth > 4 || !openshell::image::is_digest(descriptor.digest)) return;
    media_types_[descriptor.digest] = descriptor.media_type;
    json doc = json::parse(read_whole(blob_path(descriptor.digest)));
    std::string media_type =
        descriptor.media_type.empty() ? doc.value("mediaType", "") : descriptor.media_type;
    if (is_index(media_type) || doc.contains("manifests")) {
      for (const json& entry : doc.value("manifests", json::array()))
        visit(descriptor_of(entry), depth + 1);
      return;
    }
    for (const json& layer : doc.value("layers", json::array()))
      layers_.insert(layer.value("digest", ""));
  }

  std::string dir_;
  std::map<std::string, Descriptor> tags_;
  std::map<std::string, std::string> media_types_;
  std::set<std::string> layers_;
};

std::string errors_body(const std::string& code, const std::string& message) {
  json body = {{"errors", json::array({{{"code", code}, {"message", message}}})}};
  return body.dump();
}

FakeReply error_reply(int status, const std::string& code, const std::string& message) {
  return FakeReply::with(status, errors_body(code, message))
      .header("Content-Type", "application/json");
}

// "bytes=N-" or "bytes=N-M" within size; false when absent or unusable.
bool parse_range(const std::string& header, size_t size, size_t* start, size_t* end) {
  if (header.rfind("bytes=", 0) != 0) return false;
  std::string spec = header.substr(6);
  size_t dash = spec.find('-');
  if (dash == std::string::npos || dash == 0) return false;
  try {
    *start = std::stoul(spec.substr(0, dash));
    *end = dash + 1 < spec.size() ? std::stoul(spec.substr(dash + 1)) + 1 : size;
  } catch (const std::exception&) {
    return false;
  }
  *end = std::min(*end, size);
  return *start < *end;
}

class Registry {
 public:
  Registry(const Options& options, Layout layout) : options_(options), layout_(std::move(layout)) {}

  void set_port(uint16_t port) { port_ = port; }

  FakeReply answer(const FakeRequest& request) {
    FakeReply reply = route(request);
    if (options_.verbose)
      std::fprintf(stderr, "osh-fake-registry: %s %s -> %d\n", request.method.c_str(),
                   request.target.c_str(), reply.status);
    return reply;
  }

 private:
  FakeReply route(const FakeRequest& request) {
    const std::string& mode = options_.mode;
    if (request.method != "GET" && request.method != "HEAD")
      return error_reply(405, "UNSUPPORTED", "the fake registry only serves pulls");
    if (mode == "500") return error_reply(500, "UNKNOWN", "fake registry: mode 500");
    if (mode == "429")
      return error_reply(429, "TOOMANYREQUESTS", "fake registry: mode 429")
          .header("Retry-After", "1");
    if (mode == "401")
      return error_reply(401, "UNAUTHORIZED", "authentication required")
          .header("WWW-Authenticate", "Basic realm=\"osh-fake-registry\"");
    if (mode == "500-once" && first_time("500 " + request.path))
      return error_reply(500, "UNKNOWN", "fake registry: mode 500-once");

    if (request.path == "/token") {
      json body = {{"token", kToken}, {"access_token", kToken}, {"expires_in", 300}};
      return FakeReply::with(200, body.dump()).header("Content-Type", "application/json");
    }
    std::string name, kind, key;
    bool api = split_path(request.path, &name, &kind, &key);
    if (options_.token && request.header("authorization") != std::string("Bearer ") + kToken) {
      std::string challenge = "Bearer realm=\"http://127.0.0.1:" + std::to_string(port_.load()) +
                              "/token\",service=\"" + kService + "\"";
      if (!name.empty()) challenge += ",scope=\"repository:" + name + ":pull\"";
      return error_reply(401, "UNAUTHORIZED", "authentication required")
          .header("WWW-Authenticate", challenge);
    }
    if (request.path == "/v2/" || request.path == "/v2")
      return FakeReply::with(200, "{}")
          .header("Content-Type", "application/json")
          .header("Docker-Distribution-API-Version", "registry/2.0");
    if (request.path.size() > 14 && request.path.rfind("/v2/", 0) == 0 &&
        request.path.compare(request.path.size() - 10, 10, "/tags/list") == 0) {
      json body = {{"name", request.path.substr(4, request.path.size() - 14)},
                   {"tags", layout_.tags()}};
      return FakeReply::with(200, body.dump()).header("Content-Type", "application/json");
    }
    if (!api) return error_reply(404, "UNSUPPORTED", "not a registry path: " + request.path);
    if (kind == "manifests") return manifest(key);
    return blob(request, key);
  }

  // "/v2/<name>/manifests/<key>" or "/v2/<name>/blobs/<key>".
  static bool split_path(const std::string& path, std::string* name, std::string* kind,
                         std::string* key) {
    if (path.rfind("/v2/", 0) != 0) return false;
    for (const char* what : {"manifests", "blobs"}) {
      std::string marker = std::string("/") + what + "/";
      size_t at = path.rfind(marker);
      if (at == std::string::npos || at <= 4) continue;
      *name = path.substr(4, at - 4);
      *kind = what;
      *key = path.substr(at + marker.size());
      return !key->empty();
    }
    return false;
  }

  FakeReply manifest(const std::string& key) {
    std::string digest = key;
    if (!openshell::image::is_digest(key)) {
      auto descriptor = layout_.tag(key);
      if (!descriptor) return error_reply(404, "MANIFEST_UNKNOWN", "manifest unknown");
      digest = descriptor->digest;
    }
    auto body = layout_.blob(digest);
    if (!body) return error_reply(404, "MANIFEST_UNKNOWN", "manifest unknown");
    std::string media_type = layout_.media_type_of(digest, *body);
    return FakeReply::with(200, std::move(*body))
        .header("Content-Type", media_type)
        .header("Docker-Content-Digest", digest);
  }

  FakeReply blob(const FakeRequest& request, const std::string& digest) {
    const std::string& mode = options_.mode;
    if (mode == "404-blobs") return error_reply(404, "BLOB_UNKNOWN", "blob unknown to registry");
    auto content = layout_.blob(digest);
    if (!content) return error_reply(404, "BLOB_UNKNOWN", "blob unknown to registry");
    size_t size = content->size();
    bool layer = layout_.is_layer(digest);
    if (layer && mode == "wrong-digest" && !content->empty()) (*content)[size / 2] ^= 1;

    FakeReply reply;
    size_t start = 0, end = size;
    if (parse_range(request.header("range"), size, &start, &end)) {
      reply.status = 206;
      reply.header("Content-Range", "bytes " + std::to_string(start) + "-" +
                                        std::to_string(end - 1) + "/" + std::to_string(size));
      reply.body = content->substr(start, end - start);
    } else {
      reply.body = std::move(*content);
    }
    reply.header("Content-Type", "application/octet-stream")
        .header("Docker-Content-Digest", digest)
        .header("Accept-Ranges", "bytes");
    bool truncate = mode == "truncate" || (mode == "truncate-once" && first_time("cut " + digest));
    if (layer && truncate && request.method == "GET") {
      reply.action = FakeReply::Action::truncate;
      reply.truncate_at = reply.body.size() / 2;
    }
    return reply;
  }

  bool first_time(const std::string& what) {
    std::lock_guard lock(mutex_);
    return seen_.insert(what).second;
  }

  const Options& options_;
  Layout layout_;
  std::atomic<uint16_t> port_{0};
  std::mutex mutex_;
  std::set<std::string> seen_;
};

void write_port_file(const std::string& path, uint16_t port) {
  std::string temporary = path + ".tmp";
  FILE* out = std::fopen(temporary.c_str(), "w");
  if (!out || std::fprintf(out, "%u\n", static_cast<unsigned>(port)) < 0 || std::fclose(out) != 0)
    throw std::runtime_error("write " + temporary + ": " + std::strerror(errno));
  if (std::rename(temporary.c_str(), path.c_str()) != 0)
    throw std::runtime_error("rename " + temporary + " to " + path + ": " + std::strerror(errno));
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse_options(argc, argv);
  // Blocked before the server's thread starts, so that only sigwait sees them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  try {
    Registry registry(options, Layout(options.layout));
    FakeHttpServer server(
        [&registry](const FakeRequest& request) { return registry.answer(request); });
    registry.set_port(server.port());
    write_port_file(options.port_file, server.port());
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "osh-fake-registry: %s\n", e.what());
    return 1;
  }
}
