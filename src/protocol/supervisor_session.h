// The supervisor session: a WebSocket from a sandbox's supervisor to the
// gateway (GET /v1/supervisor/session), text messages only. docs/api.md,
// "The supervisor session", is its description.
//
//   supervisor -> gateway: Hello (first, on every connection), Status,
//                          PolicyApplied, ForwardStates
//   gateway -> supervisor: Welcome, Superseded, Rejected, Stop, Policy,
//                          Credentials, Forwards
//
// A final Status is also the supervisor's exit file (sandboxes/ID/exit.json),
// without its "type".
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "protocol/message.h"

namespace openshell::protocol::session {

inline constexpr std::string_view kProtocol = "supervisor session";

struct Hello {
  static constexpr const char* kType = "hello";
  std::string launch;  // the launch file's bytes, read afresh for each connection
  int64_t pid = 0;
};

// state "running" carries init_pid; "exited" and "stopped" carry exit_code,
// reason and message.
struct Status {
  static constexpr const char* kType = "status";
  int64_t generation = 0;
  std::string state;
  std::optional<int64_t> init_pid;
  std::optional<int> exit_code;
  std::string reason;
  std::string message;

  // "starting": alive, but not yet ready (a micro-VM whose guest's init
  // has not said `ready`); the sandbox stays in Provisioning or Starting.
  bool running() const { return state == "running" || state == "starting"; }
  bool ready() const { return state == "running"; }
};

struct PolicyApplied {
  static constexpr const char* kType = "policy_applied";
  int64_t revision = 0;
  std::optional<std::string> error;  // the supervisor refused it
};

// One credential of a provider attached to the sandbox: the value the
// sandbox's placeholder (KEY=openshell:resolve:env:KEY) stands for, and the
// endpoints (HOST:PORT) it may be sent to. Never in the launch file.
struct Credential {
  std::string key;
  std::string value;
  std::vector<std::string> endpoints;
  bool operator==(const Credential&) const = default;
};

// A port forward: the host's BIND:PORT to 127.0.0.1:PORT in the sandbox.
struct Forward {
  std::string bind;  // an IP address of the host ("127.0.0.1", "::1", "0.0.0.0")
  uint16_t port = 0;
  bool operator==(const Forward&) const = default;
  auto operator<=>(const Forward&) const = default;
};

struct Welcome {
  static constexpr const char* kType = "welcome";
  std::vector<std::string> env;         // the spec's, which the launch file names by its digest
  std::vector<Credential> credentials;  // absent from an older gateway's: none
  std::vector<Forward> forwards;        // absent when none (an older supervisor reads it then)
  // The sandbox's CA for this launch, PEM, made by the gateway, which has
  // written the sandbox's CA bundle with it: only to the supervisor it
  // started, once. Absent: the supervisor makes its own and the bundle.
  std::string ca_cert;
  std::string ca_key;
};

// The whole set of the sandbox's forwards, replacing what came before: sent
// when one is added or removed. The supervisor keeps the listeners of those
// that stay (their connections go on), closes the others' and opens the new.
struct Forwards {
  static constexpr const char* kType = "forwards";
  std::vector<Forward> forwards;
};

// How each forward of the supervisor's set stands: "listening", or "error"
// with why ("127.0.0.1:8080: Address already in use"). Sent after every
// welcome and forwards message, and when one changes.
struct ForwardState {
  std::string bind;
  uint16_t port = 0;
  std::string state;
  std::string error;
  bool operator==(const ForwardState&) const = default;
};
struct ForwardStates {
  static constexpr const char* kType = "forward_states";
  std::vector<ForwardState> forwards;
};

// The whole set of the sandbox's credentials, replacing what came before:
// sent when a provider of the sandbox is updated, attached or detached.
struct Credentials {
  static constexpr const char* kType = "credentials";
  std::vector<Credential> credentials;
};

struct Superseded {
  static constexpr const char* kType = "superseded";
  std::string message;
};

struct Rejected {
  static constexpr const char* kType = "rejected";
  std::string message;
};

struct Stop {
  static constexpr const char* kType = "stop";
  int grace_ms = 10000;  // SIGTERM, then SIGKILL after this
};

struct Policy {
  static constexpr const char* kType = "policy";
  int64_t revision = 0;
  std::string text;  // TOML; empty: the default policy
};

using ToGateway = std::variant<Hello, Status, PolicyApplied, ForwardStates>;
using ToSupervisor =
    std::variant<Welcome, Superseded, Rejected, Stop, Policy, Credentials, Forwards>;

// Throw ProtocolError: "supervisor session: "status" message: missing field ...".
inline ToGateway decode_to_gateway(std::string_view text) {
  return decode<ToGateway>(text, kProtocol);
}
inline ToSupervisor decode_to_supervisor(std::string_view text) {
  return decode<ToSupervisor>(text, kProtocol);
}

// The exit file: a final Status without "type". Throws ProtocolError.
std::string encode_exit_file(const Status& status);
Status decode_exit_file(std::string_view text);

void to_json(json& j, const Hello& m);
void from_json(const json& j, Hello& m);
void to_json(json& j, const Status& m);
void from_json(const json& j, Status& m);
void to_json(json& j, const PolicyApplied& m);
void from_json(const json& j, PolicyApplied& m);
void to_json(json& j, const Credential& m);
void to_json(json& j, const Credentials& m);
void from_json(const json& j, Credentials& m);
void to_json(json& j, const Welcome& m);
void from_json(const json& j, Welcome& m);
void to_json(json& j, const Superseded& m);
void from_json(const json& j, Superseded& m);
void to_json(json& j, const Rejected& m);
void from_json(const json& j, Rejected& m);
void to_json(json& j, const Stop& m);
void from_json(const json& j, Stop& m);
void to_json(json& j, const Policy& m);
void from_json(const json& j, Policy& m);
void to_json(json& j, const Forward& m);
void to_json(json& j, const Forwards& m);
void from_json(const json& j, Forwards& m);
void to_json(json& j, const ForwardState& m);
void to_json(json& j, const ForwardStates& m);
void from_json(const json& j, ForwardStates& m);

}  // namespace openshell::protocol::session
