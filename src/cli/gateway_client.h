// The command line's side of the gateway's API: a connection to the chosen
// gateway (cli/gateway_registry.h; the local one is started in the
// background when its socket is absent), JSON requests, and errors turned
// into one clear line.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/paths.h"
#include "cli/gateway_registry.h"

namespace openshell::net {
class Client;
struct Response;
}  // namespace openshell::net

namespace openshell::cli {

// A request the gateway refused: its message, HTTP status and error code
// ("image_not_found").
class GatewayError : public Error {
 public:
  GatewayError(const std::string& message, int status, std::string code)
      : Error(message), status_(status), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& code() const { return code_; }

 private:
  int status_;
  std::string code_;
};

class GatewayClient {
 public:
  // Connects to the chosen gateway (chosen_gateway()). Only the local
  // default, this OPENSHELL_HOME's socket, is started when no gateway
  // listens (autostart); a gateway asked for by name or URL never is.
  // Throws Error.
  explicit GatewayClient(bool autostart = true);
  GatewayClient(GatewayChoice choice, bool autostart);
  // The same, with the connection made (and the gateway started) only when
  // a request needs it: a command that goes straight to a stream (exec)
  // opens no request connection it would not use.
  struct Deferred {};
  explicit GatewayClient(Deferred);
  ~GatewayClient();

  // A JSON request; a non-2xx answer throws GatewayError with the gateway's
  // message. keep, when given, is nlohmann's parse callback: what it
  // discards of a successful answer is skipped while parsing, never built.
  nlohmann::json call(const std::string& method, const std::string& target,
                      const std::string& body = {},
                      const nlohmann::json::parser_callback_t& keep = nullptr);
  // The raw body of a successful request (logs).
  std::string call_text(const std::string& method, const std::string& target);
  // The answer as it is, whatever its status (for endpoints an older
  // gateway may lack). Throws Error when the connection fails.
  net::Response request(const std::string& method, const std::string& target);

  // This machine's state (the remembered sandbox name), not the gateway's.
  const Paths& paths() const { return paths_; }
  const GatewayChoice& gateway() const { return choice_; }
  // Whether the gateway may be on another host (GatewayChoice::remote()):
  // what the CLI would read of the gateway's files it must then send, or
  // refuse.
  bool remote() const { return choice_.remote(); }
  // Before a stream connects: the local socket's directory is still private.
  void check_before_connecting() const;
  // Whether the request connection is made; connect() makes it (starting
  // the local gateway when none listens and autostart allows).
  bool connected() const { return client_ != nullptr; }
  void connect();

 private:
  net::Client& connection();

  Paths paths_;
  GatewayChoice choice_;
  bool autostart_ = true;
  std::unique_ptr<net::Client> client_;
};

// What a gateway says of itself and of us: GET /v1/health, then GET
// /v1/whoami ({"principal", "admin", "transport"}; nullopt from a gateway
// that has no such endpoint). Throws Error.
struct GatewayProbe {
  std::string version;
  std::optional<nlohmann::json> whoami;
};
GatewayProbe probe_gateway(GatewayClient& client);

// The line that says how we are connected: "Connected / Authenticated
// (mTLS)", "Connected (Unix socket, as alice)", "Connected (plain TCP, not
// authenticated)".
std::string connection_line(const GatewayClient& client, const GatewayProbe& probe);

// Starts `openshell gateway run` in the background (its own session, output
// to gateway.log) and waits until its socket answers. Throws Error.
void start_gateway_in_background(const Paths& paths);

}  // namespace openshell::cli
