#include "image/containerfile.h"

#include <map>
#include <string>

#include <gtest/gtest.h>

#include "image/build_cache.h"
#include "image/dockerignore.h"

namespace openshell::image {
namespace {

std::string refusal(const std::string& text) {
  try {
    parse_containerfile(text, "Containerfile");
  } catch (const ContainerfileError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(Containerfile, ReadsEachInstructionWithItsLine) {
  Containerfile f = parse_containerfile(
      "FROM busybox\n"
      "RUN echo hi\n"
      "COPY a b /dst/\n"
      "ADD c /d\n"
      "ENV A=1\n"
      "ARG V=2\n"
      "WORKDIR /w\n"
      "USER 1000:1000\n"
      "LABEL x=y\n"
      "EXPOSE 8080\n"
      "ENTRYPOINT [\"/bin/app\"]\n"
      "CMD [\"--help\"]\n",
      "Containerfile");
  ASSERT_EQ(f.instructions.size(), 12u);
  const char* names[] = {"FROM",    "RUN",  "COPY",  "ADD",    "ENV",        "ARG",
                         "WORKDIR", "USER", "LABEL", "EXPOSE", "ENTRYPOINT", "CMD"};
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_EQ(f.instructions[i].name, names[i]);
    EXPECT_EQ(f.instructions[i].line, static_cast<int>(i + 1));
  }
  EXPECT_EQ(f.instructions[1].args, "echo hi");
  EXPECT_FALSE(f.instructions[1].exec_form);
  EXPECT_TRUE(f.instructions[10].exec_form);
  EXPECT_EQ(f.instructions[10].exec_args, std::vector<std::string>{"/bin/app"});
}

TEST(Containerfile, InstructionNamesAreCaseInsensitive) {
  Containerfile f = parse_containerfile("from busybox\nrun true\n", "F");
  EXPECT_EQ(f.instructions[1].name, "RUN");
}

TEST(Containerfile, ExecAndShellFormsOfRun) {
  Containerfile f =
      parse_containerfile("FROM x\nRUN [\"sh\", \"-c\", \"echo $HOME\"]\nRUN [not json\n", "F");
  EXPECT_TRUE(f.instructions[1].exec_form);
  EXPECT_EQ(f.instructions[1].exec_args, (std::vector<std::string>{"sh", "-c", "echo $HOME"}));
  EXPECT_FALSE(f.instructions[2].exec_form);
  EXPECT_EQ(f.instructions[2].args, "[not json");
}

TEST(Containerfile, JoinsContinuationsAndSkipsCommentsInside) {
  Containerfile f = parse_containerfile(
      "# a comment\n"
      "FROM x\n"
      "RUN apt-get update && \\\n"
      "# inside\n"
      "\n"
      "    apt-get install -y hello\n"
      "CMD echo\n",
      "F");
  ASSERT_EQ(f.instructions.size(), 3u);
  EXPECT_EQ(f.instructions[1].args, "apt-get update &&     apt-get install -y hello");
  EXPECT_EQ(f.instructions[1].line, 3);
  EXPECT_EQ(f.instructions[2].line, 7);
}

TEST(Containerfile, EscapeDirectiveChangesTheContinuationCharacter) {
  Containerfile f = parse_containerfile(
      "# syntax=docker/dockerfile:1\n# escape=`\nFROM x\nRUN dir c:\\ `\n  /b\n", "F");
  EXPECT_EQ(f.escape, '`');
  EXPECT_EQ(f.instructions[1].args, "dir c:\\   /b");
}

TEST(Containerfile, DirectiveAfterAnInstructionIsAComment) {
  Containerfile f = parse_containerfile("FROM x\n# escape=`\nRUN a \\\n b\n", "F");
  EXPECT_EQ(f.escape, '\\');
  EXPECT_EQ(f.instructions[1].args, "a  b");
}

TEST(Containerfile, CopyFlags) {
  Containerfile f = parse_containerfile("FROM x\nCOPY --chown=1:2 --chmod=644 a /b\n", "F");
  EXPECT_EQ(f.instructions[1].flags.at("chown"), "1:2");
  EXPECT_EQ(f.instructions[1].flags.at("chmod"), "644");
  EXPECT_EQ(f.instructions[1].args, "a /b");
  EXPECT_EQ(f.instructions[1].text(), "COPY --chmod=644 --chown=1:2 a /b");
}

TEST(Containerfile, RefusalsNameFileLineAndInstruction) {
  EXPECT_EQ(refusal("FROM x\nRUN true\nHEALTHCHECK CMD true\n"),
            "Containerfile:3: HEALTHCHECK: not supported (sandboxes have no health checks)");
  EXPECT_EQ(refusal("FROM x\nFROBNICATE now\n"),
            "Containerfile:2: FROBNICATE: unknown instruction");
  EXPECT_EQ(refusal("FROM x\nCOPY --from=builder /a /b\n"),
            "Containerfile:2: COPY: --from is not supported (multi-stage builds are not "
            "supported: copy from the build context)");
  EXPECT_EQ(refusal("FROM x\nFROM y\n"),
            "Containerfile:2: FROM: a second FROM: multi-stage builds are not supported (one "
            "FROM per file)");
  EXPECT_EQ(refusal("RUN true\nFROM x\n"),
            "Containerfile:1: RUN: comes before FROM (only ARG may)");
  EXPECT_EQ(refusal("FROM x\nRUN --mount=type=cache,target=/x true\n"),
            "Containerfile:2: RUN: --mount: unknown or unsupported option");
  EXPECT_EQ(refusal("FROM x\nVOLUME /data\n").substr(0, 26), "Containerfile:2: VOLUME: n");
  EXPECT_EQ(refusal("FROM x\nONBUILD RUN x\n").substr(0, 27), "Containerfile:2: ONBUILD: n");
  EXPECT_EQ(refusal("FROM x\nSHELL sh -c\n"),
            "Containerfile:2: SHELL: expects a JSON array, like [\"/bin/sh\", \"-c\"]");
  EXPECT_EQ(refusal("FROM x\nWORKDIR\n"), "Containerfile:2: WORKDIR: needs arguments");
  EXPECT_EQ(refusal("FROM x\nRUN []\n"),
            "Containerfile:2: RUN: needs a command (an empty JSON array)");
  EXPECT_EQ(refusal("FROM x\nCOPY [\"a\"]\n"),
            "Containerfile:2: COPY: needs a source and a destination");
  EXPECT_EQ(refusal("# escape=x\nFROM a\n"),
            "Containerfile:1: escape must be '\\' or '`', not 'x'");
  EXPECT_EQ(refusal("# just words\n"), "Containerfile:2: no FROM instruction");
}

TEST(Containerfile, ArgBeforeFromIsGlobal) {
  Containerfile f = parse_containerfile("ARG BASE=busybox\nFROM $BASE\n", "F");
  ASSERT_EQ(f.global_args.size(), 1u);
  EXPECT_EQ(f.instructions.size(), 1u);
}

TEST(ContainerfileSubstitution, Forms) {
  std::map<std::string, std::string> vars = {{"A", "one"}, {"E", ""}};
  EXPECT_EQ(expand_words("$A ${A} x${A}y", vars),
            (std::vector<std::string>{"one", "one", "xoney"}));
  EXPECT_EQ(expand_words("${B:-dflt} ${A:-dflt} ${E:-empty}", vars),
            (std::vector<std::string>{"dflt", "one", "empty"}));
  EXPECT_EQ(expand_words("${A:+set} ${B:+set}x", vars), (std::vector<std::string>{"set", "x"}));
  EXPECT_EQ(expand_words("$UNSET-end", vars), std::vector<std::string>{"-end"});
  EXPECT_EQ(expand_words("'$A' \"$A b\" \\$A", vars),
            (std::vector<std::string>{"$A", "one b", "$A"}));
  EXPECT_EQ(expand_word("[$A] \\$A", vars), "[one] $A");
  EXPECT_THROW(expand_words("${A", vars), Error);
  EXPECT_THROW(expand_words("${A/x/y}", vars), Error);
  EXPECT_THROW(expand_words("\"open", vars), Error);
}

TEST(ContainerfileSubstitution, EnvAndLabelPairs) {
  Containerfile f = parse_containerfile(
      "FROM x\nENV A=1 B=\"two words\" C=${A}x\nENV LEGACY value with spaces\nLABEL "
      "\"k y\"=v\n",
      "F");
  auto pairs = parse_pairs(f.instructions[1], {{"A", "0"}});
  ASSERT_EQ(pairs.size(), 3u);
  EXPECT_EQ(pairs[1].second, "two words");
  EXPECT_EQ(pairs[2].second, "0x");  // substitution sees the values before the instruction
  auto legacy = parse_pairs(f.instructions[2], {});
  ASSERT_EQ(legacy.size(), 1u);
  EXPECT_EQ(legacy[0].first, "LEGACY");
  EXPECT_EQ(legacy[0].second, "value with spaces");
  EXPECT_EQ(parse_pairs(f.instructions[3], {})[0].first, "k y");
}

TEST(ContainerfileSubstitution, ArgNamesAndDefaults) {
  Containerfile f = parse_containerfile("FROM x\nARG V=${W:-3}\nARG N\nARG 9bad\n", "F");
  auto [name, def] = parse_arg(f.instructions[1], {});
  EXPECT_EQ(name, "V");
  EXPECT_EQ(def.value(), "3");
  EXPECT_FALSE(parse_arg(f.instructions[2], {}).second.has_value());
  EXPECT_THROW(parse_arg(f.instructions[3], {}), Error);
}

TEST(DockerIgnore, PatternsExceptionsAndDoubleStar) {
  IgnoreRules r = IgnoreRules::parse(
      "# comment\n"
      "*.log\n"
      "/build\n"
      "**/secret*\n"
      "docs\n"
      "!docs/keep.md\n"
      "  tmp/?  \n"
      "./x/../y\n");
  EXPECT_TRUE(r.excluded("a.log"));
  EXPECT_FALSE(r.excluded("sub/a.log"));  // '*' stays within one directory
  EXPECT_TRUE(r.excluded("build"));
  EXPECT_TRUE(r.excluded("build/out/file"));  // below an excluded directory
  EXPECT_TRUE(r.excluded("secret.txt"));
  EXPECT_TRUE(r.excluded("a/b/secrets"));
  EXPECT_TRUE(r.excluded("docs/other.md"));
  EXPECT_FALSE(r.excluded("docs/keep.md"));
  EXPECT_TRUE(r.excluded("tmp/a"));
  EXPECT_FALSE(r.excluded("tmp/ab"));
  EXPECT_TRUE(r.excluded("y"));
  EXPECT_FALSE(r.excluded("src/main.cc"));
  EXPECT_TRUE(r.has_exceptions());
}

TEST(DockerIgnore, LastMatchWins) {
  IgnoreRules r = IgnoreRules::parse("!a.txt\n*.txt\n");
  EXPECT_TRUE(r.excluded("a.txt"));
  IgnoreRules s = IgnoreRules::parse("*\n!keep\n");
  EXPECT_TRUE(s.excluded("other"));
  EXPECT_FALSE(s.excluded("keep"));
}

TEST(DockerIgnore, Globs) {
  EXPECT_TRUE(glob_match("[a-c]x", "bx"));
  EXPECT_FALSE(glob_match("[^a-c]x", "bx"));
  EXPECT_TRUE(glob_match("**", "a/b/c"));
  EXPECT_TRUE(glob_match("a/**/z", "a/z"));
  EXPECT_TRUE(glob_match("a/**/z", "a/b/c/z"));
  EXPECT_FALSE(glob_match("a/*/z", "a/b/c/z"));
  EXPECT_TRUE(glob_match("\\*", "*"));
  EXPECT_FALSE(glob_match("\\*", "x"));
}

TEST(BuildCacheKey, DependsOnParentTextAndContent) {
  const std::string k = step_key("sha256:parent", "RUN true", "");
  EXPECT_EQ(k.substr(0, 7), "sha256:");
  EXPECT_EQ(k, step_key("sha256:parent", "RUN true", ""));
  EXPECT_NE(k, step_key("sha256:other", "RUN true", ""));
  EXPECT_NE(k, step_key("sha256:parent", "RUN false", ""));
  EXPECT_NE(k, step_key("sha256:parent", "RUN true", "sha256:content"));
  // No two splits of the same bytes give the same key.
  EXPECT_NE(step_key("ab", "c", ""), step_key("a", "bc", ""));
}

}  // namespace
}  // namespace openshell::image
