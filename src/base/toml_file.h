// TOML files read one way everywhere: a document that does not parse, or a
// value at fault, is one line naming the file and the line.
#pragma once

// clang-format off
#include <utility>

#include <toml++/toml.h>
// clang-format on

#include <string>
#include <string_view>

namespace openshell::toml_file {

// The document of `text`, read from `path`; throws Error
// "PATH:LINE: what the parser says".
toml::table parse(std::string_view text, const std::string& path);

// Throws Error "PATH:LINE: KEY: MESSAGE" (without ":LINE" when the node has
// no source line).
[[noreturn]] void fail(const std::string& path, const toml::node* node, const std::string& key,
                       const std::string& message);

}  // namespace openshell::toml_file
