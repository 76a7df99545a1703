// The gateways this user knows by name (`openshell gateway add`), and which
// one a command talks to.
//
// A registry is a directory: gateways/<NAME>/ holds endpoint.json (the
// gateway's URL) and, for a TLS gateway, ca.crt, client.crt and client.key
// (0600, the directory 0700); the file `active` names the active gateway.
// The user's registry is $XDG_CONFIG_HOME/openshell (default
// ~/.config/openshell); the system's, read-only here and written by
// packages, is /etc/openshell ($OPENSHELL_SYSTEM_CONFIG_DIR moves it, for
// tests). A user entry shadows a system entry of the same name.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/paths.h"
#include "net/endpoint.h"

namespace openshell::cli {

struct RegisteredGateway {
  std::string name;
  net::Endpoint endpoint;  // with its TLS files filled in when it has them
  std::string dir;         // where its files are
  bool system = false;     // from the system registry
};

class GatewayRegistry {
 public:
  // The user's and the system's registry, from the environment.
  static GatewayRegistry from_environment();
  GatewayRegistry(std::string user_dir, std::string system_dir);

  const std::string& user_dir() const { return user_dir_; }
  const std::string& system_dir() const { return system_dir_; }

  // Every gateway, by name, a user entry in place of a system one.
  std::vector<RegisteredGateway> list() const;
  std::optional<RegisteredGateway> find(const std::string& name) const;
  // The first gateway whose endpoint has this URL (for --gateway-endpoint:
  // its credentials).
  std::optional<RegisteredGateway> find_by_url(const std::string& url) const;
  // The user's active gateway's name, else the system's; "" when neither
  // names one (a name whose entry is gone counts as none). *system says
  // which registry chose it.
  std::string active(bool* system = nullptr) const;

  // Writes a user entry (replacing one of the same name): the endpoint and,
  // when given, copies of the TLS files. Throws Error.
  RegisteredGateway add(const std::string& name, const net::Endpoint& endpoint,
                        const net::TlsFiles& files);
  // Makes a registered gateway the active one. Throws Error when unknown.
  void select(const std::string& name);
  // Removes a user entry (and the active mark when it named it). Throws
  // Error for an unknown name or a system entry.
  void remove(const std::string& name);

 private:
  std::optional<RegisteredGateway> read_entry(const std::string& registry, const std::string& name,
                                              bool system) const;
  std::vector<std::string> names_in(const std::string& registry) const;

  std::string user_dir_;
  std::string system_dir_;
};

// A gateway's name in the registry: letters, digits, '-', '_' and '.', not
// starting with '.' or '-', at most 63. Throws Error naming what is wrong.
void check_gateway_name(const std::string& name);

// Which gateway a command talks to, and why.
struct GatewayChoice {
  enum class Source {
    kFlagName,      // -g/--gateway NAME
    kFlagEndpoint,  // --gateway-endpoint URL
    kEnvironment,   // OPENSHELL_GATEWAY (a name or a URL)
    kActive,        // the user's active gateway
    kSystem,        // the system registry's active gateway
    kLocal,         // nothing chosen: this OPENSHELL_HOME's socket
  };
  net::Endpoint endpoint;
  std::string name;  // the registered gateway's name; "" for a bare URL or the local socket
  Source source = Source::kLocal;

  // The local socket, found without being asked for: the only choice that
  // may start a gateway.
  bool local_default() const { return source == Source::kLocal; }
  // Whether the gateway may be on another host: a TCP endpoint whose host
  // is not a loopback address (127.0.0.0/8, ::1, localhost). Such a gateway
  // cannot read this machine's files; the CLI sends them, or refuses.
  bool remote() const;
  // "gateway 'lab' (https://10.0.0.5:17670)", "unix:///run/openshell/gateway.sock".
  std::string describe() const;
};

// What the command line asked for.
struct GatewaySelection {
  std::string name;      // -g/--gateway
  std::string endpoint;  // --gateway-endpoint
};

// The choice, in this order: --gateway-endpoint or -g (both: an error),
// OPENSHELL_GATEWAY (`environment`, nullopt when unset), the user's active
// gateway, the system's active gateway, the local socket of `paths`. A URL
// that a registered gateway has borrows its credentials; any other https
// URL, those in paths.tls_dir(). Throws Error for an unknown name or a bad
// URL.
GatewayChoice choose_gateway(const GatewaySelection& selection,
                             const std::optional<std::string>& environment,
                             const GatewayRegistry& registry, const Paths& paths);

// The global options (-g, --gateway-endpoint), set once they are parsed.
void set_gateway_selection(GatewaySelection selection);
// choose_gateway with those options, the environment and its registries.
GatewayChoice chosen_gateway();

}  // namespace openshell::cli
