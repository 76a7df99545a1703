// What must hold for any packet that arrives from inside a sandbox on the
// init's control channel, whoever wrote it: parsing never crashes, a parsed
// packet re-encodes to the same bytes, and an exec request that decodes
// (or main request) survives an encode/decode round trip unchanged. Shared by the fuzz target
// and the unit test that replays its corpus.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "runtime/init_protocol.h"

namespace openshell::fuzz {

// "" when every property holds; otherwise which one broke.
inline std::string init_protocol_violation(std::string_view packet) {
  using runtime::InitMessage;
  InitMessage message = runtime::parse_message(packet);
  if (packet.empty() || packet.back() != '\0') {
    if (message.kind != InitMessage::Kind::kUnknown || !message.fields.empty())
      return "a packet without a final NUL parsed as a message";
    return "";
  }
  if (message.kind != InitMessage::Kind::kUnknown) {
    std::vector<std::string> parts{std::string(packet.substr(0, packet.find('\0')))};
    parts.insert(parts.end(), message.fields.begin(), message.fields.end());
    if (runtime::make_message(parts) != packet)
      return "a parsed packet does not re-encode to itself";
  }
  auto request = runtime::decode_exec(message);
  if (!request) return "";
  // "main" is an exec request of its own kind (the sandbox's main process).
  if (message.kind != InitMessage::Kind::kExec && message.kind != InitMessage::Kind::kMain)
    return "a packet other than exec or main decoded as exec";
  if (request->main != (message.kind == InitMessage::Kind::kMain))
    return "an exec request's main flag is not its packet's kind";
  if (request->argv.empty()) return "an exec request decoded without argv";
  auto again = runtime::decode_exec(runtime::parse_message(runtime::encode_exec(*request)));
  if (!again) return "an encoded exec request does not decode";
  if (again->id != request->id || again->tty != request->tty || again->rows != request->rows ||
      again->cols != request->cols || again->workdir != request->workdir ||
      again->argv != request->argv || again->env != request->env || again->user != request->user ||
      again->main != request->main)
    return "an exec request changed in an encode/decode round trip";
  return "";
}

}  // namespace openshell::fuzz
