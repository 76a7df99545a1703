// The exec stream: a WebSocket between a client (`openshell sandbox exec`)
// and the sandbox's supervisor, which the gateway has handed the connection
// to (protocol/exec_handoff.h). docs/api.md, "Exec", is its description.
//
//   client -> supervisor: text Start (first, once), Eof, Resize, Signal;
//                         binary: bytes for the command's stdin
//   supervisor -> client: text Started, then Exit or Failure (last);
//                         binary: a stream byte (kStdout, kStderr), then bytes
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "protocol/message.h"

namespace openshell::protocol::exec {

inline constexpr std::string_view kProtocol = "exec stream";

// The stream byte of a binary message to the client.
inline constexpr uint8_t kStdout = 1;  // also everything of a tty
inline constexpr uint8_t kStderr = 2;

struct Start {
  static constexpr const char* kType = "start";
  std::vector<std::string> argv;       // required, not empty
  std::vector<std::string> env;        // "K=V", replacing or adding to the sandbox's
  std::optional<std::string> workdir;  // absent: the sandbox's
  // UID[:GID] or NAME[:GROUP] in the sandbox; absent: the sandbox's user.
  // Root only where the sandbox's policy has process.allow_root.
  std::optional<std::string> user;
  bool tty = false;
  uint16_t rows = 24;
  uint16_t cols = 80;
};

struct Eof {
  static constexpr const char* kType = "eof";
};

struct Resize {
  static constexpr const char* kType = "resize";
  uint16_t rows = 24;
  uint16_t cols = 80;
};

struct Signal {
  static constexpr const char* kType = "signal";
  int signal = 0;  // a signal number, 1 to 64
};

struct Started {
  static constexpr const char* kType = "started";
};

struct Exit {
  static constexpr const char* kType = "exit";
  int code = 0;  // the exit status, 128+N for signal N
};

// The command could not run (127 not found, 126 not executable, 125 else).
struct Failure {
  static constexpr const char* kType = "error";
  int code = 125;
  std::string message;
};

using ClientMessage = std::variant<Start, Eof, Resize, Signal>;
using ServerMessage = std::variant<Started, Exit, Failure>;

// Throw ProtocolError: "exec stream: "start" message: missing field "argv"".
inline ClientMessage decode_client(std::string_view text) {
  return decode<ClientMessage>(text, kProtocol);
}
inline ServerMessage decode_server(std::string_view text) {
  return decode<ServerMessage>(text, kProtocol);
}

// The start message may ride in the upgrade request instead, as this
// header field (its JSON, percent-encoded), so that the supervisor starts
// the command while its answer travels: one round trip less. A supervisor
// that did answers the upgrade with the same field set to "accepted"; a
// client that does not see it sends the start message as usual.
inline constexpr const char* kStartHeader = "Openshell-Exec-Start";
inline constexpr const char* kStartAccepted = "accepted";
inline constexpr size_t kStartHeaderMax = 8192;  // longer: sent as a message

// The header field's value for start; nullopt when it would be too long.
std::optional<std::string> start_header(const Start& start);
// The start message of an upgrade request's header field; nullopt without
// one, or when it is not a valid start message (which the client then sends).
std::optional<Start> start_in_request(std::string_view raw_request);

void to_json(json& j, const Start& m);
void from_json(const json& j, Start& m);
void to_json(json& j, const Eof& m);
void from_json(const json& j, Eof& m);
void to_json(json& j, const Resize& m);
void from_json(const json& j, Resize& m);
void to_json(json& j, const Signal& m);
void from_json(const json& j, Signal& m);
void to_json(json& j, const Started& m);
void from_json(const json& j, Started& m);
void to_json(json& j, const Exit& m);
void from_json(const json& j, Exit& m);
void to_json(json& j, const Failure& m);
void from_json(const json& j, Failure& m);

}  // namespace openshell::protocol::exec
