#include "cli/gateway_view.h"

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/table.h"

namespace openshell::cli {

void print_gateway_config(const nlohmann::json& config) {
  if (!config.is_object()) return;
  std::printf("config: %s (%s)\n", config.value("file", "").c_str(),
              config.value("file_exists", false) ? "present" : "absent");
  if (config.contains("error"))
    std::printf("config error: %s (the settings below hold until it is fixed)\n",
                config.value("error", "").c_str());
  std::vector<std::vector<std::string>> rows = {{"SETTING", "VALUE", "SOURCE"}};
  const nlohmann::json settings = config.value("settings", nlohmann::json::object());
  for (const auto& [key, s] : settings.items()) {
    std::string source = s.value("source", "");
    if (source == "environment") source.append(1, ' ').append(s.value("env", ""));
    std::string value = s.value("value", "");
    rows.push_back({key, value.empty() ? "-" : value, source});
  }
  print_table(rows);
}

}  // namespace openshell::cli
