#include "protocol/supervisor_session.h"

namespace openshell::protocol::session {

void to_json(json& j, const Hello& m) { j = {{"launch", m.launch}, {"pid", m.pid}}; }
void from_json(const json& j, Hello& m) {
  FieldReader r(j, Hello::kType);
  r.required("launch", &m.launch);
  r.required("pid", &m.pid);
  r.no_others();
}

void to_json(json& j, const Status& m) {
  j = {{"generation", m.generation}, {"state", m.state}};
  if (m.init_pid) j["init_pid"] = *m.init_pid;
  if (m.exit_code) j["exit_code"] = *m.exit_code;
  if (!m.running()) {
    j["reason"] = m.reason;
    j["message"] = m.message;
  }
}

void from_json(const json& j, Status& m) {
  FieldReader r(j, Status::kType);
  r.required("generation", &m.generation);
  r.required("state", &m.state);
  if (m.state == "running" || m.state == "starting") {
    r.required("init_pid", &m.init_pid);
  } else if (m.state == "exited" || m.state == "stopped") {
    r.required("exit_code", &m.exit_code);
    r.required("reason", &m.reason);
    r.required("message", &m.message);
  } else {
    throw ProtocolError(
        "\"status\" message: field \"state\" must be starting, running, exited or stopped");
  }
  r.no_others();
}

void to_json(json& j, const PolicyApplied& m) {
  j = {{"revision", m.revision}};
  if (m.error) j["error"] = *m.error;
}
void from_json(const json& j, PolicyApplied& m) {
  FieldReader r(j, PolicyApplied::kType);
  r.required("revision", &m.revision);
  r.optional("error", &m.error);
  r.no_others();
}

void to_json(json& j, const Credential& m) {
  j = {{"key", m.key}, {"value", m.value}, {"endpoints", m.endpoints}};
}

// The optional "credentials" field, each item checked field by field.
static std::vector<Credential> read_credentials(FieldReader& r, const char* type) {
  std::vector<Credential> out;
  const json* list = r.raw("credentials");
  if (!list) return out;
  const std::string what = std::string("\"") + type + "\" message: field \"credentials\"";
  if (!list->is_array()) throw ProtocolError(what + " must be a list");
  for (const json& item : *list) {
    FieldReader c(item, std::string(type) + " credential");
    Credential credential;
    c.required("key", &credential.key);
    c.required("value", &credential.value);
    c.required("endpoints", &credential.endpoints);
    c.no_others();
    out.push_back(std::move(credential));
  }
  return out;
}

void to_json(json& j, const Credentials& m) { j = {{"credentials", m.credentials}}; }
void from_json(const json& j, Credentials& m) {
  FieldReader r(j, Credentials::kType);
  m.credentials = read_credentials(r, Credentials::kType);
  r.no_others();
}

void to_json(json& j, const Forward& m) { j = {{"bind", m.bind}, {"port", m.port}}; }

// The optional "forwards" field, each item checked field by field.
static std::vector<Forward> read_forwards(FieldReader& r, const char* type) {
  std::vector<Forward> out;
  const json* list = r.raw("forwards");
  if (!list) return out;
  if (!list->is_array())
    throw ProtocolError(std::string("\"") + type + "\" message: field \"forwards\" must be a list");
  for (const json& item : *list) {
    FieldReader f(item, std::string(type) + " forward");
    Forward forward;
    f.required("bind", &forward.bind);
    f.required("port", &forward.port);
    f.no_others();
    if (forward.port == 0)
      throw ProtocolError(std::string("\"") + type + " forward\" message: port 0");
    out.push_back(std::move(forward));
  }
  return out;
}

void to_json(json& j, const Forwards& m) { j = {{"forwards", m.forwards}}; }
void from_json(const json& j, Forwards& m) {
  FieldReader r(j, Forwards::kType);
  if (!r.raw("forwards")) throw ProtocolError("\"forwards\" message: missing field \"forwards\"");
  m.forwards = read_forwards(r, Forwards::kType);
  r.no_others();
}

void to_json(json& j, const ForwardState& m) {
  j = {{"bind", m.bind}, {"port", m.port}, {"state", m.state}};
  if (!m.error.empty()) j["error"] = m.error;
}
void to_json(json& j, const ForwardStates& m) { j = {{"forwards", m.forwards}}; }
void from_json(const json& j, ForwardStates& m) {
  FieldReader r(j, ForwardStates::kType);
  const json* list = r.raw("forwards");
  if (!list) throw ProtocolError("\"forward_states\" message: missing field \"forwards\"");
  if (!list->is_array())
    throw ProtocolError("\"forward_states\" message: field \"forwards\" must be a list");
  for (const json& item : *list) {
    FieldReader f(item, "forward_states forward");
    ForwardState state;
    f.required("bind", &state.bind);
    f.required("port", &state.port);
    f.required("state", &state.state);
    f.optional("error", &state.error);
    f.no_others();
    if (state.state != "listening" && state.state != "error")
      throw ProtocolError(
          "\"forward_states forward\" message: field \"state\" must be listening or error");
    m.forwards.push_back(std::move(state));
  }
  r.no_others();
}

// Without providers or forwards, a welcome as before them (an older
// supervisor reads it).
void to_json(json& j, const Welcome& m) {
  j = {{"env", m.env}};
  if (!m.credentials.empty()) j["credentials"] = m.credentials;
  if (!m.forwards.empty()) j["forwards"] = m.forwards;
  if (!m.ca_key.empty()) j["ca"] = {{"cert", m.ca_cert}, {"key", m.ca_key}};
}
void from_json(const json& j, Welcome& m) {
  FieldReader r(j, Welcome::kType);
  r.required("env", &m.env);
  m.credentials = read_credentials(r, Welcome::kType);
  m.forwards = read_forwards(r, Welcome::kType);
  if (const json* ca = r.raw("ca")) {
    FieldReader c(*ca, "welcome ca");
    c.required("cert", &m.ca_cert);
    c.required("key", &m.ca_key);
    c.no_others();
  }
  r.no_others();
}

void to_json(json& j, const Superseded& m) { j = {{"message", m.message}}; }
void from_json(const json& j, Superseded& m) {
  FieldReader r(j, Superseded::kType);
  r.required("message", &m.message);
  r.no_others();
}

void to_json(json& j, const Rejected& m) { j = {{"message", m.message}}; }
void from_json(const json& j, Rejected& m) {
  FieldReader r(j, Rejected::kType);
  r.required("message", &m.message);
  r.no_others();
}

void to_json(json& j, const Stop& m) { j = {{"grace_ms", m.grace_ms}}; }
void from_json(const json& j, Stop& m) {
  FieldReader r(j, Stop::kType);
  r.required("grace_ms", &m.grace_ms);
  r.no_others();
  if (m.grace_ms < 0) throw ProtocolError("\"stop\" message: field \"grace_ms\" is negative");
}

void to_json(json& j, const Policy& m) { j = {{"revision", m.revision}, {"text", m.text}}; }
void from_json(const json& j, Policy& m) {
  FieldReader r(j, Policy::kType);
  r.required("revision", &m.revision);
  r.required("text", &m.text);
  r.no_others();
}

std::string encode_exit_file(const Status& status) { return json_text(json(status)); }

Status decode_exit_file(std::string_view text) {
  try {
    json j = json::parse(text, nullptr, false);
    if (j.is_discarded()) throw ProtocolError("not JSON");
    return j.get<Status>();
  } catch (const ProtocolError& e) {
    throw ProtocolError(std::string("exit file: ") + e.what());
  }
}

}  // namespace openshell::protocol::session
