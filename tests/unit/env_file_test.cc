#include "cli/env_file.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "egress/local_names.h"
#include "test_util.h"

namespace openshell::cli {
namespace {

using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::ElementsAre;

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(EnvFile, ReadsDockersFormat) {
  TempDir dir;
  const std::string path = dir.path() + "/vars";
  write_file(path, "# a comment\n\nA=1\n  B=two words = ok\nC=\r\n\t# indented comment\nPASSED\n");
  EXPECT_THAT(read_env_file(path), ElementsAre("A=1", "B=two words = ok", "C=", "PASSED"));
}

TEST(EnvFile, ABadLineIsNamedByFileAndLine) {
  TempDir dir;
  const std::string path = dir.path() + "/vars";
  write_file(path, "A=1\n=nokey\n");
  EXPECT_EQ(error_of([&] { read_env_file(path); }),
            "--env-file " + path + ":2: '=nokey' is not KEY=VALUE or KEY");
  write_file(path, "A=1\n\nMY VAR=1\n");
  EXPECT_EQ(error_of([&] { read_env_file(path); }),
            "--env-file " + path + ":3: 'MY VAR=1' is not KEY=VALUE or KEY");
  EXPECT_EQ(error_of([&] { read_env_file(dir.path() + "/missing"); }),
            "--env-file " + dir.path() + "/missing: No such file or directory");
}

TEST(EnvFile, FilesComeFirstAndTheLastValueWins) {
  TempDir dir;
  write_file(dir.path() + "/a", "A=file\nB=file\nFROM_CALLER\nUNSET_IN_CALLER\n");
  ScopedEnv caller("FROM_CALLER", "here");
  ScopedEnv unset("UNSET_IN_CALLER", nullptr);
  EXPECT_THAT(environment_entries({dir.path() + "/a"}, {"B=flag", "C=3"}),
              ElementsAre("A=file", "B=flag", "FROM_CALLER=here", "C=3"));
}

TEST(LocalNames, LocalhostAndTheHostNameStayInside) {
  auto text = [](const std::optional<std::vector<Address>>& addresses) {
    std::string out;
    for (const auto& a : addresses.value_or(std::vector<Address>{})) out += a.to_string() + " ";
    return out;
  };
  EXPECT_EQ(text(egress::local_name_addresses("localhost", "box")), "127.0.0.1 ::1 ");
  EXPECT_EQ(text(egress::local_name_addresses("api.localhost", "box")), "127.0.0.1 ::1 ");
  EXPECT_EQ(text(egress::local_name_addresses("box", "Box")), "127.0.0.1 ");
  EXPECT_FALSE(egress::local_name_addresses("localhost.example.com", "box"));
  EXPECT_FALSE(egress::local_name_addresses("box.example.com", "box"));
  EXPECT_FALSE(egress::local_name_addresses("xlocalhost", "box"));
  EXPECT_FALSE(egress::local_name_addresses("box", ""));
}

}  // namespace
}  // namespace openshell::cli
