#include "cli/parse_errors.h"

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

namespace openshell::cli {
namespace {

using Names = std::vector<std::string>;

TEST(EditDistance, CountsInsertionsDeletionsAndSubstitutions) {
  EXPECT_EQ(edit_distance("", ""), 0u);
  EXPECT_EQ(edit_distance("list", "list"), 0u);
  EXPECT_EQ(edit_distance("lst", "list"), 1u);
  EXPECT_EQ(edit_distance("lsit", "list"), 2u);
  EXPECT_EQ(edit_distance("", "get"), 3u);
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
}

TEST(NearestNames, ThePrefixElseTheNearestWithinTwoEdits) {
  const Names sandbox = {"create", "get", "list", "start", "stop", "delete", "exec", "logs"};
  EXPECT_EQ(nearest_names("lst", sandbox), Names{"list"});
  EXPECT_EQ(nearest_names("gett", sandbox), Names{"get"});
  EXPECT_EQ(nearest_names("st", sandbox), (Names{"start", "stop"}));
  EXPECT_EQ(nearest_names("stat", {"status", "stop"}), Names{"status"});
  EXPECT_EQ(nearest_names("xyzzy", sandbox), Names{});
  // Fewer edits than letters: "x" is not "exec" or anything one letter long.
  EXPECT_EQ(nearest_names("x", {"ls", "y"}), Names{});
  EXPECT_EQ(nearest_names("", sandbox), Names{});
}

// The words of the line openshell prints for argv, from a tree like its own.
std::string message_for(std::vector<std::string> words) {
  CLI::App app{"test", "openshell"};
  app.require_subcommand(1);
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose);
  std::string gateway;
  app.add_option("-g,--gateway", gateway);
  CLI::App* sandbox = app.add_subcommand("sandbox");
  sandbox->require_subcommand(1);
  CLI::App* list = sandbox->add_subcommand("list");
  bool all = false;
  list->add_flag("-a", all);
  sandbox->add_subcommand("logs");
  app.add_subcommand("__role");
  words.insert(words.begin(), "openshell");
  std::vector<const char*> argv;
  for (const auto& w : words) argv.push_back(w.c_str());
  std::vector<std::string> reversed(words.rbegin(), words.rend() - 1);
  try {
    app.parse(reversed);
  } catch (const CLI::ParseError& e) {
    return describe_parse_error(app, static_cast<int>(argv.size()), argv.data(), e);
  }
  return "(parsed)";
}

TEST(DescribeParseError, NamesTheUnknownWordAtItsLevel) {
  EXPECT_EQ(message_for({"sandbox", "lst"}), "unknown command 'lst' (did you mean list?)");
  EXPECT_EQ(message_for({"sandbox", "-x"}), "unknown option -x (see 'openshell sandbox --help')");
  EXPECT_EQ(message_for({"-v", "sandbox", "lgs"}), "unknown command 'lgs' (did you mean logs?)");
  // A global option's value is no command.
  EXPECT_EQ(message_for({"-g", "lab", "sandbox", "lgs"}),
            "unknown command 'lgs' (did you mean logs?)");
  EXPECT_EQ(message_for({"__rol"}), "unknown command '__rol' (see 'openshell --help')");
  EXPECT_EQ(message_for({"sandbox"}),
            "a command is needed after 'openshell sandbox': list or logs (see 'openshell sandbox "
            "--help')");
  EXPECT_EQ(message_for({"sandbox", "list", "-u"}),
            "unknown option -u (see 'openshell sandbox list --help')");
  EXPECT_EQ(message_for({"sandbox", "list", "extra"}),
            "unexpected argument extra (see 'openshell sandbox list --help')");
}

}  // namespace
}  // namespace openshell::cli
