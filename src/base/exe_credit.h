// Whether a process may be credited as its executable: the rules the
// egress proxy applies to the processes holding a connection
// (egress/identity.h), and the micro-VM's guest init to the callers of its
// relays (runtime/guest_relay.h). The pure parts work on the text /proc
// shows, so that they can be tested without processes:
//
//  - its environment asks the dynamic loader for other code: LD_PRELOAD or
//    LD_AUDIT set (to anything but the empty string);
//  - every file it has mapped executable is its executable itself, or a
//    file under a library directory: /lib, /lib32, /lib64, /usr/lib,
//    /usr/lib32, /usr/lib64, /usr/local/lib, and PREFIX/lib and PREFIX/lib64
//    for an executable PREFIX/bin/NAME (the dynamic loader is among them);
//    a mapping of a deleted file or a memfd is never one;
//  - such a library, and the directory holding it, is not writable by the
//    process: not group- or world-writable, not owned by its uid
//    (checked by judge(), with the file in hand).
// Anonymous executable memory (JIT compilers) is allowed: it is made by code
// that is itself one of the above.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace openshell::credit {

// "LD_PRELOAD in its environment", or "" when neither is set.
std::string environment_problem(
    std::string_view environ_bytes);  // NUL-separated, as /proc shows it
// The paths of file-backed executable mappings in a /proc/PID/maps text
// (" (deleted)" kept as the kernel writes it).
std::vector<std::string> executable_files(std::string_view maps);
// Whether a mapped path is one a process of `exe` may run code from
// (before the writability check).
bool library_path_allowed(const std::string& path, const std::string& exe);

struct Judgement {
  std::string exe;  // as the process's root shows it ("/usr/bin/curl"); "" when unknown
  // Why the process is not credited as `exe` ("" when it is): code from
  // elsewhere may run in it, so what it does is not what `exe` would do.
  std::string untrusted;
};

// One process (a pid of this process's PID namespace), read from /proc and
// judged by the rules above; without `examine`, not judged (untrusted says
// so).
Judgement judge(pid_t pid, bool examine = true);

// Finding the process behind a TCP connection to a loopback listener
// without netlink: its socket's inode in the namespace's /proc/net/tcp,
// then the processes whose fds hold that inode.
//
// The inode of the socket 127.0.0.1:client_port -> 127.0.0.1:server_port in
// a /proc/PID/net/tcp text; 0 when it has none.
uint64_t loopback_socket_inode(std::string_view tcp_table, uint16_t client_port,
                               uint16_t server_port);
// Whether one of the process's fds is `wanted` ("socket:[INODE]"). Each fd
// read counts against *budget; false with *budget 0 when it ran out before
// the last.
bool holds_socket(pid_t pid, std::string_view wanted, size_t* budget);
// When the process started (clock ticks since boot, /proc/PID/stat's 22nd
// field; 0 when unknown): with the pid, it names one process, not a later
// one with the same number.
uint64_t start_time(pid_t pid);

}  // namespace openshell::credit
