// Removing what a sandbox leaves on the host once it has ended: its cgroups
// and its files (a rootless sandbox's files may belong to subordinate ids
// the caller cannot remove directly).
#pragma once

#include <string>

namespace openshell::runtime {

// Removes every cgroup named `name` in this process's hierarchies (what
// CgroupSet::create made for it), ending the processes still in one (a
// sandbox whose supervisor is gone). Ignores ones that do not exist.
void remove_cgroups(const std::string& name) noexcept;

// files::remove_tree(path); where ownership stands in the way (rootless,
// files made by other ids inside the sandbox), again from a user namespace
// with the caller's id map. Throws Error.
void remove_tree(const std::string& path);

}  // namespace openshell::runtime
