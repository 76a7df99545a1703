#include <map>
#include <string>

#include <gtest/gtest.h>

#include "base/error.h"
#include "cli/image_build.h"
#include "image/containerfile.h"

namespace openshell::cli::build {
namespace {

// Applies every instruction after FROM of text to a fresh state.
State apply(const std::string& text, const std::map<std::string, std::string>& given = {}) {
  image::Containerfile f = image::parse_containerfile("FROM scratch\n" + text, "F");
  State state;
  std::map<std::string, std::string> global = {{"GLOBAL", "from-before-from"}};
  for (size_t i = 1; i < f.instructions.size(); ++i) {
    const auto& in = f.instructions[i];
    std::vector<std::string> words;
    if (in.name == "WORKDIR" || in.name == "USER" || in.name == "EXPOSE")
      words = image::expand_words(in.args, state.vars());
    apply_config(in, words, f.escape, given, global, &state);
  }
  return state;
}

TEST(ImageBuildConfig, ArgTakesTheBuildArgThenItsDefaultThenTheGlobalOne) {
  State s = apply("ARG A=dflt\nARG B=dflt\nARG GLOBAL\nARG NONE\n", {{"A", "given"}});
  EXPECT_EQ(s.args.at("A"), "given");
  EXPECT_EQ(s.args.at("B"), "dflt");
  EXPECT_EQ(s.args.at("GLOBAL"), "from-before-from");
  EXPECT_EQ(s.args.at("NONE"), "");
  EXPECT_TRUE(s.env().empty());  // ARGs are not the image's environment
}

TEST(ImageBuildConfig, EnvSeesEarlierValuesAndWinsOverArgs) {
  State s = apply("ARG V=arg\nENV A=1\nENV B=${A}2 V=env\nENV C=$V\n");
  EXPECT_EQ(s.env(), (std::vector<std::string>{"A=1", "B=12", "V=env", "C=env"}));
}

TEST(ImageBuildConfig, WorkdirIsRelativeToTheOneBefore) {
  EXPECT_EQ(apply("WORKDIR /a\nWORKDIR b/../c\n").working_dir(), "/a/c");
  EXPECT_EQ(apply("WORKDIR rel\n").working_dir(), "/rel");
  EXPECT_EQ(apply("WORKDIR /a\nWORKDIR ../../../x\n").working_dir(), "/x");  // never above /
  EXPECT_EQ(join_path("/w", "../../etc/x"), "/etc/x");
  EXPECT_EQ(join_path("/w", "sub/"), "/w/sub");
}

TEST(ImageBuildConfig, EntrypointClearsTheBaseCmdUnlessTheFileSetsOne) {
  State a = apply("ENTRYPOINT [\"/app\"]\n");
  EXPECT_EQ(a.edits.entrypoint.value(), std::vector<std::string>{"/app"});
  ASSERT_TRUE(a.edits.cmd.has_value());
  EXPECT_TRUE(a.edits.cmd->empty());
  State b = apply("CMD [\"--help\"]\nENTRYPOINT [\"/app\"]\n");
  EXPECT_EQ(b.edits.cmd.value(), std::vector<std::string>{"--help"});
}

TEST(ImageBuildConfig, ShellFormsGoThroughShell) {
  State s = apply("SHELL [\"/bin/bash\", \"-euc\"]\nCMD echo $HOME\n");
  EXPECT_EQ(s.edits.cmd.value(), (std::vector<std::string>{"/bin/bash", "-euc", "echo $HOME"}));
}

TEST(ImageBuildConfig, ExposeRecordsPortsAndRefusesOthers) {
  State s = apply("EXPOSE 80 53/udp\n");
  EXPECT_EQ(s.edits.exposed_ports, (std::vector<std::string>{"80/tcp", "53/udp"}));
  EXPECT_THROW(apply("EXPOSE 70000\n"), Error);
  EXPECT_THROW(apply("EXPOSE 80/icmp\n"), Error);
  EXPECT_THROW(apply("EXPOSE http\n"), Error);
}

TEST(ImageBuildConfig, LabelsAndUser) {
  State s = apply("ARG WHO=app\nLABEL a=1 \"b c\"=\"two words\"\nUSER $WHO:staff\n");
  EXPECT_EQ(s.edits.labels.at("a"), "1");
  EXPECT_EQ(s.edits.labels.at("b c"), "two words");
  EXPECT_EQ(s.user(), "app:staff");
}

}  // namespace
}  // namespace openshell::cli::build
