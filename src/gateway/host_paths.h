// Host paths in a create request (`--bind` sources, `--from DIR`), checked
// with the rights of the user who asks: a root gateway that serves other
// users must never lend them its own rights to the host's files.
//
// What the sandbox gets from each decides the check (namespaces/mounts.h):
//  - A bind source that root does not own is idmapped, its owner becoming
//    the sandbox user: so it must be the caller's own (or root's, which is
//    mounted plainly and shows only what everyone may read).
//  - A `--from` directory is the root's lower layer, shifted with every
//    owner kept: whoever owns a file outside owns it inside. So the caller
//    must be able to read everything in it, every entry of the tree.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace openshell::gateway {

struct HostPath {
  std::string path;  // absolute, as the spec holds it (canonical when it was given)
  std::string what;  // for the message: "--bind /src:/work"
  bool write = false;
  bool bind = false;  // a bind source: the caller's own or root's
  bool tree = false;  // a root's lower layer: every entry readable by the caller
};

// The first path that the user uid (primary group gid, and the groups
// /etc/group gives the user) cannot use, in one line naming it and why; ""
// when it may use them all. Checked in a child process that takes the
// user's ids (setgroups, setresgid, setresuid): read (and search, for a
// directory) access, write access where `write`, and what `bind` and
// `tree` ask for; a path that no longer resolves to itself (a component
// became a symbolic link) is refused too. Needs root (or the user's own
// uid). Throws Error when the check itself cannot run.
std::string host_path_problem(uid_t uid, gid_t gid, const std::vector<HostPath>& paths);

}  // namespace openshell::gateway
