#include "base/text.h"
#include "gateway/service.h"
#include "policy/edit.h"
#include "policy/policy.h"
#include "spec/container_spec.h"

namespace openshell::gateway {

// ---- policies ---------------------------------------------------------------

static json policy_view(const SandboxRecord& record, const PolicyRevision& p, int64_t current) {
  // An empty text is the default policy: show it as such.
  std::string text = p.text.empty() ? policy::to_toml(policy::default_policy()) : p.text;
  return json{{"sandbox", record.name},
              {"revision", p.revision},
              {"current", p.revision == current},
              {"default", p.text.empty()},
              {"created_at", time::format_ms(p.created_ms)},
              {"policy", text}};
}

void Gateway::get_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  SandboxRecord record = find(name);
  const auto& q = exchange->request().query;
  int64_t revision = 0;
  if (q.count("rev")) {
    auto value = text::parse_uint(q.at("rev"), INT32_MAX);
    if (!value || *value == 0) throw ApiError(400, "bad_request", "rev must be a positive number");
    revision = static_cast<int64_t>(*value);
  }
  auto current = store_->policy(record.id, 0);
  auto p = store_->policy(record.id, revision);
  if (!p)
    throw ApiError(404, "not_found",
                   "sandbox '" + name + "' has no policy revision " + std::to_string(revision));
  exchange->respond(json_response(200, policy_view(record, *p, current ? current->revision : 0)));
}

void Gateway::list_policies(const std::shared_ptr<net::Exchange>& exchange,
                            const std::string& name) {
  SandboxRecord record = find(name);
  auto all = store_->policies(record.id);
  json list = json::array();
  for (const auto& p : all) {
    json v = policy_view(record, p, all.empty() ? 0 : all.back().revision);
    v.erase("policy");
    list.push_back(v);
  }
  exchange->respond(json_response(200, {{"sandbox", record.name}, {"revisions", list}}));
}

// The parts fixed at a sandbox's start that a new policy text would change,
// each policy taken as the sandbox would run with it.
static std::vector<std::string> static_policy_changes(const SandboxSpec& spec,
                                                      const std::string& text,
                                                      const std::string& source) {
  SandboxSpec next = spec;
  next.policy = text;
  next.policy_source = source;
  policy::Policy now;
  try {
    now = spec::effective_policy(spec, spec::Placement{});
  } catch (const Error&) {
    return {};  // a stored text this version cannot read: nothing to compare, nothing to keep
  }
  return policy::static_differences(now, spec::effective_policy(next, spec::Placement{}));
}

// A new revision: validated, stored, and (the network part) applied to the
// running sandbox before the answer; the rest applies from the next start.
void Gateway::set_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  SandboxRecord record = find(name);
  json body = json::parse(exchange->request().body, nullptr, false);
  if (!body.is_object() || !body.contains("policy") || !body["policy"].is_string())
    throw ApiError(400, "bad_request", "the body must be {\"policy\": \"TOML text\"}");
  std::string text = body["policy"].get<std::string>();
  std::string source = body.value("source", std::string("policy"));
  try {
    policy::parse(text, source);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_policy", e.what());
  }
  bool at_next_start = body.value("at_next_start", false);
  SandboxSpec spec = SandboxSpec::from_json(record.spec);
  auto live = supervised_.find(record.id);
  bool running = live != supervised_.end() && live->second.session && record.phase == Phase::kReady;
  // What a running sandbox cannot take now is refused unless asked for later.
  std::vector<std::string> pending;
  if (running) pending = static_policy_changes(spec, text, source);
  if (!pending.empty() && !at_next_start)
    throw ApiError(409, "static_change",
                   "sandbox '" + name + "' is running, and its " + text::join(pending, ", ") +
                       " would change, which applies only at its next start: give "
                       "--at-next-start (at_next_start in the API) to store the revision for "
                       "then; its network part applies at once");
  int64_t revision = store_->add_policy(record.id, text, now_ms());
  spec.policy = text;
  spec.policy_source = source;
  record.spec = spec.to_json();
  save(record);
  auto respond = [this, exchange, id = record.id, revision, pending](bool applied,
                                                                     const std::string& error) {
    auto r = store_->find_by_id(id);
    json out = {{"revision", revision}, {"applied", applied}};
    if (!pending.empty()) out["at_next_start"] = pending;
    if (!error.empty()) out["error"] = error;
    if (r) out["sandbox"] = view(*r);
    exchange->respond(json_response(200, out));
  };
  if (!running) return respond(false, "");  // takes effect at the next start
  auto s = live;
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::seconds(5));
  policy_acks_[{record.id, revision}] = [respond,
                                         timer](const protocol::session::PolicyApplied& ack) {
    timer->cancel();
    respond(!ack.error, ack.error.value_or(""));
  };
  timer->async_wait([this, id = record.id, revision, respond](const boost::system::error_code& ec) {
    if (ec) return;
    policy_acks_.erase({id, revision});
    respond(false, "the sandbox's supervisor did not acknowledge the policy");
  });
  s->second.session->send(protocol::encode(protocol::session::Policy{revision, text}), false);
}

}  // namespace openshell::gateway
