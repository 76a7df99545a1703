// Which registry a short image name ("busybox", "org/tool") means, and where
// a registry's API is. Nothing here is built in: a short name resolves only
// through configuration, and a name is refused when none is configured.
//
//   1. OPENSHELL_DEFAULT_REGISTRY (the gateway sets it from gateway.toml
//      [images] default_registry, see gateway/config.h);
//   2. else the first entry of unqualified-search-registries in
//      registries.conf (containers-registries.conf(5);
//      /etc/containers/registries.conf, or OPENSHELL_REGISTRIES_CONF).
//
// A name of one component ("busybox") gets a path prefix only when
// OPENSHELL_ONE_COMPONENT_PREFIX (gateway.toml images.one_component_prefix)
// says so: "library" makes it REGISTRY/library/busybox, as some registries
// keep their official images.
//
// registries.conf's [[registry]] tables with prefix = "HOST[:PORT]" and
// location = "HOST[:PORT]" say where that registry's API is served; a table
// whose prefix or location holds a path is not used (only whole registries
// are mapped here).
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace openshell::image {

struct RegistryConfig {
  std::string default_registry;      // "" when none is configured
  std::string default_source;        // where it came from, for messages and `gateway status`
  std::string one_component_prefix;  // "" or "library"
  struct Location {
    std::string prefix;    // a registry, HOST[:PORT]
    std::string location;  // where its API is, HOST[:PORT]
  };
  std::vector<Location> locations;

  // Where the API of registry `domain` is: its location, else itself.
  std::string location_of(std::string_view domain) const;
};

inline constexpr const char* kRegistriesConf = "/etc/containers/registries.conf";

using RegistryGetenv = std::function<const char*(const char*)>;

// Reads the variables through getenv and the registries.conf they name (or
// kRegistriesConf; a missing file gives nothing). Throws Error
// "FILE:LINE: KEY: what is wrong" for a file that does not parse or a value
// of the wrong kind, and one line naming a variable with a bad value.
RegistryConfig load_registry_config(const RegistryGetenv& getenv);

// The process's configuration (a copy): loaded from the environment on
// first use.
RegistryConfig registry_config();
// Replaces it (the gateway, when its settings change; tests).
void set_registry_config(RegistryConfig config);

}  // namespace openshell::image
