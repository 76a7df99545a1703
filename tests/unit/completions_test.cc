#include "cli/completions.h"

#include <string>

#include <CLI/CLI.hpp>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace openshell::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

// A small tree shaped like openshell's: what the scripts hold follows it.
struct Tree {
  CLI::App app{"t", "openshell"};
  std::string name, from, s;
  bool all = false;
  Tree() {
    app.add_flag("-v,--verbose", all);
    CLI::App* sandbox = app.add_subcommand("sandbox", "sandboxes");
    CLI::App* create = sandbox->add_subcommand("create", "make one");
    create->add_option("--from", from);
    create->add_flag("--no-keep", all);
    CLI::App* del = sandbox->add_subcommand("delete", "remove one");
    del->alias("rm");
    del->add_option("name", name);
    del->add_flag("--all", all);
    app.add_subcommand("__hidden", "")->group("");
  }
};

TEST(Completions, NodesFollowTheCommandTree) {
  Tree t;
  auto nodes = command_nodes(t.app);
  ASSERT_EQ(nodes.size(), 5u);  // root, sandbox, create, delete, rm
  EXPECT_EQ(nodes[0].path, "");
  EXPECT_THAT(nodes[0].subcommands, ElementsAre("sandbox"));
  EXPECT_EQ(nodes[1].path, " sandbox");
  EXPECT_THAT(nodes[1].subcommands, ElementsAre("create", "delete", "rm"));
  EXPECT_EQ(nodes[2].path, " sandbox create");
  EXPECT_THAT(nodes[2].value_options, ElementsAre("--from"));
  EXPECT_EQ(nodes[2].argument_kind, "");
  EXPECT_EQ(nodes[3].argument_kind, "sandboxes");
  EXPECT_EQ(nodes[4].path, " sandbox rm");
  EXPECT_EQ(nodes[4].argument_kind, "sandboxes");
  // A command added to the tree is in every script at once.
  t.app.add_subcommand("doctor", "check");
  EXPECT_THAT(bash_completion(t.app), HasSubstr("list=\"sandbox doctor"));
  EXPECT_THAT(fish_completion(t.app), HasSubstr("-a 'sandbox doctor'"));
  EXPECT_THAT(zsh_completion(t.app), HasSubstr("bashcompinit"));
  EXPECT_THAT(bash_completion(t.app), Not(HasSubstr("__hidden")));
}

TEST(Completions, LiveNamesForArgumentsAndOptionValues) {
  Tree t;
  const std::string bash = bash_completion(t.app);
  EXPECT_THAT(bash, HasSubstr("\" sandbox delete\") list=\"-h --help --all\" valueopts=\"\" "
                              "kind=\"sandboxes\""));
  EXPECT_THAT(bash, HasSubstr("__complete \"$kind\""));
  EXPECT_EQ(option_value_kind("--from"), "images");
  EXPECT_EQ(option_value_kind("-g"), "gateways");
  EXPECT_THAT(fish_completion(t.app),
              HasSubstr("-l from -r -a '(openshell __complete images 2>/dev/null)'"));
}

}  // namespace
}  // namespace openshell::cli
