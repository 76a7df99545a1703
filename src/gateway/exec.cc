#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "gateway/service.h"
#include "protocol/exec_handoff.h"

namespace openshell::gateway {

// exec: the connection goes to the sandbox's supervisor as it is (before the
// WebSocket handshake), so the gateway stays out of the data path.
void Gateway::exec(const Call& call) {
  const std::shared_ptr<net::Exchange>& exchange = call.exchange;
  const std::string& name = call.name;
  // Read by authorize() a moment ago, on this loop: nothing changed it since.
  SandboxRecord record = call.record ? *call.record : find(name);
  // A download or an upload (?copy=1) reaches a sandbox that is not running
  // too, through a copy supervisor of its own.
  const bool copy = exchange->request().query.count("copy") > 0;
  if (copy && finished(record.phase)) return copy_exec(call, record);
  if (record.phase != Phase::kReady)
    throw ApiError(409, "wrong_phase",
                   "sandbox '" + name + "' is " + std::string(phase_name(record.phase)) +
                       (copy ? " (a copy needs a Ready, Stopped, Completed or Error sandbox)"
                             : " (exec needs a Ready sandbox)"));
  hand_exec_over(exchange, paths_.supervisor_socket(record.id, record.generation), name);
}

// connect: handed over as an exec is; the supervisor keeps the console.
void Gateway::attach(const Call& call) {
  SandboxRecord record = call.record ? *call.record : find(call.name);
  if (record.phase != Phase::kReady)
    throw ApiError(409, "wrong_phase",
                   "sandbox '" + call.name + "' is " + std::string(phase_name(record.phase)) +
                       " (connect needs a Ready sandbox)");
  hand_exec_over(call.exchange, paths_.supervisor_socket(record.id, record.generation), call.name);
}

void Gateway::hand_exec_over(const std::shared_ptr<net::Exchange>& exchange,
                             const std::string& socket_path, const std::string& name) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
  if (!sock || ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw ApiError(503, "unavailable",
                   errno_message("the supervisor of '" + name + "' does not answer", errno));
  std::string raw = exchange->request().raw;
  UniqueFd connection(exchange->release());
  int err = protocol::send_exec_handoff(sock.get(), raw, connection.get());
  if (err) log::error(errno_message("hand exec over to the supervisor of " + name, -err));
}

}  // namespace openshell::gateway
