// The caller's terminal while a sandbox runs: signals forwarded to it, and
// with --tty the pseudo-terminal's bytes relayed both ways in raw mode.
#pragma once

namespace openshell::runtime {
class Container;
}

namespace openshell::cli {

// The caller's terminal size, from whichever of its stdio is a terminal;
// 24x80 when none is.
void terminal_size(unsigned short* rows, unsigned short* cols);

// Relays until the container ends; returns its exit status.
int attach(runtime::Container& container);

}  // namespace openshell::cli
