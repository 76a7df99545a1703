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

}  // namespace openshell::protocol::attach
