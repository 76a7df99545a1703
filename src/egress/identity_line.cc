#include "egress/identity_line.h"

#include <cstdint>
#include <set>

#include <nlohmann/json.hpp>

namespace openshell::egress {

using nlohmann::json;

std::optional<Caller> parse_identity_line(std::string_view line, std::string* why) {
  auto refuse = [why](std::string reason) -> std::optional<Caller> {
    *why = std::move(reason);
    return std::nullopt;
  };
  if (line.size() >= kMaxIdentityLine)
    return refuse("longer than " + std::to_string(kMaxIdentityLine - 1) + " bytes");
  // A key given twice would be read as its last value: which one the guest
  // meant is unknown, so it counts as malformed.
  std::set<std::string> keys;
  bool repeated = false;
  json::parser_callback_t note_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 &&
        !keys.insert(parsed.get<std::string>()).second)
      repeated = true;
    return true;
  };
  json j;
  try {
    j = json::parse(line.begin(), line.end(), note_keys);
  } catch (const json::exception& e) {
    return refuse(std::string("not JSON: ") + e.what());
  }
  if (!j.is_object()) return refuse("not a JSON object");
  if (repeated) return refuse("a key given twice");
  for (const auto& [key, value] : j.items())
    if (key != "pid" && key != "exe" && key != "untrusted")
      return refuse("an unknown key \"" + key + "\"");
  for (const char* key : {"pid", "exe", "untrusted"})
    if (!j.contains(key)) return refuse(std::string("no \"") + key + "\"");
  const json& pid = j["pid"];
  if (!pid.is_number_unsigned() || pid.get<uint64_t>() > INT32_MAX)
    return refuse("\"pid\" is not a whole number from 0 to 2147483647");
  if (!j["exe"].is_string() || !j["untrusted"].is_string())
    return refuse("\"exe\" and \"untrusted\" must be strings");
  Caller caller;
  caller.pid = static_cast<pid_t>(pid.get<uint64_t>());
  caller.exe = j["exe"].get<std::string>();
  caller.untrusted = j["untrusted"].get<std::string>();
  if (caller.exe.find('\0') != std::string::npos ||
      caller.untrusted.find('\0') != std::string::npos)
    return refuse("a NUL in a string");
  if (!caller.exe.empty() && caller.exe[0] != '/') return refuse("\"exe\" is not absolute");
  return caller;
}

}  // namespace openshell::egress
