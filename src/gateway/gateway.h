// The gateway: the local control plane. It owns the durable state (SQLite),
// the signing key, the API socket and the sandboxes' lifecycle; it starts a
// supervisor per running sandbox and hears from it over a session.
#pragma once

#include <string>
#include <vector>

namespace openshell::gateway {

// `gateway run`'s flags for TCP: they replace gateway.toml's api.listen,
// api.insecure_listen and api.tls_dir when given.
struct ListenFlags {
  std::vector<std::string> listen;           // --listen ADDRESS:PORT (TLS)
  std::vector<std::string> insecure_listen;  // --insecure-listen ADDRESS:PORT (loopback)
  std::string tls_dir;                       // --tls-dir DIR
};

// `openshell gateway run`: serves until stopped; returns the exit status.
// ready_fd (or -1): gets "ok" once the gateway listens, or "error: why" when
// it cannot start; then it is closed. (The command line waits on it.)
int run(int ready_fd = -1, const ListenFlags& flags = {});

}  // namespace openshell::gateway
