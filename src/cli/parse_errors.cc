#include "cli/parse_errors.h"

#include <algorithm>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace openshell::cli {

namespace {

// CLI11's "The following arguments were not expected: -- --bogus" becomes
// "unknown option --bogus".
std::string reword(const CLI::ParseError& e) {
  std::string message = e.what();
  static const std::string kExtras = "The following argument";
  if (message.rfind(kExtras, 0) != 0) return message;
  auto colon = message.find(": ");
  if (colon == std::string::npos) return message;
  std::vector<std::string> options, others;
  std::string rest = message.substr(colon + 2);
  for (size_t start = 0; start <= rest.size();) {
    size_t end = rest.find(' ', start);
    if (end == std::string::npos) end = rest.size();
    std::string word = rest.substr(start, end - start);
    if (!word.empty() && word != "--") (word[0] == '-' ? options : others).push_back(word);
    start = end + 1;
  }
  if (!options.empty())
    return std::string(options.size() > 1 ? "unknown options " : "unknown option ") +
           CLI::detail::join(options, " ");
  return "unexpected argument " + CLI::detail::join(others, " ");
}

std::vector<std::string> command_names(const CLI::App& at) {
  std::vector<std::string> names;
  for (const CLI::App* sub : at.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_name().empty() || sub->get_name()[0] == '_') continue;  // roles, not commands
    names.push_back(sub->get_name());
  }
  return names;
}

// "a, b or c".
std::string or_list(const std::vector<std::string>& words) {
  std::string out;
  for (size_t i = 0; i < words.size(); ++i)
    out += (i == 0 ? "" : i + 1 == words.size() ? " or " : ", ") + words[i];
  return out;
}

}  // namespace

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::vector<std::string> nearest_names(const std::string& word,
                                       const std::vector<std::string>& names) {
  // The names the word begins ("stat": status).
  std::vector<std::string> nearest;
  if (word.size() >= 2)
    for (const auto& name : names)
      if (name.rfind(word, 0) == 0) nearest.push_back(name);
  if (!nearest.empty()) return nearest;
  size_t best = std::min<size_t>(2, word.size() > 0 ? word.size() - 1 : 0);
  for (const auto& name : names) {
    const size_t d = edit_distance(word, name);
    if (d > best) continue;
    if (d < best) nearest.clear();
    best = d;
    nearest.push_back(name);
  }
  return nearest;
}

std::string describe_parse_error(const CLI::App& app, int argc, const char* const* argv,
                                 const CLI::ParseError& error) {
  // Down the command tree along argv, as far as it has subcommands.
  const CLI::App* at = &app;
  std::string where = "openshell";
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (command_names(*at).empty()) break;  // a command of its own: CLI11's words
    if (word == "--") break;
    if (word.size() > 1 && word[0] == '-') {
      const std::string option = word.substr(0, word.find('='));
      const CLI::Option* known = at->get_option_no_throw(option);
      if (known == nullptr && option != "-h" && option != "--help")
        return "unknown option " + option + " (see '" + where + " --help')";
      // The global options' values (-g NAME) are not commands.
      if (known != nullptr && known->get_items_expected_min() > 0 &&
          word.find('=') == std::string::npos)
        ++i;
      continue;
    }
    const CLI::App* sub = nullptr;
    for (const CLI::App* candidate : at->get_subcommands([](const CLI::App*) { return true; }))
      if (candidate->check_name(word)) sub = candidate;
    if (sub == nullptr) {
      const auto near = nearest_names(word, command_names(*at));
      if (near.empty()) return "unknown command '" + word + "' (see '" + where + " --help')";
      return "unknown command '" + word + "' (did you mean " + or_list(near) + "?)";
    }
    at = sub;
    where += " " + sub->get_name();
  }
  if (!command_names(*at).empty()) {
    std::vector<std::string> names = command_names(*at);
    return "a command is needed after '" + where + "': " + or_list(names) + " (see '" + where +
           " --help')";
  }
  return reword(error) + " (see '" + where + " --help')";
}

}  // namespace openshell::cli
