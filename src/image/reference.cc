#include "image/reference.h"

#include "base/error.h"
#include "image/digest.h"

namespace openshell::image {

namespace {

bool lower_alnum(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }

// One path component: [a-z0-9]+ joined by ".", "_", "__" or runs of "-".
bool valid_component(std::string_view c) {
  if (c.empty() || !lower_alnum(c.front()) || !lower_alnum(c.back())) return false;
  for (size_t i = 0; i < c.size(); ++i) {
    char ch = c[i];
    if (lower_alnum(ch)) continue;
    if (ch == '-') continue;
    if (ch == '.' || ch == '_') {
      // "." and "_" alone, or "__"; never next to another separator.
      size_t run = 1;
      while (i + run < c.size() && !lower_alnum(c[i + run])) ++run;
      std::string_view sep = c.substr(i, run);
      if (sep != "." && sep != "_" && sep != "__") return false;
      i += run - 1;
      continue;
    }
    return false;
  }
  return true;
}

bool valid_tag(std::string_view t) {
  if (t.empty() || t.size() > 128) return false;
  auto word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  };
  if (!word(t[0])) return false;
  for (char c : t)
    if (!word(c) && c != '.' && c != '-') return false;
  return true;
}

bool valid_domain(std::string_view d) {
  if (d.empty()) return false;
  std::string_view host = d;
  if (d.front() == '[') {  // [::1]:5000
    size_t close = d.find(']');
    if (close == std::string_view::npos) return false;
    host = d.substr(1, close - 1);
    std::string_view rest = d.substr(close + 1);
    if (!rest.empty() && (rest[0] != ':' || rest.size() == 1)) return false;
    for (char c : rest.substr(rest.empty() ? 0 : 1))
      if (c < '0' || c > '9') return false;
    for (char c : host)
      if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':'))
        return false;
    return !host.empty();
  }
  size_t colon = d.find(':');
  if (colon != std::string_view::npos) {
    std::string_view port = d.substr(colon + 1);
    if (port.empty() || port.size() > 5) return false;
    for (char c : port)
      if (c < '0' || c > '9') return false;
    host = d.substr(0, colon);
  }
  if (host.empty()) return false;
  for (char c : host)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-'))
      return false;
  return host.front() != '-' && host.front() != '.' && host.back() != '-' && host.back() != '.';
}

}  // namespace

std::string Reference::canonical() const {
  std::string text = name();
  if (!tag.empty()) text += ":" + tag;
  if (!digest.empty()) text += "@" + digest;
  return text;
}

std::string Reference::familiar(const RegistryConfig& config) const {
  std::string text;
  if (!config.default_registry.empty() && domain == config.default_registry) {
    text = repository;
    const std::string& prefix = config.one_component_prefix;
    if (!prefix.empty() && text.size() > prefix.size() + 1 &&
        text.compare(0, prefix.size(), prefix) == 0 && text[prefix.size()] == '/' &&
        text.find('/', prefix.size() + 1) == std::string::npos)
      text = text.substr(prefix.size() + 1);
  } else {
    text = name();
  }
  if (!tag.empty()) text += ":" + tag;
  if (!digest.empty()) text += "@" + digest;
  return text;
}

std::string Reference::registry_host(const RegistryConfig& config) const {
  return config.location_of(domain);
}

bool Reference::is_local_registry() const {
  std::string host = registry_host();  // where it is served: a mapped location counts
  if (!host.empty() && host.front() == '[') {
    host = host.substr(1, host.find(']') - 1);
    return host == "::1";
  }
  host = host.substr(0, host.find(':'));
  return host == "localhost" || host.compare(0, 4, "127.") == 0;
}

Reference parse_reference_text(std::string_view text) {
  auto bad = [&text](const std::string& why) -> Error {
    return Error("image reference '" + std::string(text) + "': " + why);
  };
  if (text.empty()) throw Error("image reference: empty");
  if (text.size() > 512) throw bad("longer than 512 characters");
  Reference ref;
  std::string_view rest = text;
  if (size_t at = rest.find('@'); at != std::string_view::npos) {
    ref.digest = std::string(rest.substr(at + 1));
    if (!is_digest(ref.digest)) throw bad("the digest must be sha256: and 64 lowercase hex digits");
    rest = rest.substr(0, at);
  }
  // A tag is after the last ":" that follows the last "/".
  size_t slash = rest.rfind('/');
  size_t colon = rest.rfind(':');
  if (colon != std::string_view::npos && (slash == std::string_view::npos || colon > slash)) {
    ref.tag = std::string(rest.substr(colon + 1));
    if (!valid_tag(ref.tag))
      throw bad("the tag '" + ref.tag +
                "' may hold letters, digits, '_', '.' and '-' (at most 128)");
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) throw bad("no name");
  std::string_view path = rest;
  size_t first = rest.find('/');
  if (first != std::string_view::npos) {
    std::string_view head = rest.substr(0, first);
    if (head.find('.') != std::string_view::npos || head.find(':') != std::string_view::npos ||
        head == "localhost" || (!head.empty() && head.front() == '[')) {
      if (!valid_domain(head))
        throw bad("'" + std::string(head) + "' is not a registry host[:port]");
      ref.domain = std::string(head);
      path = rest.substr(first + 1);
    }
  }
  ref.short_name = ref.domain.empty();
  for (size_t start = 0;;) {
    size_t end = path.find('/', start);
    std::string_view component =
        path.substr(start, end == std::string_view::npos ? end : end - start);
    if (!valid_component(component))
      throw bad(
          component.empty()
              ? std::string("an empty path component")
              : "'" + std::string(component) +
                    "': names are lowercase letters and digits, joined by '.', '_', '__' or '-'");
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  ref.repository = std::string(path);
  if (ref.name().size() > 255) throw bad("the name is longer than 255 characters");
  if (ref.tag.empty() && ref.digest.empty()) ref.tag = "latest";
  return ref;
}

Reference parse_reference(std::string_view text, const RegistryConfig& config) {
  Reference ref = parse_reference_text(text);
  if (!ref.short_name) return ref;
  if (config.default_registry.empty())
    throw Error("image reference '" + std::string(text) +
                "' names no registry: write REGISTRY/NAME[:TAG], or configure a default "
                "(OPENSHELL_DEFAULT_REGISTRY, gateway.toml images.default_registry, or "
                "unqualified-search-registries in " +
                kRegistriesConf + ")");
  ref.domain = config.default_registry;
  if (!config.one_component_prefix.empty() && ref.repository.find('/') == std::string::npos)
    ref.repository = config.one_component_prefix + "/" + ref.repository;
  if (ref.name().size() > 255)
    throw Error("image reference '" + std::string(text) +
                "': the name is longer than 255 characters");
  return ref;
}

}  // namespace openshell::image
