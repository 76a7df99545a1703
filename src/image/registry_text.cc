// The registry client's text: header values, error messages, URLs.
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/text.h"
#include "image/registry_internal.h"

namespace openshell::image {
namespace registry_detail {

using json = nlohmann::json;

constexpr size_t kMaxQuotedText = 200;

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}

// Server-provided text fit for a one-line message: control characters
// replaced, cut at kMaxQuotedText.
std::string printable(std::string_view text) {
  std::string out;
  for (char c : text.substr(0, kMaxQuotedText))
    out += static_cast<unsigned char>(c) < 0x20 || c == 0x7f ? '?' : c;
  if (text.size() > kMaxQuotedText) out += "...";
  return out;
}

std::string duration_text(int ms) {
  if (ms < 1000) return std::to_string(ms) + " ms";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", ms / 1000.0);
  return buf;
}

bool valid_tag(std::string_view tag) {
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  if (tag.empty() || tag.size() > 128 || !word(tag[0])) return false;
  return std::all_of(tag.begin(), tag.end(),
                     [&](char c) { return word(c) || c == '.' || c == '-'; });
}

// A request target or header value we send: printable ASCII, no spaces.
bool valid_token_text(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](char c) {
    return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7f;
  });
}

bool is_retryable_status(int status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

bool is_redirect(int status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

// "application/json; charset=utf-8" -> "application/json".
std::string media_type_of(std::string_view content_type) {
  return lower(text::trim(content_type.substr(0, content_type.find(';'))));
}

// The distribution spec's error body, {"errors":[{"code":..,"message":..}]}:
// the messages joined, or "" when the body is something else.
std::string registry_error_message(const std::string& body) {
  json doc = json::parse(body, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("errors") ||
      !doc["errors"].is_array())
    return "";
  std::string out;
  for (const json& error : doc["errors"]) {
    if (!error.is_object()) continue;
    std::string message;
    if (error.contains("message") && error["message"].is_string())
      message = error["message"].get<std::string>();
    if (message.empty() && error.contains("code") && error["code"].is_string()) {
      message = lower(error["code"].get<std::string>());
      std::replace(message.begin(), message.end(), '_', ' ');
    }
    if (message.empty()) continue;
    if (!out.empty()) out += "; ";
    out += message;
  }
  return printable(out);
}

// "host", "host:port", "[v6]", "[v6]:port".
std::optional<Url> parse_authority(std::string_view authority, bool https) {
  Url url;
  url.https = https;
  url.port = https ? 443 : 80;
  std::string_view host = authority, port;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    host = authority.substr(1, close - 1);
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':' || rest.size() == 1) return std::nullopt;
      port = rest.substr(1);
    }
    auto address = Address::parse(host);
    if (!address || address->family != AF_INET6) return std::nullopt;
  } else {
    size_t colon = authority.find(':');
    if (colon != std::string_view::npos) {
      host = authority.substr(0, colon);
      port = authority.substr(colon + 1);
      if (port.empty()) return std::nullopt;
    }
    if (host.empty() || host.front() == '-' || host.front() == '.') return std::nullopt;
    for (char c : host)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '.' || c == '-' || c == '_'))
        return std::nullopt;
  }
  if (!port.empty()) {
    auto number = text::parse_uint(port, 65535);
    if (!number || *number == 0) return std::nullopt;
    url.port = static_cast<uint16_t>(*number);
  }
  url.host = lower(host);
  return url;
}

std::optional<Url> parse_url(std::string_view text) {
  bool https;
  if (starts_with(text, "https://")) {
    https = true;
    text.remove_prefix(8);
  } else if (starts_with(text, "http://")) {
    https = false;
    text.remove_prefix(7);
  } else {
    return std::nullopt;
  }
  text = text.substr(0, text.find('#'));
  size_t end = text.find_first_of("/?");
  auto url = parse_authority(text.substr(0, end), https);
  if (!url) return std::nullopt;
  std::string_view rest = end == std::string_view::npos ? std::string_view() : text.substr(end);
  url->target = rest.empty() ? "/" : rest[0] == '?' ? "/" + std::string(rest) : std::string(rest);
  if (!valid_token_text(url->target)) return std::nullopt;
  return url;
}

// A Location header: absolute, scheme-relative, an absolute path, or a path
// relative to base's.
std::optional<Url> resolve_location(const Url& base, std::string_view location) {
  location = text::trim(location);
  if (starts_with(location, "https://") || starts_with(location, "http://"))
    return parse_url(location);
  if (starts_with(location, "//"))
    return parse_url((base.https ? "https:" : "http:") + std::string(location));
  location = location.substr(0, location.find('#'));
  if (location.empty()) return std::nullopt;
  Url url = base;
  if (location[0] == '/') {
    url.target = std::string(location);
  } else {
    std::string path = base.target.substr(0, base.target.find('?'));
    if (location[0] != '?') path = path.substr(0, path.rfind('/') + 1);
    url.target = path + std::string(location);
  }
  if (!valid_token_text(url.target)) return std::nullopt;
  return url;
}

}  // namespace registry_detail

}  // namespace openshell::image
