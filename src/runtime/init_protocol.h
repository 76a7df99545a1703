// The control channel between a container's owner (the supervisor) and its
// init: a SOCK_SEQPACKET socket, one message per packet. Through it the owner
// asks the init to start more processes in the sandbox (exec), confined
// exactly like the main process because the init forks them; the init
// answers and reports their exits.
//
// A message is a list of strings, each ended by a NUL; the first is its kind.
// File descriptors travel beside it (SCM_RIGHTS), sent and received with
// base/packet.h, which owns each one from the moment it arrives.
//
//   owner -> init
//     exec ID TTY ROWS COLS WORKDIR ARGC ARG... ENVC ENV... [UID GID]
//          UID GID: the ids it runs as, when not the init's own
//          fds: stdin, stdout, stderr (when TTY is "0")
//     main ID ...             as exec, for the sandbox's main process, when
//                             it was started without one (an OCI create,
//                             then start): the init ends with it. With TTY
//                             "1" it gets the pty made at the start.
//     kill ID SIGNAL
//     socket ID               a TCP socket made in the sandbox's network namespace
//   init -> owner
//     started ID PID          fds: the pty master (when TTY is "1")
//     failed ID EXIT_CODE ERRNO WHAT
//     exited ID STATUS        STATUS: the exit code, or 128+N for signal N
//     socket ID ERRNO         fds: the socket (when ERRNO is 0); IDs of their own
//
// Why the init makes the sockets of port forwards: a socket belongs to the
// network namespace it was made in, whoever connects it later. The owner
// cannot enter the sandbox's namespace itself when rootless (setns of a
// network namespace needs CAP_SYS_ADMIN in the user namespace that owns it,
// and the owner is outside the sandbox's), and as root entering would only
// make a second path for the same thing. The init, already inside, makes an
// unconnected socket and hands it over; the owner connects it to the
// sandbox's loopback, outside the sandbox's seccomp filter and Landlock
// domain, which confine what the sandbox's own processes do, not this.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/packet.h"

namespace openshell::runtime {

// Ids in the sandbox's user namespace.
struct ExecUser {
  uint32_t uid = 0;
  uint32_t gid = 0;
  bool operator==(const ExecUser&) const = default;
};

struct ExecRequest {
  uint64_t id = 0;
  bool tty = false;
  uint16_t rows = 24;
  uint16_t cols = 80;
  std::string workdir = "/";
  std::vector<std::string> argv;
  std::vector<std::string> env;  // the whole environment ("K=V")
  std::optional<ExecUser> user;  // none: the init's (the main process's) ids
  bool main = false;             // "main": the sandbox's main process
};

struct InitMessage {
  enum class Kind { kStarted, kFailed, kExited, kExec, kMain, kKill, kSocket, kUnknown };
  Kind kind = Kind::kUnknown;
  std::vector<std::string> fields;  // after the kind
};

inline constexpr size_t kMaxControlMessage = kMaxPacket;

std::string encode_exec(const ExecRequest& request);
std::optional<ExecRequest> decode_exec(const InitMessage& message);

// Splits a packet into its strings; kUnknown when malformed.
InitMessage parse_message(std::string_view packet);
std::string make_message(const std::vector<std::string>& parts);

}  // namespace openshell::runtime
