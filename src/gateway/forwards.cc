// Port forwards: the host's BIND:PORT to 127.0.0.1:PORT inside a sandbox.
// The gateway keeps them (gateway.db) and tells the sandbox's supervisor,
// which binds the listeners and relays the bytes (the gateway stays out of
// the data path, so forwards outlive its restarts) and reports how each
// stands. A forward belongs to its sandbox: its owner's (or an admin's) to
// start, stop and see, and deleted with it.
#include <arpa/inet.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/text.h"
#include "gateway/service.h"

namespace openshell::gateway {

namespace session = protocol::session;

namespace {

// How long an add or a remove waits for the supervisor to say how the
// listener stands; after it, the answer says "pending".
constexpr auto kForwardReportTimeout = std::chrono::seconds(10);

// "127.0.0.1:8080", "[::1]:8080".
std::string address_of(const std::string& bind, uint16_t port) {
  const bool v6 = bind.find(':') != std::string::npos;
  return (v6 ? "[" + bind + "]" : bind) + ":" + std::to_string(port);
}

// An IP address in its canonical text ("::1", never "0:0::1"), or 400.
std::string canonical_bind(const std::string& bind) {
  unsigned char bytes[16];
  char text[INET6_ADDRSTRLEN] = {};
  if (::inet_pton(AF_INET, bind.c_str(), bytes) == 1) {
    ::inet_ntop(AF_INET, bytes, text, sizeof text);
    return text;
  }
  if (::inet_pton(AF_INET6, bind.c_str(), bytes) == 1) {
    ::inet_ntop(AF_INET6, bytes, text, sizeof text);
    return text;
  }
  throw ApiError(400, "invalid_forward",
                 "bind '" + bind + "': not an IP address (127.0.0.1, ::1, 0.0.0.0, ...)");
}

// {"bind": "127.0.0.1", "port": 8080}; bind defaults to 127.0.0.1.
ForwardRecord read_forward(const json& body) {
  if (!body.is_object())
    throw ApiError(400, "bad_request", "a forward is {\"bind\": ADDRESS, \"port\": PORT}");
  ForwardRecord f;
  f.bind = "127.0.0.1";
  if (body.contains("bind")) {
    if (!body["bind"].is_string()) throw ApiError(400, "invalid_forward", "bind must be a string");
    f.bind = canonical_bind(body["bind"].get<std::string>());
  }
  if (!body.contains("port") || !body["port"].is_number_integer() ||
      body["port"].get<int64_t>() < 1 || body["port"].get<int64_t>() > 65535)
    throw ApiError(400, "invalid_forward", "port must be a number from 1 to 65535");
  f.port = static_cast<uint16_t>(body["port"].get<int64_t>());
  f.created_ms = now_ms();
  return f;
}

bool running(Phase phase) {
  return phase == Phase::kReady || phase == Phase::kProvisioning || phase == Phase::kStarting;
}

const session::ForwardState* state_of(const std::vector<session::ForwardState>& states,
                                      const std::string& bind, uint16_t port) {
  for (const auto& s : states)
    if (s.bind == bind && s.port == port) return &s;
  return nullptr;
}

}  // namespace

json Gateway::forward_view(const ForwardRecord& f, const SandboxRecord& sandbox) const {
  json j = {{"sandbox", sandbox.name},
            {"bind", f.bind},
            {"port", f.port},
            {"address", address_of(f.bind, f.port)},
            {"created_at", time::format_ms(f.created_ms)}};
  // What a user needs to know: does it carry connections now, and if not, why.
  std::string state = "pending", message;
  if (!running(sandbox.phase)) {
    state = "stopped";
    message = "sandbox is " + std::string(phase_name(sandbox.phase));
  } else if (auto states = forward_states_.find(sandbox.id); states != forward_states_.end()) {
    if (const auto* s = state_of(states->second, f.bind, f.port)) {
      state = s->state;
      message = s->error;
    }
  }
  if (state == "pending" && sandbox.phase != Phase::kReady)
    message = "sandbox is " + std::string(phase_name(sandbox.phase));
  j["state"] = state;
  if (!message.empty()) j["message"] = message;
  return j;
}

std::vector<session::Forward> Gateway::session_forwards(const std::string& id) const {
  std::vector<session::Forward> out;
  for (const auto& f : store_->forwards_of(id)) out.push_back({f.bind, f.port});
  return out;
}

void Gateway::send_forwards(const std::string& id) {
  auto supervised = supervised_.find(id);
  if (supervised == supervised_.end() || !supervised->second.session) return;
  supervised->second.session->send(protocol::encode(session::Forwards{session_forwards(id)}),
                                   false);
}

void Gateway::await_forward_report(const std::string& id,
                                   std::function<bool(const ForwardStates&)> done,
                                   std::function<void(const ForwardStates*)> then) {
  auto timer = std::make_shared<asio::steady_timer>(io_, kForwardReportTimeout);
  forward_waiters_[id].push_back({std::move(done), std::move(then), timer});
  timer->async_wait([this, id, timer](const boost::system::error_code& ec) {
    if (ec) return;
    auto& list = forward_waiters_[id];
    for (auto it = list.begin(); it != list.end(); ++it)
      if (it->timer == timer) {
        auto then = std::move(it->then);
        list.erase(it);
        if (list.empty()) forward_waiters_.erase(id);
        return then(nullptr);
      }
  });
}

void Gateway::forward_report(const std::string& id, const ForwardStates& states) {
  forward_states_[id] = states;
  for (const auto& s : states)
    if (s.state == "error") log::warn("sandbox " + id + ": forward " + s.error);
  auto found = forward_waiters_.find(id);
  if (found == forward_waiters_.end()) return;
  std::vector<ForwardWaiter> ready;
  std::erase_if(found->second, [&](ForwardWaiter& w) {
    if (!w.done(states)) return false;
    ready.push_back(std::move(w));
    return true;
  });
  if (found->second.empty()) forward_waiters_.erase(found);
  for (auto& w : ready) {
    w.timer->cancel();
    w.then(&states);
  }
}

// The caller's forwards, of every sandbox of theirs; with all=1, an
// admin's view of everyone's.
void Gateway::list_all_forwards(const Call& call) {
  const net::Request& req = call.exchange->request();
  const bool all = req.query.count("all") && req.query.at("all") != "0";
  if (all && !call.who.admin)
    refuse(call, "admin_only",
           "the forwards of every principal (all=1, forward list --all) are for admins, and " +
               call.who.name + " is not one");
  json list = json::array();
  for (const auto& f : store_->forwards()) {
    auto sandbox = store_->find_by_id(f.sandbox_id);
    if (sandbox && (all || owner_of(*sandbox) == call.who.name))
      list.push_back(forward_view(f, *sandbox));
  }
  call.exchange->respond(json_response(200, {{"forwards", list}}));
}

void Gateway::list_forwards(const Call& call) {
  SandboxRecord sandbox = find(call.name);
  json list = json::array();
  for (const auto& f : store_->forwards_of(sandbox.id)) list.push_back(forward_view(f, sandbox));
  call.exchange->respond(json_response(200, {{"forwards", list}}));
}

std::vector<ForwardRecord> Gateway::forwards_to_create(const Call& call, const json& body) {
  std::vector<ForwardRecord> out;
  if (!body.contains("forwards")) return out;
  if (!body["forwards"].is_array())
    throw ApiError(400, "bad_request", "forwards must be a list of {\"bind\", \"port\"}");
  const auto taken = store_->forwards();
  for (const json& item : body["forwards"]) {
    ForwardRecord f = read_forward(item);
    const std::string where = address_of(f.bind, f.port);
    for (const auto& mine : out)
      if (mine.port == f.port)
        throw ApiError(
            409, "forward_exists",
            "--forward " + where + ": port " + std::to_string(f.port) + " is given twice");
    for (const auto& other : taken)
      if (other.bind == f.bind && other.port == f.port) {
        auto owner = store_->find_by_id(other.sandbox_id);
        throw ApiError(409, "forward_exists",
                       where + " is forwarded already" +
                           (owner && may_touch(call.who, owner_of(*owner))
                                ? " (to sandbox '" + owner->name + "')"
                                : std::string(" (by another principal's sandbox)")));
      }
    out.push_back(std::move(f));
  }
  return out;
}

// POST {"bind", "port"}: stored, given to the supervisor, and answered once
// it says whether the listener is up. One that cannot bind is not kept: the
// answer is the bind's failure (409 bind_failed).
void Gateway::add_forward(const Call& call) {
  json body = json::parse(call.exchange->request().body, nullptr, false);
  SandboxRecord sandbox = find(call.name);
  if (SandboxSpec::from_json(sandbox.spec).vm)
    throw ApiError(400, "unsupported",
                   "sandbox '" + sandbox.name +
                       "' is a micro-VM: port forwards into a micro-VM sandbox are not supported");
  if (sandbox.phase == Phase::kDeleting)
    throw ApiError(409, "wrong_phase", "sandbox '" + sandbox.name + "' is being deleted");
  std::vector<ForwardRecord> wanted =
      forwards_to_create(call, json{{"forwards", json::array({body})}});
  ForwardRecord f = wanted.front();
  f.sandbox_id = sandbox.id;
  for (const auto& mine : store_->forwards_of(sandbox.id))
    if (mine.port == f.port)
      throw ApiError(409, "forward_exists",
                     "sandbox '" + sandbox.name + "' forwards port " + std::to_string(f.port) +
                         " already (from " + address_of(mine.bind, mine.port) + ")");
  try {
    store_->insert_forward(f);
  } catch (const ForwardTaken& e) {
    throw ApiError(409, "forward_exists", e.what());
  }
  log::debug("forward " + address_of(f.bind, f.port) + " to sandbox '" + sandbox.name +
             "' added by " + call.who.name);
  const auto exchange = call.exchange;
  auto supervised = supervised_.find(sandbox.id);
  if (!running(sandbox.phase) || supervised == supervised_.end() || !supervised->second.session) {
    // It starts with the sandbox's next supervisor (its welcome).
    return exchange->respond(json_response(201, forward_view(f, sandbox)));
  }
  const std::string id = sandbox.id;
  await_forward_report(
      id, [f](const ForwardStates& states) { return state_of(states, f.bind, f.port) != nullptr; },
      [this, exchange, f, id](const ForwardStates* states) {
        auto now = store_->find_by_id(id);
        if (!now) return exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
        const session::ForwardState* s = states ? state_of(*states, f.bind, f.port) : nullptr;
        if (s && s->state == "error") {
          // Nothing kept that does not work: the caller hears why, at once.
          store_->remove_forward(id, f.port);
          send_forwards(id);
          return exchange->respond(error_response(409, "bind_failed", s->error));
        }
        exchange->respond(json_response(201, forward_view(f, *now)));
      });
  send_forwards(id);
}

// DELETE .../forwards/PORT: answered once the supervisor has closed the
// listener (or after a few seconds without its word).
void Gateway::remove_forward(const Call& call) {
  SandboxRecord sandbox = find(call.name);
  auto port = text::parse_uint(call.item, 65535);
  if (!port || *port == 0)
    throw ApiError(400, "invalid_forward",
                   "port '" + call.item + "': must be a number from 1 to 65535");
  std::optional<ForwardRecord> found;
  for (const auto& f : store_->forwards_of(sandbox.id))
    if (f.port == *port) found = f;
  if (!found)
    throw ApiError(404, "not_found",
                   "sandbox '" + sandbox.name + "' has no forward of port " + call.item);
  store_->remove_forward(sandbox.id, found->port);
  log::debug("forward " + address_of(found->bind, found->port) + " of sandbox '" + sandbox.name +
             "' removed by " + call.who.name);
  json answer = {{"deleted",
                  {{"sandbox", sandbox.name},
                   {"bind", found->bind},
                   {"port", found->port},
                   {"address", address_of(found->bind, found->port)}}}};
  auto supervised = supervised_.find(sandbox.id);
  if (supervised == supervised_.end() || !supervised->second.session)
    return call.exchange->respond(json_response(200, answer));
  const auto exchange = call.exchange;
  const ForwardRecord f = *found;
  await_forward_report(
      sandbox.id,
      [f](const ForwardStates& states) { return state_of(states, f.bind, f.port) == nullptr; },
      [exchange, answer](const ForwardStates*) { exchange->respond(json_response(200, answer)); });
  send_forwards(sandbox.id);
}

}  // namespace openshell::gateway
