// OpenShell's YAML policies, read into the same tree as a TOML one: the
// field names are the same, so policy::parse() checks them alike. Used by
// policy.cc only.
#pragma once

// clang-format off
#include <utility>

#include <toml++/toml.h>
// clang-format on

#include <string>
#include <string_view>
#include <unordered_map>

namespace openshell::policy {

// The line (from 1) where each node of a converted tree stood in the YAML.
using YamlLines = std::unordered_map<const toml::node*, size_t>;

// A YAML document as a TOML table: mappings become tables, sequences
// arrays; a plain scalar is an integer (443), a boolean (true, false) or
// else a string, a quoted one always a string. Throws Error naming the
// source and line: a YAML syntax error, a null value, a key that is not a
// string, more than one document, nesting or size beyond bounds.
toml::table yaml_to_table(std::string_view text, const std::string& source, YamlLines* lines);

}  // namespace openshell::policy
