// The gateway: the local control plane. It owns the durable state (SQLite),
// the signing key, the API socket and the sandboxes' lifecycle; it starts a
// supervisor per running sandbox and hears from it over a session.
#pragma once

#include <string>
#include <vector>

namespace openshell::gateway {

struct RunOptions {
  // --socket-group: a root gateway's socket opened to this group (mode
  // 0660, its directory 0710), so that the group's users share the
  // gateway, each seeing only their own sandboxes. Over api.socket_group
  // in gateway.toml; "" there and here: the socket is root's alone.
  std::string socket_group;
  // The TCP listeners: --listen ADDRESS:PORT (TLS), --insecure-listen
  // ADDRESS:PORT (plain, loopback), and --tls-dir DIR; over api.listen,
  // api.insecure_listen and api.tls_dir when given.
  std::vector<std::string> listen;
  std::vector<std::string> insecure_listen;
  std::string tls_dir;
};

// `openshell gateway run`: serves until stopped; returns the exit status.
// ready_fd (or -1): gets "ok" once the gateway listens, or "error: why" when
// it cannot start; then it is closed. (The command line waits on it.)
int run(int ready_fd = -1, const RunOptions& options = {});

}  // namespace openshell::gateway
