// Running a helper of this binary with the ids a rootless caller's
// sandboxes have: as root of a user namespace with the caller's id map (the
// one its sandboxes get), where the files they made as subordinate ids are
// readable and carry their ids inside.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace openshell::runtime {

// Runs argv (argv[0]: the program's path) in a new user namespace with the
// id map a sandbox that runs as uid:gid inside gets, and waits for it. Returns its exit status
// (128+N for a signal N); *error_text gets what it wrote to stderr (at most 4 KiB). Throws Error
// when it cannot be started. It runs as root there where the map has an id 0 (subordinate ids),
// else as uid:gid; its stdout is stdout_fd.
int run_with_caller_id_map(const std::vector<std::string>& argv, uint32_t uid, uint32_t gid,
                           int stdout_fd, std::string* error_text);

}  // namespace openshell::runtime
