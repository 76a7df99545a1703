// Who opened a connection: from a TCP connection on a sandbox's loopback to
// the process and its executable, through /proc (the socket's inode in the
// sandbox's network namespace, then the process holding it).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace openshell::egress {

struct Caller {
  pid_t pid = 0;    // host pid; 0 when not found
  std::string exe;  // the executable as the sandbox sees it ("/usr/bin/curl"); "" when unknown
};

// The client of a connection from 127.0.0.1:client_port to 127.0.0.1:server_port
// inside the network namespace of init_pid (the sandbox's PID 1, a host pid);
// only the sandbox's processes (init_pid and its descendants) are searched.
Caller identify_tcp_client(pid_t init_pid, uint16_t client_port, uint16_t server_port);

// An absolute path inside the sandbox's root with its symlinks resolved there
// (as the kernel would for a process of the sandbox); the path itself when it
// cannot be resolved.
std::string resolve_in_sandbox(pid_t init_pid, const std::string& path);

}  // namespace openshell::egress
