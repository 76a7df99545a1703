// The registry client with Boost.Beast, over TCP or OpenSSL. Each client owns
// an io_context; every network step is an asynchronous operation with a
// deadline (beast::tcp_stream's expiry) that the calling thread runs until it
// completes, so the API is synchronous and nothing can hang.
#include "image/registry.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/unique_fd.h"
#include "image/registry_internal.h"

namespace openshell::image {
namespace {

using json = nlohmann::json;

const std::string kManifestAccept = std::string(kMediaTypeOciIndex) + ", " + kMediaTypeOciManifest +
                                    ", " + kMediaTypeDockerManifestList + ", " +
                                    kMediaTypeDockerManifest;

class MemorySink : public Sink {
 public:
  std::string data;

 protected:
  void write(const char* bytes, size_t size) override { data.append(bytes, size); }
  void discard() override { data.clear(); }
};

class FileSink : public Sink {
 public:
  FileSink(int fd, const std::string& path, const std::function<void(uint64_t)>& progress)
      : fd_(fd), path_(path), progress_(progress) {}

 protected:
  void write(const char* bytes, size_t size) override {
    while (size > 0) {
      ssize_t n = ::pwrite(fd_, bytes, size, static_cast<off_t>(written_));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw Fatal{errno_message("write " + path_, errno)};
      bytes += n;
      size -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
    if (progress_) progress_(written_);
  }
  void discard() override {
    if (::ftruncate(fd_, 0) != 0) throw Fatal{errno_message("truncate " + path_, errno)};
    written_ = 0;
    if (progress_) progress_(0);
  }

 private:
  int fd_;
  const std::string& path_;
  const std::function<void(uint64_t)>& progress_;
  uint64_t written_ = 0;
};

}  // namespace

RegistryClient::Impl::Impl(Reference reference, RegistryOptions opts)
    : ref(std::move(reference)), options(std::move(opts)), chunk(kChunkBytes) {
  options.attempts = std::max(options.attempts, 1);
  options.backoff_ms = std::max(options.backoff_ms, 0);
  options.timeout_ms = std::max(options.timeout_ms, 1);
  if (options.user_agent.empty()) options.user_agent = "openshell/" OPENSHELL_VERSION;
  bool https = !(options.insecure || ref.is_local_registry());
  auto url = parse_authority(ref.registry_host(), https);
  if (!url) throw RegistryError("registry " + ref.registry_host() + ": not a host[:port]", 0);
  registry = *url;
}

RegistryClient::RegistryClient(Reference ref, RegistryOptions options)
    : impl_(std::make_unique<Impl>(std::move(ref), std::move(options))) {}

RegistryClient::~RegistryClient() = default;

RegistryClient::Manifest RegistryClient::manifest(const std::string& tag_or_digest) {
  Impl& d = *impl_;
  bool by_digest = is_digest(tag_or_digest);
  Object object;
  object.what = d.ref.name() + (by_digest ? "@" : ":") + tag_or_digest;
  if (!by_digest && !valid_tag(tag_or_digest))
    throw RegistryError(object.what + ": neither a tag nor a sha256 digest", 0);
  object.path = "/v2/" + d.ref.repository + "/manifests/" + tag_or_digest;
  object.accept = kManifestAccept;
  object.max_bytes = kMaxManifestBytes;
  if (by_digest) object.digest = tag_or_digest;

  MemorySink sink;
  Fetched fetched = d.fetch(object, sink);
  if (is_digest(fetched.registry_digest) && fetched.registry_digest != fetched.digest)
    throw RegistryError(object.what + ": the registry's Docker-Content-Digest " +
                            fetched.registry_digest + " does not match the content (" +
                            fetched.digest + ")",
                        0);
  Manifest manifest;
  manifest.media_type = fetched.media_type;
  manifest.body = std::move(sink.data);
  manifest.digest = fetched.digest;
  // Some registries answer application/json or nothing; the body says.
  bool known = manifest.media_type == kMediaTypeOciIndex ||
               manifest.media_type == kMediaTypeOciManifest ||
               manifest.media_type == kMediaTypeDockerManifestList ||
               manifest.media_type == kMediaTypeDockerManifest;
  if (!known) {
    json doc = json::parse(manifest.body, nullptr, false);
    if (doc.is_object() && doc.contains("mediaType") && doc["mediaType"].is_string())
      manifest.media_type = doc["mediaType"].get<std::string>();
  }
  return manifest;
}

std::string RegistryClient::blob(const std::string& digest, size_t max) {
  Object object = impl_->blob_object(digest);
  object.max_bytes = max;
  MemorySink sink;
  impl_->fetch(object, sink);
  return std::move(sink.data);
}

void RegistryClient::blob_to_file(const std::string& digest, int64_t size, const std::string& path,
                                  const std::function<void(uint64_t)>& progress) {
  Object object = impl_->blob_object(digest);
  object.size = size;
  object.resume = true;
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd) throw RegistryError(object.what + ": " + errno_message("create " + path, errno), 0);
  try {
    FileSink sink(fd.get(), path, progress);
    impl_->fetch(object, sink);
    if (::close(fd.release()) != 0)
      throw RegistryError(object.what + ": " + errno_message("write " + path, errno), 0);
  } catch (...) {
    fd.reset();
    ::unlink(path.c_str());
    throw;
  }
}

}  // namespace openshell::image
