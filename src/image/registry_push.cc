// Pushing to a registry: the distribution API's blob checks, mounts and
// chunked uploads, and the manifest PUT.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include "base/error.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "image/registry_internal.h"

namespace openshell::image {

namespace {

constexpr size_t kUploadChunkBytes = 4u << 20;

std::string with_query(const Url& url, const std::string& query) {
  return url.target + (url.target.find('?') == std::string::npos ? "?" : "&") + query;
}

// Where the registry says the upload goes on.
Url upload_location(RegistryClient::Impl& d, Reply& reply, const Url& from) {
  const std::string location = reply.header("location");
  d.drain(reply);
  auto next = resolve_location(from, location);
  if (!next)
    throw Fatal{"registry " + d.registry.host_port() +
                " gave no valid upload location: " + printable(location)};
  if (from.https && !next->https && !d.options.insecure)
    throw Fatal{"refused the upload location on plain HTTP (" + next->origin() + ")"};
  return *next;
}

// Runs one try of a push step, with retries for failures that may pass.
template <typename Step>
auto with_retries(RegistryClient::Impl& d, const std::string& what, Step step) {
  for (int attempt = 1;; ++attempt) {
    try {
      return step();
    } catch (const Transient& failure) {
      Object object;
      object.what = what;
      if (attempt >= d.options.attempts)
        throw RegistryError(RegistryClient::Impl::exhausted(object, failure, attempt),
                            failure.status);
      int delay = failure.retry_after_ms;
      if (delay < 0)
        delay = static_cast<int>(std::min<int64_t>(static_cast<int64_t>(d.options.backoff_ms)
                                                       << std::min(attempt - 1, 20),
                                                   kMaxBackoffMs));
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    } catch (const Fatal& failure) {
      throw RegistryError(what + ": " + failure.reason, failure.status);
    } catch (const boost::system::system_error& e) {
      throw RegistryError(what + ": " + e.what(), 0);
    }
  }
}

// Sends size bytes from read(offset, n) -> chunk, as PATCHes and a PUT.
template <typename Read>
void upload(RegistryClient::Impl& d, Url at, const std::string& digest, uint64_t size, Read read,
            const std::function<void(uint64_t)>& progress) {
  const std::string who = "registry " + d.registry.host_port();
  uint64_t sent = 0;
  while (sent < size) {
    const std::string chunk = read(sent, std::min<uint64_t>(kUploadChunkBytes, size - sent));
    const uint64_t last = sent + chunk.size() - 1;
    Fields fields = {{"Content-Range", std::to_string(sent) + "-" + std::to_string(last)}};
    Send send{bhttp::verb::patch, chunk, "application/octet-stream"};
    Reply reply = d.send_to(at, fields, send);
    if (reply.status != 202 && reply.status != 204) d.status_failure(reply, who);
    at = upload_location(d, reply, at);
    sent += chunk.size();
    if (progress) progress(sent);
  }
  Url put = at;
  put.target = with_query(at, "digest=" + text::percent_encode(digest));
  Reply reply = d.send_to(put, {}, Send{bhttp::verb::put, {}, "application/octet-stream"});
  if (reply.status != 201 && reply.status != 204) d.status_failure(reply, who);
  d.drain(reply);
}

}  // namespace

bool RegistryClient::has_blob(const std::string& digest) {
  Impl& d = *impl_;
  const std::string what = "blob " + digest + " at " + d.ref.name();
  return with_retries(d, what, [&] {
    Url url = d.registry;
    url.target = "/v2/" + d.ref.repository + "/blobs/" + digest;
    Reply reply = d.send_to(url, {}, Send{bhttp::verb::head, {}, {}});
    if (reply.status == 200) {
      d.drain(reply);
      return true;
    }
    if (reply.status == 404) {
      d.drain(reply);
      return false;
    }
    d.status_failure(reply, "registry " + d.registry.host_port());
  });
}

RegistryClient::BlobPush RegistryClient::push_blob(const std::string& path,
                                                   const std::string& digest, uint64_t size,
                                                   const std::string& mount_from,
                                                   const std::function<void(uint64_t)>& progress) {
  Impl& d = *impl_;
  const std::string what = "blob " + digest + " to " + d.ref.name();
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) throw RegistryError(what + ": " + errno_message("open " + path, errno), 0);
  return with_retries(d, what, [&] {
    Url start = d.registry;
    start.target = "/v2/" + d.ref.repository + "/blobs/uploads/";
    if (!mount_from.empty())
      start.target +=
          "?mount=" + text::percent_encode(digest) + "&from=" + text::percent_encode(mount_from);
    Reply reply = d.send_to(start, {}, Send{bhttp::verb::post, {}, {}});
    if (reply.status == 201 && !mount_from.empty()) {
      d.drain(reply);
      if (progress) progress(size);
      return BlobPush::kMounted;
    }
    if (reply.status != 202) d.status_failure(reply, "registry " + d.registry.host_port());
    Url at = upload_location(d, reply, start);
    upload(
        d, at, digest, size,
        [&](uint64_t offset, uint64_t n) {
          std::string chunk(n, '\0');
          for (size_t done = 0; done < n;) {
            ssize_t got =
                ::pread(fd.get(), chunk.data() + done, n - done, static_cast<off_t>(offset + done));
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0)
              throw Fatal{got < 0 ? errno_message("read " + path, errno)
                                  : "read " + path + ": the file is shorter than " +
                                        std::to_string(size) + " bytes"};
            done += static_cast<size_t>(got);
          }
          return chunk;
        },
        progress);
    return BlobPush::kUploaded;
  });
}

void RegistryClient::push_blob_bytes(const std::string& bytes, const std::string& digest) {
  Impl& d = *impl_;
  with_retries(d, "blob " + digest + " to " + d.ref.name(), [&] {
    Url start = d.registry;
    start.target = "/v2/" + d.ref.repository + "/blobs/uploads/";
    Reply reply = d.send_to(start, {}, Send{bhttp::verb::post, {}, {}});
    if (reply.status != 202) d.status_failure(reply, "registry " + d.registry.host_port());
    Url at = upload_location(d, reply, start);
    upload(
        d, at, digest, bytes.size(),
        [&](uint64_t offset, uint64_t n) { return bytes.substr(offset, n); }, nullptr);
    return 0;
  });
}

void RegistryClient::push_manifest(const std::string& tag, const std::string& body,
                                   const std::string& media_type) {
  Impl& d = *impl_;
  const std::string what = d.ref.name() + ":" + tag;
  if (!valid_tag(tag)) throw RegistryError(what + ": not a valid tag", 0);
  const std::string digest = sha256_digest(body);
  with_retries(d, what, [&] {
    Url url = d.registry;
    url.target = "/v2/" + d.ref.repository + "/manifests/" + tag;
    Reply reply = d.send_to(url, {}, Send{bhttp::verb::put, body, media_type});
    if (reply.status != 201 && reply.status != 200 && reply.status != 204)
      d.status_failure(reply, "registry " + d.registry.host_port());
    const std::string answered(text::trim(reply.header("docker-content-digest")));
    d.drain(reply);
    if (is_digest(answered) && answered != digest)
      throw Fatal{"the registry stored it as " + answered + ", not " + digest};
    return 0;
  });
}

}  // namespace openshell::image
