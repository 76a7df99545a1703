#include <unistd.h>

#include <functional>
#include <string>
#include <vector>

#include "base/json_text.h"
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

// Every endpoint of the API, in one table: a new endpoint is a row here and
// a handler in the file of its resource.
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
  static const std::vector<Route> table = {
      {"GET", false, "/v1/health", plain(&Gateway::health)},
      {"GET", false, "/v1/gateway", plain(&Gateway::gateway_info)},
      {"POST", false, "/v1/gateway/stop", plain(&Gateway::stop_gateway)},
      {"GET", true, "/v1/supervisor/session", plain(&Gateway::session)},
      {"GET", true, "/v1/watch", plain(&Gateway::watch)},
      {"GET", false, "/v1/sandboxes", plain(&Gateway::list_sandboxes)},
      {"POST", false, "/v1/sandboxes", plain(&Gateway::create)},
      {"GET", false, "/v1/sandboxes/{name}", named(&Gateway::get_sandbox)},
      {"DELETE", false, "/v1/sandboxes/{name}", named(&Gateway::delete_sandbox)},
      {"POST", false, "/v1/sandboxes/{name}/start", named(&Gateway::start_sandbox)},
      {"POST", false, "/v1/sandboxes/{name}/stop", named(&Gateway::stop_sandbox)},
      {"GET", false, "/v1/sandboxes/{name}/wait", named(&Gateway::wait_exit)},
      {"GET", false, "/v1/sandboxes/{name}/logs", named(&Gateway::logs)},  // or a WebSocket
      {"GET", true, "/v1/sandboxes/{name}/exec", named(&Gateway::exec)},
      {"GET", false, "/v1/sandboxes/{name}/events", named(&Gateway::events)},
      {"GET", false, "/v1/sandboxes/{name}/policy", named(&Gateway::get_policy)},
      {"PUT", false, "/v1/sandboxes/{name}/policy", named(&Gateway::set_policy)},
      {"GET", false, "/v1/sandboxes/{name}/policies", named(&Gateway::list_policies)},
  };
  return table;
}

// Whether the path fits the pattern; its {name} goes to *name.
static bool path_matches(const std::vector<std::string>& path, const std::string& pattern,
                         std::string* name) {
  auto want = text::split(pattern, '/');
  if (want.size() != path.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == "{name}")
      *name = path[i];
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
  for (const Route& r : routes()) {
    Call call{exchange, ""};
    if (r.websocket ? !req.websocket : req.method != r.method) continue;
    if (!path_matches(parts, r.pattern, &call.name)) continue;
    return r.handler(*this, call);
  }
  throw ApiError(404, "not_found", "no such API path: " + req.method + " " + req.path);
}

void Gateway::health(const std::shared_ptr<net::Exchange>& exchange) {
  exchange->respond(json_response(200, {{"status", "ok"}, {"version", OPENSHELL_VERSION}}));
}

void Gateway::gateway_info(const std::shared_ptr<net::Exchange>& exchange) {
  json info = {{"version", OPENSHELL_VERSION},      {"pid", ::getpid()},
               {"gateway_id", gateway_id_},         {"started_at", time::format_ms(started_ms_)},
               {"state_dir", paths_.state_dir},     {"socket", paths_.socket()},
               {"sandboxes", store_->list().size()}};
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
