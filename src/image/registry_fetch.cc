// Fetching one registry object: checks, resumption and retries.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "base/error.h"
#include "base/text.h"
#include "image/registry_internal.h"

namespace openshell::image {
namespace registry_detail {

// "bytes 100-199/200" -> 100.
std::optional<uint64_t> range_start(std::string_view content_range) {
  content_range = text::trim(content_range);
  if (!starts_with(content_range, "bytes ")) return std::nullopt;
  content_range.remove_prefix(6);
  return text::parse_uint(content_range.substr(0, content_range.find('-')));
}

}  // namespace registry_detail

// An answer other than the one wanted: Transient or Fatal, with the
// server's own message when it sent one.
void RegistryClient::Impl::status_failure(Reply& reply, const std::string& who) {
  int status = reply.status;
  std::string status_line = reply.status_line;
  std::string retry_after = reply.header("retry-after");
  std::string message = registry_error_message(drain(reply));
  if (is_retryable_status(status)) {
    Transient failure;
    failure.status = status;
    failure.who = who;
    failure.status_line = status_line;
    failure.detail = message;
    if (status == 429 || status == 503) {
      if (auto seconds = text::parse_uint(text::trim(retry_after), 3600))
        failure.retry_after_ms = static_cast<int>(
            std::min<uint64_t>(*seconds * 1000, static_cast<uint64_t>(kMaxRetryAfterMs)));
    }
    throw failure;
  }
  if (!message.empty()) throw Fatal{message + " (" + std::to_string(status) + ")", status};
  throw Fatal{who + " answered " + status_line, status};
}

Fetched RegistryClient::Impl::fetch_once(const Object& object, Sink& sink, bool resume) {
  Fields fields;
  if (!object.accept.empty()) fields.emplace_back("Accept", object.accept);
  uint64_t offset = resume ? sink.size() : 0;
  if (offset > 0) fields.emplace_back("Range", "bytes=" + std::to_string(offset) + "-");
  Reply reply = open(object.path, fields);
  std::string who = "registry " + reply.url.host_port();
  if (reply.status == 206 && offset > 0 && range_start(reply.header("content-range")) == offset) {
    sink.resumed = true;
  } else if (reply.status == 200) {
    sink.restart();
  } else if (reply.status == 206) {
    std::string range = reply.header("content-range");
    drain(reply);
    sink.restart();
    Transient failure{who + " answered with another range than asked for (" + printable(range) +
                      ")"};
    failure.resumable = false;
    throw failure;
  } else {
    status_failure(reply, who);
  }
  bool ranges = iequals(text::trim(reply.header("accept-ranges")), "bytes") || reply.status == 206;
  Fetched fetched{media_type_of(reply.header("content-type")),
                  std::string(text::trim(reply.header("docker-content-digest"))), ""};
  std::optional<uint64_t> total;
  if (object.size >= 0)
    total = static_cast<uint64_t>(object.size);
  else if (reply.content_length)
    total = sink.size() + *reply.content_length;

  beast::error_code ec = read_body(reply, [&](const char* data, size_t size) {
    if (sink.size() + size > object.max_bytes)
      throw Fatal{"larger than the limit of " + text::format_bytes(object.max_bytes)};
    if (object.size >= 0 && sink.size() + size > static_cast<uint64_t>(object.size))
      throw Fatal{"larger than its size of " + std::to_string(object.size) + " bytes"};
    sink.append(data, size);
  });
  if (ec || (total && sink.size() < *total)) {
    Transient failure;
    failure.reason = "the transfer ended after " + std::to_string(sink.size()) +
                     (total ? " of " + std::to_string(*total) : "") + " bytes";
    if (ec) failure.reason += ": " + step_message(ec);
    failure.resumable = object.resume && ranges;
    throw failure;
  }
  fetched.digest = sink.digest();
  if (!object.digest.empty() && fetched.digest != object.digest) {
    if (sink.resumed) {
      // The pieces may not belong together: once more, from the start.
      sink.restart();
      Transient failure{"content does not match its digest after a resumed transfer"};
      failure.resumable = false;
      throw failure;
    }
    throw Fatal{"content does not match its digest (got " + fetched.digest + ")"};
  }
  return fetched;
}

Fetched RegistryClient::Impl::fetch(const Object& object, Sink& sink) {
  bool resume = false;
  for (int attempt = 1;; ++attempt) {
    try {
      return fetch_once(object, sink, resume);
    } catch (const Transient& failure) {
      if (attempt >= options.attempts)
        throw RegistryError(exhausted(object, failure, attempt), failure.status);
      resume = failure.resumable.value_or(resume);
      int delay = failure.retry_after_ms;
      if (delay < 0)
        delay = static_cast<int>(std::min<int64_t>(
            static_cast<int64_t>(options.backoff_ms) << std::min(attempt - 1, 20), kMaxBackoffMs));
      std::this_thread::sleep_for(std::chrono::milliseconds(delay));
    } catch (const Fatal& failure) {
      throw RegistryError(object.what + ": " + failure.reason, failure.status);
    } catch (const boost::system::system_error& e) {
      throw RegistryError(object.what + ": " + e.what(), 0);
    }
  }
}

std::string RegistryClient::Impl::exhausted(const Object& object, const Transient& failure,
                                            int attempts) {
  std::string count =
      " (" + std::to_string(attempts) + (attempts == 1 ? " attempt)" : " attempts)");
  std::string detail = failure.detail.empty() ? "" : ": " + failure.detail;
  if (failure.status == 429)
    return failure.who + " rate limited (429) the requests for " + object.what + count + detail;
  if (failure.status != 0)
    return failure.who + " answered " + failure.status_line + " for " + object.what + count +
           detail;
  return object.what + ": " + failure.reason + count;
}

std::string RegistryClient::Impl::blob_what(const std::string& digest) const {
  return "blob " + digest + " from " + ref.name();
}

Object RegistryClient::Impl::blob_object(const std::string& digest) const {
  std::string what = blob_what(digest);
  if (!is_digest(digest)) throw RegistryError(what + ": not a sha256 digest", 0);
  Object object;
  object.what = what;
  object.path = "/v2/" + ref.repository + "/blobs/" + digest;
  object.digest = digest;
  return object;
}

}  // namespace openshell::image
