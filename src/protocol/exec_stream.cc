#include "protocol/exec_stream.h"

namespace openshell::protocol::exec {

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
