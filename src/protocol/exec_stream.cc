#include "protocol/exec_stream.h"

#include "base/text.h"

namespace openshell::protocol::exec {

std::optional<std::string> start_header(const Start& start) {
  std::string value = text::percent_encode(encode(start));
  if (value.size() > kStartHeaderMax) return std::nullopt;
  return value;
}

std::optional<Start> start_in_request(std::string_view raw) {
  const std::string_view name = kStartHeader;
  // The header block: the lines after the request line, to the empty one.
  size_t at = raw.find("\r\n");
  while (at != std::string_view::npos) {
    const size_t begin = at + 2;
    const size_t end = raw.find("\r\n", begin);
    if (end == std::string_view::npos || end == begin) break;
    std::string_view line = raw.substr(begin, end - begin);
    const size_t colon = line.find(':');
    if (colon == name.size() && text::iequals(line.substr(0, colon), name)) {
      std::string_view value = text::trim(line.substr(colon + 1));
      auto json_text = text::percent_decode(value);
      if (!json_text || json_text->size() > kStartHeaderMax) return std::nullopt;
      try {
        ClientMessage message = decode_client(*json_text);
        if (auto* start = std::get_if<Start>(&message)) return *start;
      } catch (const ProtocolError&) {
      }
      return std::nullopt;
    }
    at = end;
  }
  return std::nullopt;
}

void to_json(json& j, const Start& m) {
  j = {{"argv", m.argv}, {"env", m.env}, {"tty", m.tty}, {"rows", m.rows}, {"cols", m.cols}};
  if (m.workdir) j["workdir"] = *m.workdir;
  if (m.user) j["user"] = *m.user;
}

void from_json(const json& j, Start& m) {
  FieldReader r(j, Start::kType);
  r.required("argv", &m.argv);
  r.optional("env", &m.env);
  r.optional("workdir", &m.workdir);
  r.optional("user", &m.user);
  r.optional("tty", &m.tty);
  r.optional("rows", &m.rows);
  r.optional("cols", &m.cols);
  r.no_others();
  if (m.argv.empty()) throw ProtocolError("\"start\" message: field \"argv\" is empty");
}

void to_json(json& j, const Eof&) { j = json::object(); }
void from_json(const json& j, Eof&) { FieldReader(j, Eof::kType).no_others(); }

void to_json(json& j, const Resize& m) { j = {{"rows", m.rows}, {"cols", m.cols}}; }
void from_json(const json& j, Resize& m) {
  FieldReader r(j, Resize::kType);
  r.required("rows", &m.rows);
  r.required("cols", &m.cols);
  r.no_others();
}

void to_json(json& j, const Signal& m) { j = {{"signal", m.signal}}; }
void from_json(const json& j, Signal& m) {
  FieldReader r(j, Signal::kType);
  r.required("signal", &m.signal);
  r.no_others();
  if (m.signal < 1 || m.signal > 64)
    throw ProtocolError("\"signal\" message: field \"signal\" must be from 1 to 64");
}

void to_json(json& j, const Started&) { j = json::object(); }
void from_json(const json& j, Started&) { FieldReader(j, Started::kType).no_others(); }

void to_json(json& j, const Exit& m) { j = {{"code", m.code}}; }
void from_json(const json& j, Exit& m) {
  FieldReader r(j, Exit::kType);
  r.required("code", &m.code);
  r.no_others();
}

void to_json(json& j, const Failure& m) { j = {{"code", m.code}, {"message", m.message}}; }
void from_json(const json& j, Failure& m) {
  FieldReader r(j, Failure::kType);
  r.required("code", &m.code);
  r.required("message", &m.message);
  r.no_others();
}

}  // namespace openshell::protocol::exec
