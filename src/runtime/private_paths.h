// openshell's own state and sockets on this host: what no sandbox may see,
// whichever layout (root or rootless, OPENSHELL_HOME or not) put them where.
// A sandbox that can read the gateway's key, launch files or database, or
// connect to its sockets, could take over the sandboxes of its owner.
#pragma once

#include <string>
#include <vector>

#include "base/paths.h"

namespace openshell::runtime {

// The existing directories and sockets among: each of `known`'s state and
// run directories; those Paths::resolve() gives now; $OPENSHELL_HOME; the
// defaults of both layouts (/var/lib/openshell, /run/openshell,
// $XDG_STATE_HOME/openshell and ~/.local/state/openshell of the invoking
// user, $XDG_RUNTIME_DIR entirely, /run/user/<uid>, /tmp/openshell-* of any
// uid). Canonical (symlinks resolved), sorted, without duplicates; never
// "/". For namespaces::FilesystemSpec::hidden.
std::vector<std::string> openshell_private_paths(const std::vector<Paths>& known = {});

}  // namespace openshell::runtime
