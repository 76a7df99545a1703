#include "protocol/exec_handoff.h"

#include "base/packet.h"

namespace openshell::protocol {

std::string encode_exec_handoff(std::string_view request) {
  return std::string(kExecHandoffTag) + std::string(request);
}

std::string decode_exec_handoff(std::string_view packet) {
  if (packet.substr(0, kExecHandoffTag.size()) != kExecHandoffTag)
    throw ProtocolError(
        "exec handoff: the packet does not start with \"openshell exec-handoff 1\"");
  if (packet.size() == kExecHandoffTag.size())
    throw ProtocolError("exec handoff: the packet holds no request");
  return std::string(packet.substr(kExecHandoffTag.size()));
}

int send_exec_handoff(int socket_fd, std::string_view request, int connection_fd) {
  return send_packet(socket_fd, encode_exec_handoff(request), &connection_fd, 1);
}

ExecHandoff receive_exec_handoff(int socket_fd) {
  std::string packet;
  PacketFds fds;
  long n = receive_packet(socket_fd, &packet, &fds);
  if (n < 0) throw_errno("exec handoff: receive", static_cast<int>(-n));
  if (n == 0) throw ProtocolError("exec handoff: the peer sent nothing");
  ExecHandoff handoff;
  handoff.request = decode_exec_handoff(packet);
  if (!fds[0] || fds[1])
    throw ProtocolError("exec handoff: the packet must carry exactly one descriptor");
  handoff.connection = std::move(fds[0]);
  return handoff;
}

}  // namespace openshell::protocol
