// The gateway: the local control plane. It owns the durable state (SQLite),
// the signing key, the API socket and the sandboxes' lifecycle; it starts a
// supervisor per running sandbox and hears from it over a session.
#pragma once

#include <string>

namespace openshell::gateway {

// `openshell gateway run`: serves until stopped; returns the exit status.
int run();

}  // namespace openshell::gateway
