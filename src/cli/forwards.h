// Port forwards on the command line (forward_commands.cc): `openshell
// forward start|stop|list`, and what `sandbox create --forward` shares.
// Private to src/cli.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace openshell::cli {

class GatewayClient;

// [BIND:]PORT ("8080", "0.0.0.0:8080", "[::1]:8080", "localhost:8080") as
// the API's {"bind", "port"}; BIND defaults to 127.0.0.1. Throws Error
// naming `what` (the flag or the argument) and the text.
nlohmann::json parse_forward(const std::string& text, const std::string& what);

// After `sandbox create --forward`: the sandbox's forwards that do not
// listen, each warned about (a bind that failed, say), once the supervisor
// has reported them or a few seconds have passed. Returns how many.
int warn_about_forwards(GatewayClient& client, const std::string& name);

}  // namespace openshell::cli
