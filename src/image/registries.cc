#include "image/registries.h"

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <optional>

#include "base/error.h"
#include "base/files.h"
#include "base/toml_file.h"

namespace openshell::image {

namespace {

// HOST[:PORT] or [V6]:PORT, without a path or a scheme.
bool bare_registry(std::string_view text) {
  if (text.empty() || text.find('/') != std::string_view::npos) return false;
  for (char c : text)
    if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
          c == '-' || c == ':' || c == '[' || c == ']'))
      return false;
  return text.front() != '-' && text.front() != '.' && text.front() != ':';
}

void read_registries_conf(const std::string& path, RegistryConfig* c) {
  std::string text;
  int err = files::read_into(path, &text);
  if (err == ENOENT) return;
  if (err) throw_errno("read " + path, err);
  toml::table root = toml_file::parse(text, path);
  if (const toml::node* node = root.get("unqualified-search-registries")) {
    const toml::array* list = node->as_array();
    if (!list) toml_file::fail(path, node, "unqualified-search-registries", "must be a list");
    for (const auto& item : *list) {
      auto s = item.value<std::string>();
      if (!s || !bare_registry(*s))
        toml_file::fail(path, &item, "unqualified-search-registries",
                        "must be a list of HOST[:PORT] strings");
      if (c->default_registry.empty()) {
        c->default_registry = *s;
        c->default_source = path + " unqualified-search-registries";
      }
    }
  }
  if (const toml::node* node = root.get("registry")) {
    const toml::array* list = node->as_array();
    if (!list) toml_file::fail(path, node, "registry", "must be an array of tables ([[registry]])");
    for (const auto& item : *list) {
      const toml::table* t = item.as_table();
      if (!t) toml_file::fail(path, &item, "registry", "must be an array of tables ([[registry]])");
      auto prefix = (*t)["prefix"].value<std::string>();
      auto location = (*t)["location"].value<std::string>();
      // Without a prefix the location is the prefix; mapping a path is
      // beyond what a whole-registry location can say.
      if (!location || !bare_registry(*location)) continue;
      std::string from = prefix ? *prefix : *location;
      if (!bare_registry(from) || from == *location) continue;
      c->locations.push_back({from, *location});
    }
  }
}

std::mutex& config_mutex() {
  static std::mutex m;
  return m;
}

std::optional<RegistryConfig>& current() {
  static std::optional<RegistryConfig> c;
  return c;
}

}  // namespace

std::string RegistryConfig::location_of(std::string_view domain) const {
  for (const auto& l : locations)
    if (l.prefix == domain) return l.location;
  return std::string(domain);
}

RegistryConfig load_registry_config(const RegistryGetenv& getenv) {
  RegistryConfig c;
  const char* conf = getenv("OPENSHELL_REGISTRIES_CONF");
  read_registries_conf(conf && *conf ? conf : kRegistriesConf, &c);
  if (const char* v = getenv("OPENSHELL_DEFAULT_REGISTRY"); v && *v) {
    if (!bare_registry(v))
      throw Error(std::string("OPENSHELL_DEFAULT_REGISTRY=") + v +
                  ": expected a registry, HOST[:PORT]");
    c.default_registry = v;
    c.default_source = "OPENSHELL_DEFAULT_REGISTRY";
  }
  if (const char* v = getenv("OPENSHELL_ONE_COMPONENT_PREFIX"); v && *v) {
    std::string_view p(v);
    if (p.front() == '/' || p.back() == '/' || p.find("//") != std::string_view::npos)
      throw Error(std::string("OPENSHELL_ONE_COMPONENT_PREFIX=") + v +
                  ": expected path components, like library");
    c.one_component_prefix = v;
  }
  return c;
}

RegistryConfig registry_config() {
  std::lock_guard lock(config_mutex());
  if (!current()) current() = load_registry_config(std::getenv);
  return *current();
}

void set_registry_config(RegistryConfig config) {
  std::lock_guard lock(config_mutex());
  current() = std::move(config);
}

}  // namespace openshell::image
