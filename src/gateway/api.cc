#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <string>
#include <vector>

#include "base/json_text.h"
#include "base/log.h"
#include "base/text.h"
#include "gateway/service.h"

namespace openshell::gateway {

static json error_body(const std::string& code, const std::string& message) {
  return json{{"error", {{"code", code}, {"message", message}}}};
}

net::Response error_response(int status, const std::string& code, const std::string& message) {
  return net::Response{status, json_text(error_body(code, message)) + "\n", "application/json"};
}

net::Response json_response(int status, const json& body) {
  return net::Response{status, json_text(body) + "\n", "application/json"};
}

// ---- the API ----------------------------------------------------------------

void Gateway::handle(std::shared_ptr<net::Exchange> exchange) {
  try {
    route(exchange);
  } catch (const ApiError& e) {
    exchange->respond(error_response(e.status, e.code, e.what()));
  } catch (const NameTaken& e) {
    exchange->respond(error_response(409, "name_taken", e.what()));
  } catch (const Error& e) {
    exchange->respond(error_response(500, "internal", e.what()));
  } catch (const std::exception& e) {
    exchange->respond(error_response(400, "bad_request", e.what()));
  }
}

// Every endpoint of the API, in one table, with who may call it: a new
// endpoint is a row here and a handler in the file of its resource.
const std::vector<Gateway::Route>& Gateway::routes() {
  using Handler = std::function<void(Gateway&, const Call&)>;
  // A handler of the sandbox the path names.
  auto named = [](void (Gateway::*handler)(const std::shared_ptr<net::Exchange>&,
                                           const std::string&)) -> Handler {
    return [handler](Gateway& g, const Call& call) { (g.*handler)(call.exchange, call.name); };
  };
  auto plain = [](void (Gateway::*handler)(const std::shared_ptr<net::Exchange>&)) -> Handler {
    return [handler](Gateway& g, const Call& call) { (g.*handler)(call.exchange); };
  };
  auto called = [](void (Gateway::*handler)(const Call&)) -> Handler {
    return [handler](Gateway& g, const Call& call) { (g.*handler)(call); };
  };
  using A = Access;
  static const std::vector<Route> table = {
      {"GET", false, "/v1/health", A::kAnyone, plain(&Gateway::health)},
      {"GET", false, "/v1/whoami", A::kAnyone, called(&Gateway::whoami)},
      {"GET", false, "/v1/gateway", A::kAnyone, called(&Gateway::gateway_info)},
      {"POST", false, "/v1/gateway/stop", A::kAdmin, plain(&Gateway::stop_gateway)},
      {"GET", true, "/v1/supervisor/session", A::kSupervisor, plain(&Gateway::session)},
      {"GET", true, "/v1/watch", A::kAnyone, called(&Gateway::watch)},
      {"GET", false, "/v1/sandboxes", A::kAnyone, called(&Gateway::list_sandboxes)},
      {"POST", false, "/v1/sandboxes", A::kAnyone, called(&Gateway::create)},
      {"GET", false, "/v1/sandboxes/{name}", A::kOwner, named(&Gateway::get_sandbox)},
      {"DELETE", false, "/v1/sandboxes/{name}", A::kOwner, named(&Gateway::delete_sandbox)},
      // Many at once: each name is checked as the route above checks its one.
      {"POST", false, "/v1/sandboxes:batchDelete", A::kAnyone, called(&Gateway::delete_sandboxes)},
      {"POST", false, "/v1/sandboxes/{name}/start", A::kOwner, called(&Gateway::start_sandbox)},
      {"POST", false, "/v1/sandboxes/{name}/stop", A::kOwner, named(&Gateway::stop_sandbox)},
      {"GET", false, "/v1/sandboxes/{name}/wait", A::kOwner, named(&Gateway::wait_exit)},
      // logs: a plain request, or a WebSocket that follows them
      {"GET", false, "/v1/sandboxes/{name}/logs", A::kOwner, named(&Gateway::logs)},
      // exec, and so upload and download (a tar run in the sandbox)
      {"GET", true, "/v1/sandboxes/{name}/exec", A::kOwner, called(&Gateway::exec)},
      // connect: the main process's console
      {"GET", true, "/v1/sandboxes/{name}/attach", A::kOwner, called(&Gateway::attach)},
      {"GET", false, "/v1/sandboxes/{name}/events", A::kOwner, named(&Gateway::events)},
      {"GET", false, "/v1/sandboxes/{name}/policy", A::kOwner, named(&Gateway::get_policy)},
      {"PUT", false, "/v1/sandboxes/{name}/policy", A::kOwner, named(&Gateway::set_policy)},
      {"GET", false, "/v1/sandboxes/{name}/policies", A::kOwner, named(&Gateway::list_policies)},
      {"POST", false, "/v1/sandboxes/{name}/commit", A::kOwner, called(&Gateway::commit_sandbox)},
      // Providers: anyone sees their names, keys and endpoints, never a
      // value; only admins make, change or attach them (a credential is the
      // gateway's to lend).
      {"GET", false, "/v1/providers", A::kAnyone, called(&Gateway::list_providers)},
      {"POST", false, "/v1/providers", A::kAdmin, called(&Gateway::create_provider)},
      {"GET", false, "/v1/providers/{name}", A::kAnyone, called(&Gateway::get_provider)},
      {"PATCH", false, "/v1/providers/{name}", A::kAdmin, called(&Gateway::update_provider)},
      {"DELETE", false, "/v1/providers/{name}", A::kAdmin, called(&Gateway::delete_provider)},
      {"POST", false, "/v1/sandboxes/{name}/providers", A::kAdmin,
       called(&Gateway::attach_provider)},
      {"DELETE", false, "/v1/sandboxes/{name}/providers", A::kAdmin,
       called(&Gateway::detach_provider)},
      // Port forwards (forwards.cc): the sandbox's owner's, like the sandbox.
      {"GET", false, "/v1/forwards", A::kAnyone, called(&Gateway::list_all_forwards)},
      {"GET", false, "/v1/sandboxes/{name}/forwards", A::kOwner, called(&Gateway::list_forwards)},
      {"POST", false, "/v1/sandboxes/{name}/forwards", A::kOwner, called(&Gateway::add_forward)},
      {"DELETE", false, "/v1/sandboxes/{name}/forwards/{port}", A::kOwner,
       called(&Gateway::remove_forward)},
  };
  return table;
}

// Whether the path fits the pattern; its {name} goes to *name, another
// {...} (the {port} of a forward) to *item.
static bool path_matches(const std::vector<std::string>& path, const std::string& pattern,
                         std::string* name, std::string* item) {
  auto want = text::split(pattern, '/');
  if (want.size() != path.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == "{name}")
      *name = path[i];
    else if (want[i].starts_with("{"))
      *item = path[i];
    else if (want[i] != path[i])
      return false;
  }
  return true;
}

void Gateway::route(const std::shared_ptr<net::Exchange>& exchange) {
  const net::Request& req = exchange->request();
  auto parts = text::split(req.path, '/');  // "", "v1", ...
  if (parts.size() < 2 || parts[1] != "v1")
    throw ApiError(404, "not_found", "no such API path: " + req.path);
  // Who calls is asked once (it reads /etc/passwd), not once per route tried.
  const Principal who = principal_of(exchange->peer(), ::geteuid());
  for (const Route& r : routes()) {
    if (r.websocket ? !req.websocket : req.method != r.method) continue;
    Call call{exchange, "", "", who};
    if (!path_matches(parts, r.pattern, &call.name, &call.item)) continue;
    authorize(r, call);
    return r.handler(*this, call);
  }
  throw ApiError(404, "not_found", "no such API path: " + req.method + " " + req.path);
}

// The one check of who may call what, before any handler runs.
void Gateway::authorize(const Route& route, Call& call) {
  // A verified certificate always names someone; an empty name would pass
  // for the owner of the sandboxes that predate owners.
  if (call.who.name.empty())
    refuse(call, "no_principal", "the request's peer has no principal name");
  switch (route.access) {
    case Access::kAnyone:
      return;
    case Access::kAdmin:
      if (!call.who.admin)
        refuse(call, "admin_only",
               call.exchange->request().method + " " + route.pattern + " is for admins, and " +
                   call.who.name + " is not one");
      return;
    case Access::kSupervisor:
      if (!call.who.unix_peer)
        refuse(call, "unix_only", "a supervisor's session is opened on the gateway's Unix socket");
      return;
    case Access::kOwner:
      call.record = owned(call, call.name);
      return;
  }
}

SandboxRecord Gateway::owned(const Call& call, const std::string& name) {
  SandboxRecord record = find(name);  // 404 first: the name is global anyway
  if (!may_touch(call.who, owner_of(record))) {
    Call named = call;
    named.name = name;
    refuse(named, "not_owner",
           "sandbox '" + name + "' is not " + call.who.name +
               "'s (only its owner or an admin may see or touch it)");
  }
  return record;
}

std::string Gateway::owner_of(const SandboxRecord& record) const {
  // The gateway never changes its ids: asked once, not for each sandbox of
  // a list.
  static const uid_t euid = ::geteuid();
  return effective_owner(record.owner, euid);
}

void Gateway::refuse(const Call& call, const std::string& code, const std::string& message) {
  const net::Request& req = call.exchange->request();
  const net::PeerCredentials peer = call.exchange->peer();
  json entry = {{"time", time::format_ms(now_ms())},
                {"principal", call.who.name},
                {"admin", call.who.admin},
                {"transport", call.who.transport},
                {"method", req.method},
                {"path", req.path},
                {"status", 403},
                {"code", code},
                {"message", message}};
  if (call.who.unix_peer) {
    entry["uid"] = peer.uid;
    entry["pid"] = peer.pid;
  } else if (!peer.address.empty()) {
    entry["address"] = peer.address;
  }
  log::warn("refused " + req.method + " " + req.path + " to " + call.who.name + " (" +
            call.who.transport + "): " + code + ": " + message);
  // One write of a whole line: lines of concurrent appends never mix.
  const std::string path = paths_.state_dir + "/audit.log";
  const std::string line = json_text(entry) + "\n";
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600));
  if (!fd || ::write(fd.get(), line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    log::error(errno_message("append to " + path, errno));
  throw ApiError(403, code, message);
}

void Gateway::whoami(const Call& call) {
  call.exchange->respond(json_response(200, {{"principal", call.who.name},
                                             {"admin", call.who.admin},
                                             {"transport", call.who.transport}}));
}

void Gateway::health(const std::shared_ptr<net::Exchange>& exchange) {
  exchange->respond(json_response(200, {{"status", "ok"}, {"version", OPENSHELL_VERSION}}));
}

void Gateway::gateway_info(const Call& call) {
  const std::shared_ptr<net::Exchange>& exchange = call.exchange;
  // How many sandboxes the caller may see: an admin, every one.
  size_t visible = 0;
  for (const auto& r : store_->list())
    if (may_touch(call.who, owner_of(r))) ++visible;
  json info = {{"version", OPENSHELL_VERSION},  {"pid", ::getpid()},
               {"gateway_id", gateway_id_},     {"started_at", time::format_ms(started_ms_)},
               {"state_dir", paths_.state_dir}, {"socket", paths_.socket()},
               {"sandboxes", visible}};
  json listeners = json::array();
  for (const auto& listener : server_.listeners())
    listeners.push_back({{"kind", listener.kind}, {"address", listener.address}});
  info["listeners"] = listeners;
  try {
    info["config"] = config().view();
  } catch (const ApiError& e) {
    info["config"] = config_.view();  // what holds until the file is right again
    info["config"]["error"] = e.what();
  }
  exchange->respond(json_response(200, info));
}

void Gateway::stop_gateway(const std::shared_ptr<net::Exchange>& exchange) {
  exchange->respond(json_response(202, {{"stopping", true}}));
  asio::post(io_, [this] { shutdown(); });
}

}  // namespace openshell::gateway
