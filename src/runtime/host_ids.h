// What a gateway prepares on the host for a sandbox before its first launch:
// as root, the sandbox's own host id range (claimed host-wide) and the
// owners of its directories; and whether overlayfs can stack its root here.
// The gateway knows nothing of namespaces: it asks through this door.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace openshell::runtime {

struct SandboxIds {
  uint32_t uid_start;
  uint32_t gid_start;
};

// Claims a range of host ids for the sandbox whose directory is sandbox_dir,
// durable until release_sandbox_ids(). Throws Error when none is free.
SandboxIds claim_sandbox_ids(const std::string& sandbox_dir);

// Frees the range, if it is still this sandbox's claim.
void release_sandbox_ids(uint32_t uid_start, const std::string& sandbox_dir);

// chown path to the host ids that inside_uid:inside_gid of a root sandbox
// with this range are. Throws Error naming the path.
void chown_to_sandbox(const std::string& path, SandboxIds ids, uint32_t inside_uid,
                      uint32_t inside_gid);

// Whether overlayfs stacks `lowers` (top first) under a writable layer made
// in scratch_dir (empty, on the file system of the sandboxes' layers; it is
// emptied again): "" when it can, else the reason.
std::string overlay_problem(const std::vector<std::string>& lowers, const std::string& scratch_dir);

}  // namespace openshell::runtime
