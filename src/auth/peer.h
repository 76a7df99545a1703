// Who is at the other end of a Unix socket, beyond its uid: a sandbox that
// runs as its owner's uid (rootless, a host-root sandbox) passes the socket's
// file mode, so the servers also ask whether the peer is a host process.
#pragma once

#include <string>

namespace openshell::auth {

// Why the process that connected on fd must not use an API: "" when it is a
// process of our own pid namespace. Inside a sandbox (a descendant pid
// namespace), or whenever that cannot be told (the process has exited, is
// not visible from here, /proc cannot be read), the answer is a reason: it
// fails closed.
std::string peer_in_sandbox(int fd);

// The depth of the pid namespace of the process that a /proc status text
// describes: the number of pids on its "NSpid:" line (1 for the pid
// namespace of that /proc); 0 when there is no such line. Exposed for tests.
int nspid_depth(const std::string& status_text);

}  // namespace openshell::auth
