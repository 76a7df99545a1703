#include "protocol/attach_stream.h"

namespace openshell::protocol::attach {

void to_json(json& j, const Attach& m) {
  j = {{"rows", m.rows}, {"cols", m.cols}, {"replay", m.replay}};
}
void from_json(const json& j, Attach& m) {
  FieldReader r(j, Attach::kType);
  r.optional("rows", &m.rows);
  r.optional("cols", &m.cols);
  r.optional("replay", &m.replay);
  r.no_others();
}

void to_json(json& j, const Resize& m) { j = {{"rows", m.rows}, {"cols", m.cols}}; }
void from_json(const json& j, Resize& m) {
  FieldReader r(j, Resize::kType);
  r.required("rows", &m.rows);
  r.required("cols", &m.cols);
  r.no_others();
}

void to_json(json& j, const Detach&) { j = json::object(); }
void from_json(const json& j, Detach&) { FieldReader(j, Detach::kType).no_others(); }

void to_json(json& j, const Attached& m) { j = {{"tty", m.tty}, {"replay", m.replay}}; }
void from_json(const json& j, Attached& m) {
  FieldReader r(j, Attached::kType);
  r.required("tty", &m.tty);
  r.required("replay", &m.replay);
  r.no_others();
}

void to_json(json& j, const TakenOver&) { j = json::object(); }
void from_json(const json& j, TakenOver&) { FieldReader(j, TakenOver::kType).no_others(); }

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

}  // namespace openshell::protocol::attach
