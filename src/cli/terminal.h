// The caller's terminal while a sandbox runs: signals forwarded to it, and
// with --tty the pseudo-terminal's bytes relayed both ways in raw mode.
#pragma once

namespace openshell::runtime {
class Container;
}

namespace openshell::cli {

// Relays until the container ends; returns its exit status.
int attach(runtime::Container& container);

}  // namespace openshell::cli
