#include "runtime/init_protocol.h"

#include "base/text.h"

namespace openshell::runtime {

std::string make_message(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& part : parts) {
    out += part;
    out += '\0';
  }
  return out;
}

InitMessage parse_message(std::string_view packet) {
  InitMessage message;
  if (packet.empty() || packet.back() != '\0') return message;
  std::vector<std::string> parts;
  size_t start = 0;
  while (start < packet.size()) {
    size_t end = packet.find('\0', start);
    parts.emplace_back(packet.substr(start, end - start));
    start = end + 1;
  }
  const std::string& kind = parts[0];
  if (kind == "started")
    message.kind = InitMessage::Kind::kStarted;
  else if (kind == "failed")
    message.kind = InitMessage::Kind::kFailed;
  else if (kind == "exited")
    message.kind = InitMessage::Kind::kExited;
  else if (kind == "exec")
    message.kind = InitMessage::Kind::kExec;
  else if (kind == "main")
    message.kind = InitMessage::Kind::kMain;
  else if (kind == "kill")
    message.kind = InitMessage::Kind::kKill;
  else if (kind == "socket")
    message.kind = InitMessage::Kind::kSocket;
  message.fields.assign(parts.begin() + 1, parts.end());
  return message;
}

std::string encode_exec(const ExecRequest& r) {
  std::vector<std::string> parts = {
      r.main ? "main" : "exec",     std::to_string(r.id),   r.tty ? "1" : "0",
      std::to_string(r.rows),       std::to_string(r.cols), r.workdir,
      std::to_string(r.argv.size())};
  parts.insert(parts.end(), r.argv.begin(), r.argv.end());
  parts.push_back(std::to_string(r.env.size()));
  parts.insert(parts.end(), r.env.begin(), r.env.end());
  if (r.user) {
    parts.push_back(std::to_string(r.user->uid));
    parts.push_back(std::to_string(r.user->gid));
  }
  return make_message(parts);
}

std::optional<ExecRequest> decode_exec(const InitMessage& m) {
  if ((m.kind != InitMessage::Kind::kExec && m.kind != InitMessage::Kind::kMain) ||
      m.fields.size() < 6)
    return std::nullopt;
  ExecRequest r;
  r.main = m.kind == InitMessage::Kind::kMain;
  auto id = text::parse_uint(m.fields[0]);
  auto rows = text::parse_uint(m.fields[2], 65535);
  auto cols = text::parse_uint(m.fields[3], 65535);
  auto argc = text::parse_uint(m.fields[5], 65536);
  if (!id || !rows || !cols || !argc || (m.fields[1] != "0" && m.fields[1] != "1"))
    return std::nullopt;
  r.id = *id;
  r.tty = m.fields[1] == "1";
  r.rows = static_cast<uint16_t>(*rows);
  r.cols = static_cast<uint16_t>(*cols);
  r.workdir = m.fields[4];
  size_t at = 6;
  if (m.fields.size() < at + *argc + 1 || *argc == 0) return std::nullopt;
  r.argv.assign(m.fields.begin() + at, m.fields.begin() + at + *argc);
  at += *argc;
  auto envc = text::parse_uint(m.fields[at++], 65536);
  if (!envc || (m.fields.size() != at + *envc && m.fields.size() != at + *envc + 2))
    return std::nullopt;
  r.env.assign(m.fields.begin() + at, m.fields.begin() + at + *envc);
  at += *envc;
  if (at < m.fields.size()) {
    // Canonical numbers only: a decoded request encodes back to its bytes.
    auto uid = text::parse_uint(m.fields[at], 0xFFFFFFFE);
    auto gid = text::parse_uint(m.fields[at + 1], 0xFFFFFFFE);
    if (!uid || !gid || std::to_string(*uid) != m.fields[at] ||
        std::to_string(*gid) != m.fields[at + 1])
      return std::nullopt;
    r.user = ExecUser{static_cast<uint32_t>(*uid), static_cast<uint32_t>(*gid)};
  }
  return r;
}

}  // namespace openshell::runtime
