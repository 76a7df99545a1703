// What `gateway status` shows of the gateway's settings (gateway/config.h).
#pragma once

#include <nlohmann/json_fwd.hpp>

namespace openshell::cli {

// "config: FILE (present|absent)", then one row a setting: its key, value
// and where the value came from (file, environment VARIABLE, default).
void print_gateway_config(const nlohmann::json& config);

}  // namespace openshell::cli
