// Running code with the ids a rootless caller's sandboxes have: as root of a
// user namespace with the caller's id map (the one its sandboxes get), where
// the files they made as subordinate ids are readable and carry their ids
// inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace openshell::runtime {

// Runs child() in a new user namespace with the id map a sandbox that runs
// as uid:gid inside gets, once that map is written, and waits for it.
// child runs in a fork of this process (one that had a single thread may
// allocate there; otherwise system calls only) and gets the write end of a
// pipe; what it writes there comes back in *output, at most max_output
// bytes. Its return value is its exit status. Returns the exit status
// (128+N for a signal N). Throws Error naming `what` ("start WHAT in a user
// namespace") when it cannot be started or its map cannot be written.
int run_in_caller_id_map(uint32_t uid, uint32_t gid, const std::string& what,
                         const std::function<int(int out_fd)>& child, std::string* output,
                         size_t max_output);

// Runs argv (argv[0]: the program's path) that way, as root there where the
// map has an id 0 (subordinate ids), else as uid:gid, and waits for it.
// Returns its exit status (128+N for a signal N); *error_text gets what it
// wrote to stderr (at most 4 KiB). Throws Error when it cannot be started.
// Its stdout is stdout_fd.
int run_with_caller_id_map(const std::vector<std::string>& argv, uint32_t uid, uint32_t gid,
                           int stdout_fd, std::string* error_text);

}  // namespace openshell::runtime
