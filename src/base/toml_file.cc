#include "base/toml_file.h"

#include <sstream>

#include "base/error.h"

namespace openshell::toml_file {

toml::table parse(std::string_view text, const std::string& path) {
  try {
    return toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    std::ostringstream out;
    out << path << ":" << e.source().begin.line << ": " << e.description();
    throw Error(out.str());
  }
}

void fail(const std::string& path, const toml::node* node, const std::string& key,
          const std::string& message) {
  std::ostringstream out;
  out << path;
  if (node && node->source().begin.line > 0) out << ":" << node->source().begin.line;
  out << ": " << key << ": " << message;
  throw Error(out.str());
}

}  // namespace openshell::toml_file
