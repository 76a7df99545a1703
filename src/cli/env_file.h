// --env-file FILE, as docker reads it, for create, exec and run: one
// KEY=VALUE a line (the value as written, no quotes removed), KEY alone for
// the caller's value, blank lines and lines starting with '#' skipped.
#pragma once

#include <string>
#include <vector>

namespace openshell::cli {

// FILE's entries, in order (KEY=VALUE, or KEY alone). Throws Error naming
// FILE:LINE for a line without a variable name, and FILE for one it cannot
// read.
std::vector<std::string> read_env_file(const std::string& path);

// The environment a command gives: each --env-file's entries, then each -e
// (a later entry wins), as KEY=VALUE; KEY alone takes the caller's value
// and is dropped where the caller has none. Throws Error.
std::vector<std::string> environment_entries(const std::vector<std::string>& env_files,
                                             const std::vector<std::string>& env);

}  // namespace openshell::cli
