#include "base/json_text.h"

#include <nlohmann/json.hpp>

namespace openshell {

std::string json_text(const nlohmann::json& value, int indent) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string clip(std::string_view text, size_t max) {
  if (text.size() <= max) return std::string(text);
  std::string suffix = "...(" + std::to_string(text.size()) + " bytes)";
  size_t keep = max > suffix.size() ? max - suffix.size() : 0;
  return std::string(text.substr(0, keep)) + suffix;
}

}  // namespace openshell
