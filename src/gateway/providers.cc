// Providers: credentials that a sandbox's requests may carry while the
// sandbox holds only placeholders (KEY=openshell:resolve:env:KEY). The
// values rest sealed in gateway.db (store.h), reach a sandbox's supervisor
// only over its session (the welcome, then a credentials message on every
// change), and appear in no answer of the API, no event and no log.
#include <algorithm>
#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/text.h"
#include "gateway/service.h"

namespace openshell::gateway {

namespace {

constexpr std::string_view kPlaceholderPrefix = "openshell:resolve:env:";

struct ProviderType {
  std::string_view name;
  std::vector<std::string> endpoints;  // the service's own, when none is given
};

const std::vector<ProviderType>& provider_types() {
  static const std::vector<ProviderType> types = {
      {"generic", {}},
      {"github", {"api.github.com:443", "github.com:443"}},
      {"anthropic", {"api.anthropic.com:443"}},
      {"openai", {"api.openai.com:443"}},
  };
  return types;
}

// An environment variable's name: a letter or '_', then letters, digits, '_'.
bool is_env_name(std::string_view key) {
  if (key.empty() || std::isdigit(static_cast<unsigned char>(key[0]))) return false;
  return std::all_of(key.begin(), key.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
}

// HOST:PORT, a DNS name or IPv4 address and a port from 1 to 65535.
bool is_endpoint(std::string_view endpoint) {
  size_t colon = endpoint.rfind(':');
  if (colon == std::string_view::npos || colon == 0) return false;
  std::string_view host = endpoint.substr(0, colon);
  auto port = text::parse_uint(endpoint.substr(colon + 1), 65535);
  if (!port || *port == 0 || host.size() > 253) return false;
  for (const auto& label : text::split(std::string(host), '.'))
    if (label.empty() || label.size() > 63 || !std::all_of(label.begin(), label.end(), [](char c) {
          return std::isalnum(static_cast<unsigned char>(c)) || c == '-';
        }))
      return false;
  return true;
}

std::string placeholder(const std::string& key) { return std::string(kPlaceholderPrefix) + key; }

// The record's fields from a create's or an update's body; keys and
// endpoints checked. Values are never quoted in an error.
void read_fields(const json& body, ProviderRecord* record, bool creating) {
  if (body.contains("type")) {
    if (!body["type"].is_string()) throw ApiError(400, "bad_request", "type must be a string");
    record->type = body["type"].get<std::string>();
  }
  auto type = std::find_if(provider_types().begin(), provider_types().end(),
                           [&](const ProviderType& t) { return t.name == record->type; });
  if (type == provider_types().end())
    throw ApiError(
        400, "invalid_type",
        "unknown provider type '" + record->type + "' (one of generic, github, anthropic, openai)");
  if (body.contains("credentials")) {
    const json& given = body["credentials"];
    if (!given.is_object())
      throw ApiError(400, "bad_request", "credentials must be an object of KEY: value");
    for (const auto& [key, value] : given.items()) {
      if (!is_env_name(key))
        throw ApiError(400, "invalid_key",
                       "credential key '" + key +
                           "' is not an environment variable's name (letters, digits and '_', "
                           "not starting with a digit)");
      if (!value.is_string())
        throw ApiError(400, "bad_request", "credential " + key + ": the value must be a string");
      record->credentials[key] = value.get<std::string>();
    }
  }
  if (creating && record->credentials.empty())
    throw ApiError(400, "bad_request", "provider '" + record->name + "' has no credential");
  if (body.contains("endpoints")) {
    const json& given = body["endpoints"];
    if (!given.is_array()) throw ApiError(400, "bad_request", "endpoints must be a list");
    record->endpoints.clear();
    for (const json& e : given) {
      if (!e.is_string() || !is_endpoint(e.get<std::string>()))
        throw ApiError(400, "invalid_endpoint",
                       "endpoint '" + (e.is_string() ? e.get<std::string>() : e.dump()) +
                           "' is not HOST:PORT");
      record->endpoints.push_back(e.get<std::string>());
    }
  }
  if (record->endpoints.empty()) record->endpoints = type->endpoints;
  if (record->endpoints.empty())
    throw ApiError(400, "invalid_endpoint",
                   "a " + record->type + " provider needs at least one endpoint (HOST:PORT)");
}

}  // namespace

json Gateway::provider_view(const ProviderRecord& record) const {
  json keys = json::array();
  for (const auto& [key, value] : record.credentials) keys.push_back(key);
  json sandboxes = json::array();
  for (const auto& id : store_->sandboxes_of(record.name))
    if (auto sandbox = store_->find_by_id(id)) sandboxes.push_back(sandbox->name);
  return json{{"name", record.name},
              {"type", record.type},
              {"credentials", keys},
              {"endpoints", record.endpoints},
              {"sandboxes", sandboxes},
              {"created_at", time::format_ms(record.created_ms)},
              {"updated_at", time::format_ms(record.updated_ms)}};
}

ProviderRecord Gateway::find_provider(const std::string& name) const {
  auto record = store_->find_provider(name);
  if (!record) throw ApiError(404, "not_found", "no provider named '" + name + "'");
  return *record;
}

std::vector<protocol::session::Credential> Gateway::credentials_of(const std::string& id) const {
  std::vector<protocol::session::Credential> out;
  for (const auto& name : store_->providers_of(id))
    if (auto provider = store_->find_provider(name))
      for (const auto& [key, value] : provider->credentials)
        out.push_back({key, value, provider->endpoints});
  return out;
}

void Gateway::sync_placeholders(SandboxRecord& record) {
  std::set<std::string> keys;
  for (const auto& c : credentials_of(record.id)) keys.insert(c.key);
  SandboxSpec spec = SandboxSpec::from_json(record.spec);
  std::vector<std::string> env;
  // The caller's own entries stay, but for a key a provider now holds;
  // placeholders of keys no longer attached go.
  for (const auto& entry : spec.env) {
    const std::string key = entry.substr(0, entry.find('='));
    const bool ours = entry.substr(key.size()).starts_with("=" + std::string(kPlaceholderPrefix));
    if (keys.count(key) || ours) continue;
    env.push_back(entry);
  }
  for (const auto& key : keys) env.push_back(key + "=" + placeholder(key));
  if (env == spec.env) return;
  spec.env = std::move(env);
  record.spec = spec.to_json();
  save(record);
}

void Gateway::send_credentials(const std::string& id) {
  auto supervised = supervised_.find(id);
  if (supervised == supervised_.end() || !supervised->second.session) return;
  supervised->second.session->send(
      protocol::encode(protocol::session::Credentials{credentials_of(id)}), false);
}

void Gateway::attach_providers(SandboxRecord& record, const std::vector<std::string>& names) {
  for (const auto& name : names) find_provider(name);  // all known, or none attached
  for (const auto& name : names) store_->attach_provider(record.id, name);
}

void Gateway::list_providers(const Call& call) {
  json items = json::array();
  for (const auto& record : store_->providers()) items.push_back(provider_view(record));
  call.exchange->respond(json_response(200, {{"providers", items}}));
}

void Gateway::get_provider(const Call& call) {
  call.exchange->respond(json_response(200, provider_view(find_provider(call.name))));
}

void Gateway::create_provider(const Call& call) {
  json body = json::parse(call.exchange->request().body, nullptr, false);
  if (!body.is_object()) throw ApiError(400, "bad_request", "the body must be a JSON object");
  ProviderRecord record;
  record.name = body.value("name", "");
  if (!text::is_dns_label(record.name))
    throw ApiError(400, "invalid_name",
                   "provider name '" + record.name +
                       "': must be a DNS label (a-z, 0-9 and '-', at most 63, not starting or "
                       "ending with '-')");
  if (!body.contains("type")) throw ApiError(400, "invalid_type", "a provider needs a type");
  read_fields(body, &record, true);
  record.created_ms = record.updated_ms = now_ms();
  try {
    store_->insert_provider(record);
  } catch (const ProviderTaken& e) {
    throw ApiError(409, "exists", e.what());
  }
  log::debug("provider '" + record.name + "' created by " + call.who.name);
  call.exchange->respond(json_response(201, provider_view(record)));
}

void Gateway::update_provider(const Call& call) {
  json body = json::parse(call.exchange->request().body, nullptr, false);
  if (!body.is_object()) throw ApiError(400, "bad_request", "the body must be a JSON object");
  ProviderRecord record = find_provider(call.name);
  if (body.contains("type")) throw ApiError(400, "bad_request", "a provider's type is fixed");
  read_fields(body, &record, false);
  record.updated_ms = now_ms();
  store_->update_provider(record);
  log::debug("provider '" + record.name + "' updated by " + call.who.name);
  // The running supervisors get the new values now; new keys get their
  // placeholders at the next launch (sync_placeholders).
  for (const auto& id : store_->sandboxes_of(record.name)) send_credentials(id);
  call.exchange->respond(json_response(200, provider_view(record)));
}

void Gateway::delete_provider(const Call& call) {
  ProviderRecord record = find_provider(call.name);
  std::vector<std::string> names;
  for (const auto& id : store_->sandboxes_of(record.name))
    if (auto sandbox = store_->find_by_id(id)) names.push_back(sandbox->name);
  if (!names.empty())
    throw ApiError(409, "attached",
                   "provider '" + record.name + "' is attached to " + text::join(names, ", ") +
                       " (detach it first)");
  store_->remove_provider(record.name);
  log::debug("provider '" + record.name + "' deleted by " + call.who.name);
  call.exchange->respond(json_response(200, {{"deleted", record.name}}));
}

// POST /v1/sandboxes/{name}/providers {"provider": N}; DELETE ...?provider=N.
void Gateway::attach_provider(const Call& call) {
  json body = json::parse(call.exchange->request().body, nullptr, false);
  if (!body.is_object() || !body.contains("provider") || !body["provider"].is_string())
    throw ApiError(400, "bad_request", "the body must be {\"provider\": NAME}");
  SandboxRecord record = find(call.name);
  attach_providers(record, {body["provider"].get<std::string>()});
  send_credentials(record.id);
  call.exchange->respond(json_response(200, view(record)));
}

void Gateway::detach_provider(const Call& call) {
  const auto& query = call.exchange->request().query;
  if (!query.count("provider"))
    throw ApiError(400, "bad_request", "which provider: ?provider=NAME");
  const std::string& provider = query.at("provider");
  SandboxRecord record = find(call.name);
  const auto attached = store_->providers_of(record.id);
  if (std::find(attached.begin(), attached.end(), provider) == attached.end())
    throw ApiError(404, "not_found",
                   "provider '" + provider + "' is not attached to sandbox '" + call.name + "'");
  store_->detach_provider(record.id, provider);
  send_credentials(record.id);
  call.exchange->respond(json_response(200, view(record)));
}

}  // namespace openshell::gateway
