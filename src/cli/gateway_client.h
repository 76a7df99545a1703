// The command line's side of the gateway's API: a connection (starting the
// gateway in the background when its socket is absent), JSON requests, and
// errors turned into one clear line.
#pragma once

#include <string>

#include <nlohmann/json_fwd.hpp>

#include "base/paths.h"

namespace openshell::net {
class Client;
}

namespace openshell::cli {

class GatewayClient {
 public:
  // Connects to the gateway of this OPENSHELL_HOME, starting it when no
  // gateway listens (autostart). Throws Error.
  explicit GatewayClient(bool autostart = true);
  ~GatewayClient();

  // A JSON request; a non-2xx answer throws Error with the gateway's message.
  nlohmann::json call(const std::string& method, const std::string& target,
                      const std::string& body = {});
  // The raw body of a successful request (logs).
  std::string call_text(const std::string& method, const std::string& target);

  const Paths& paths() const { return paths_; }

 private:
  Paths paths_;
  std::unique_ptr<net::Client> client_;
};

// Starts `openshell gateway run` in the background (its own session, output
// to gateway.log) and waits until its socket answers. Throws Error.
void start_gateway_in_background(const Paths& paths);

}  // namespace openshell::cli
