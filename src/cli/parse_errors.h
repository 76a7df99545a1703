// The one line openshell prints for a command line it cannot parse, in its
// own words rather than CLI11's: "unknown command 'lst' (did you mean
// list?)", "unknown option -u".
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
class ParseError;
}  // namespace CLI

namespace openshell::cli {

// The number of single-character insertions, deletions and substitutions
// that turn a into b.
size_t edit_distance(const std::string& a, const std::string& b);

// What `word` may have meant: the names it begins (two letters at least);
// else the names
// nearest to it (ties all given) if at most two edits away, and fewer edits
// than it has letters. Empty when none is near.
std::vector<std::string> nearest_names(const std::string& word,
                                       const std::vector<std::string>& names);

// The message (without "openshell: ") for `error`, thrown by app.parse on
// argv: the first unknown command or option is named where the command tree
// has subcommands at that point; else CLI11's message, reworded.
std::string describe_parse_error(const CLI::App& app, int argc, const char* const* argv,
                                 const CLI::ParseError& error);

}  // namespace openshell::cli
