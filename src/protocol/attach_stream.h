// The attach stream: a WebSocket between a client (`openshell sandbox
// connect`) and the sandbox's supervisor, handed over by the gateway as an
// exec's is (protocol/exec_handoff.h). It joins the client's terminal to the
// sandbox's main process. docs/api.md, "Attach", is its description.
//
//   client -> supervisor: text Attach (first, once), Resize, Detach;
//                         binary: bytes for the main process's terminal
//   supervisor -> client: text Attached (first), then binary output (a
//                         stream byte, exec::kStdout or kStderr, then the
//                         bytes: the replay first, then what comes), then
//                         one of TakenOver, Exit or Failure (last)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "protocol/exec_stream.h"
#include "protocol/message.h"

namespace openshell::protocol::attach {

inline constexpr std::string_view kProtocol = "attach stream";

// How much of the main process's latest output the supervisor keeps for
// the next attach to replay.
inline constexpr size_t kReplayBytes = 1 << 20;

struct Attach {
  static constexpr const char* kType = "attach";
  uint16_t rows = 24;  // the client's terminal, applied to the main process's
  uint16_t cols = 80;
  bool replay = true;  // send the kept output first
};

// The client leaves; the main process runs on.
struct Detach {
  static constexpr const char* kType = "detach";
};

struct Attached {
  static constexpr const char* kType = "attached";
  bool tty = false;     // the main process has a terminal (and so takes input)
  uint64_t replay = 0;  // bytes of kept output that follow
};

// Another client attached: this one gets no more.
struct TakenOver {
  static constexpr const char* kType = "taken_over";
};

// The same as exec's: a window size; the main process's end (its status,
// 128+N for signal N); nothing to attach to (no main process), or a broken
// stream.
using Resize = exec::Resize;
using Exit = exec::Exit;
using Failure = exec::Failure;

using ClientMessage = std::variant<Attach, Resize, Detach>;
using ServerMessage = std::variant<Attached, TakenOver, Exit, Failure>;

// Throw ProtocolError: "attach stream: "attach" message: unknown field "x"".
inline ClientMessage decode_client(std::string_view text) {
  return decode<ClientMessage>(text, kProtocol);
}
inline ServerMessage decode_server(std::string_view text) {
  return decode<ServerMessage>(text, kProtocol);
}

void to_json(json& j, const Attach& m);
void from_json(const json& j, Attach& m);
void to_json(json& j, const Detach& m);
void from_json(const json& j, Detach& m);
void to_json(json& j, const Attached& m);
void from_json(const json& j, Attached& m);
void to_json(json& j, const TakenOver& m);
void from_json(const json& j, TakenOver& m);

}  // namespace openshell::protocol::attach
