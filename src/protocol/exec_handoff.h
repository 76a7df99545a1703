// The exec handoff: the gateway gives a client's exec connection, as it is
// (before the WebSocket handshake), to the sandbox's supervisor over the
// supervisor's private socket RUN_DIR/s/ID.GENERATION.sock. One
// SOCK_SEQPACKET packet:
//
//   "openshell exec-handoff 1\n" then the HTTP request exactly as the
//   gateway read it (any bytes)
//   beside it (SCM_RIGHTS): exactly one descriptor, the connection
//
// Not the init's control protocol, not JSON: the request travels byte for
// byte. The supervisor answers nothing; it speaks the exec stream
// (protocol/exec_stream.h) on the connection.
#pragma once

#include <string>
#include <string_view>

#include "base/unique_fd.h"
#include "protocol/message.h"

namespace openshell::protocol {

inline constexpr std::string_view kExecHandoffTag = "openshell exec-handoff 1\n";

struct ExecHandoff {
  std::string request;  // the raw HTTP upgrade request
  UniqueFd connection;
};

std::string encode_exec_handoff(std::string_view request);
// The request from a packet; throws ProtocolError.
std::string decode_exec_handoff(std::string_view packet);

// Sends the handoff (the caller keeps its fd); returns 0 or -errno.
int send_exec_handoff(int socket_fd, std::string_view request, int connection_fd);
// Receives one handoff; every descriptor that came with it and is not the
// connection is closed. Throws ProtocolError (a malformed packet, no
// descriptor or more than one) or Error (the socket's own errors).
ExecHandoff receive_exec_handoff(int socket_fd);

}  // namespace openshell::protocol
