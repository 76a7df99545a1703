#include "runtime/private_paths.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "test_util.h"

namespace openshell::runtime {
namespace {

using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using ::testing::Contains;
using ::testing::Not;

TEST(PrivatePaths, NamesTheLayoutsThatExistCanonically) {
  TempDir dir;
  const std::string home = dir / "home", runtime = dir / "xdg", known = dir / "known";
  for (const auto& d : {home, home + "/run", runtime, known})
    ASSERT_EQ(::mkdir(d.c_str(), 0700), 0);
  ASSERT_EQ(::symlink(home.c_str(), (dir / "link").c_str()), 0);
  ScopedEnv openshell_home("OPENSHELL_HOME", (dir / "link").c_str());
  ScopedEnv xdg_runtime("XDG_RUNTIME_DIR", runtime.c_str());
  ScopedEnv xdg_state("XDG_STATE_HOME", (dir / "missing").c_str());
  Paths paths{known, dir / "not-there"};
  auto hidden = openshell_private_paths({paths});
  // Symbolic links resolved: the mount plan masks real directories.
  EXPECT_THAT(hidden, Contains(home));
  EXPECT_THAT(hidden, Contains(home + "/run"));
  EXPECT_THAT(hidden, Not(Contains(dir / "link")));
  EXPECT_THAT(hidden, Contains(runtime));
  EXPECT_THAT(hidden, Contains(known));
  // What does not exist is never created, nor named.
  EXPECT_THAT(hidden, Not(Contains(dir / "not-there")));
  EXPECT_THAT(hidden, Not(Contains(dir / "missing/openshell")));
  EXPECT_THAT(hidden, Not(Contains("/")));
  EXPECT_TRUE(std::is_sorted(hidden.begin(), hidden.end()));
}

TEST(PrivatePaths, ASocketCountsAFileDoesNot) {
  TempDir dir;
  const std::string sock = dir / "gateway.sock", file = dir / "plain";
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, sock.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ::close(fd);
  openshell::testing::write_file(file, "x");
  auto hidden = openshell_private_paths({Paths{sock, file}});
  EXPECT_THAT(hidden, Contains(sock));
  EXPECT_THAT(hidden, Not(Contains(file)));
}

}  // namespace
}  // namespace openshell::runtime
