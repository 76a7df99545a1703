// The gateway's settings: a TOML file, gateway.toml, in the state directory
// (the system gateway, root's without OPENSHELL_HOME, reads
// /etc/openshell/gateway.toml when that exists), and the environment
// variables of old, which win over the file. Every setting knows where its
// value came from, for `gateway status`.
//
//   [dns]                 # how sandboxes' names resolve on the host
//   servers = ["192.0.2.53", "[2001:db8::53]:5353"]   # OPENSHELL_DNS_SERVERS
//   hosts_file = "/etc/hosts"                         # OPENSHELL_HOSTS_FILE
//   resolv_conf = "/etc/resolv.conf"                  # OPENSHELL_RESOLV_CONF
//   query_rate = 20       # lookups a second, 0: no limit   OPENSHELL_DNS_QUERY_RATE
//   query_burst = 50                                  # OPENSHELL_DNS_QUERY_BURST
//   [storage]
//   mode = "auto"         # auto | overlay | copy     # OPENSHELL_STORAGE
//   [api]                 # the API socket's limits (net/http.h), at start
//   header_timeout_ms = 10000                         # OPENSHELL_API_HEADER_TIMEOUT_MS
//   body_timeout_ms = 10000                           # OPENSHELL_API_BODY_TIMEOUT_MS
//   idle_timeout_ms = 60000                           # OPENSHELL_API_IDLE_TIMEOUT_MS
//   max_connections_per_uid = 128                     # OPENSHELL_API_MAX_CONNECTIONS_PER_UID
//   listen = ["127.0.0.1:17670"]   # TLS listeners beside the socket     gateway run --listen
//   insecure_listen = []           # plain HTTP, loopback only           --insecure-listen
//   tls_dir = "/var/lib/openshell/tls"   # ca.crt, server.crt, server.key   --tls-dir
//   socket_group = "openshell"  # a root gateway's socket, 0660, for this group (--socket-group)
//   [images]              # what a short image name means (image/registries.h)
//   default_registry = "registry.example"             # OPENSHELL_DEFAULT_REGISTRY
//   one_component_prefix = "library"                  # OPENSHELL_ONE_COMPONENT_PREFIX
//   [sandbox_defaults]    # see base/sandbox_limits.h
//   pids = 4096
//   tmp_size = "1G"
//   shm_size = "512M"
//
// A file that cannot be read or parsed, an unknown table or key, or a value
// of the wrong kind: Error "FILE:LINE: TABLE.KEY: what is wrong".
#pragma once

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "base/paths.h"
#include "base/sandbox_limits.h"
#include "image/registries.h"
#include "net/http.h"

namespace openshell::gateway {

using Getenv = std::function<const char*(const char*)>;

struct Setting {
  std::string value;   // as text ("" for an unset list)
  std::string source;  // "default", "file" or "environment"
  std::string env;     // the variable that overrides it
};

struct GatewayConfig {
  std::string path;          // the file read
  bool file_exists = false;  // absent: every setting is its default or the environment's
  Setting servers;           // comma separated
  Setting hosts_file;
  Setting resolv_conf;
  Setting query_rate;
  Setting query_burst;
  Setting storage;  // "auto", "overlay" or "copy"
  // The API's limits (whole numbers, 1 to 86400000).
  Setting header_timeout_ms;
  Setting body_timeout_ms;
  Setting idle_timeout_ms;
  Setting max_connections_per_uid;
  // The TCP listeners (comma separated ADDRESS:PORT), and where the TLS
  // files are ("": Paths::tls_dir()). A command line's flags win over the
  // file (source "command line").
  Setting listen;
  Setting insecure_listen;
  Setting tls_dir;
  Setting socket_group;  // "": the socket is the gateway's user's alone (0600)
  // "": registries.conf's unqualified-search-registries, else none.
  Setting default_registry;
  Setting one_component_prefix;
  limits::Defaults sandbox_defaults;

  // The API server's limits these settings give.
  net::ServerLimits api_limits() const;

  // KEY=VALUE for the supervisors the gateway starts: the DNS settings that
  // are not the defaults, under the variables the supervisor reads
  // (egress/dns.h ResolverConfig::from_environment).
  std::vector<std::string> supervisor_env() const;
  // The image registries these settings give: registries.conf (through
  // getenv's OPENSHELL_REGISTRIES_CONF) under the two settings above.
  image::RegistryConfig registries(const Getenv& getenv) const;
  // For `gateway status`: {"file": ..., "file_exists": ..., "settings":
  // {"dns.servers": {"value", "source", "env"}, ...}}.
  nlohmann::json view() const;
};

// Which file configures the gateway of these paths: system_file for the
// system gateway (euid 0 without OPENSHELL_HOME) when that file exists,
// else STATE/gateway.toml.
inline constexpr const char* kSystemConfigFile = "/etc/openshell/gateway.toml";
std::string config_path(const Paths& paths, uid_t euid, const Getenv& getenv,
                        const std::string& system_file = kSystemConfigFile);

// Reads path (a missing file: no settings from it), then the environment
// through getenv. Throws Error naming the file, line and key, or the
// variable, at fault.
GatewayConfig load_config(const std::string& path, const Getenv& getenv);

}  // namespace openshell::gateway
