#include "runtime/users.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/root_files.h"
#include "image/store.h"
#include "test_util.h"

namespace openshell::runtime {
namespace {

using ::testing::HasSubstr;

constexpr const char* kPasswd =
    "root:x:0:0:root:/root:/bin/bash\n"
    "# a comment\n"
    "\n"
    "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    "sandbox:x:1000:1000:Sandbox User:/home/sandbox:/bin/sh\n"
    "nohome:x:1001:1002:::/bin/sh\n"
    "short:x:1003\n"
    "broken:x:abc:1000::/x:/bin/sh\n";

constexpr const char* kGroup =
    "root:x:0:\n"
    "staff:x:50:sandbox\n"
    "sandbox:x:1000:\n"
    "badgid:x:zz:\n";

ResolvedUser resolve(const std::string& spec) {
  return resolve_user(spec, kPasswd, kGroup, "/rootfs");
}

std::string error_of_in_root(const std::string& spec, const std::string& root) {
  try {
    resolve_user_in_root(spec, root);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

std::string error_of(const std::string& spec) {
  try {
    resolve(spec);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "resolve_user accepted " << spec;
  return "";
}

TEST(ResolveUser, NumberListedInPasswd) {
  ResolvedUser u = resolve("1000");
  EXPECT_EQ(u.uid, 1000u);
  EXPECT_EQ(u.gid, 1000u);
  EXPECT_EQ(u.name, "sandbox");
  EXPECT_EQ(u.home, "/home/sandbox");
}

TEST(ResolveUser, NumberTakesItsGroupFromPasswd) {
  ResolvedUser u = resolve("1001");
  EXPECT_EQ(u.uid, 1001u);
  EXPECT_EQ(u.gid, 1002u);
  EXPECT_EQ(u.name, "nohome");
  EXPECT_EQ(u.home, "/");  // empty home field
}

TEST(ResolveUser, NumbersCompareAsNumbers) {
  // "01000" is uid 1000, listed in passwd with its name and home.
  ResolvedUser u = resolve("01000");
  EXPECT_EQ(u.uid, 1000u);
  EXPECT_EQ(u.name, "sandbox");
}

TEST(ResolveUser, NumberNotInPasswd) {
  ResolvedUser u = resolve("4242");
  EXPECT_EQ(u.uid, 4242u);
  EXPECT_EQ(u.gid, 4242u);
  EXPECT_EQ(u.name, "");
  EXPECT_EQ(u.home, "/");
}

TEST(ResolveUser, NumberAndGroupNumber) {
  ResolvedUser u = resolve("1000:1000");
  EXPECT_EQ(u.uid, 1000u);
  EXPECT_EQ(u.gid, 1000u);
  u = resolve("1000:50");
  EXPECT_EQ(u.uid, 1000u);
  EXPECT_EQ(u.gid, 50u);
  EXPECT_EQ(u.home, "/home/sandbox");
}

TEST(ResolveUser, Name) {
  ResolvedUser u = resolve("sandbox");
  EXPECT_EQ(u.uid, 1000u);
  EXPECT_EQ(u.gid, 1000u);
  EXPECT_EQ(u.name, "sandbox");
  EXPECT_EQ(u.home, "/home/sandbox");
  EXPECT_EQ(resolve("daemon").home, "/usr/sbin");
}

TEST(ResolveUser, NameAndGroupName) {
  ResolvedUser u = resolve("sandbox:staff");
  EXPECT_EQ(u.uid, 1000u);
  EXPECT_EQ(u.gid, 50u);
  EXPECT_EQ(u.name, "sandbox");
}

TEST(ResolveUser, NumberAndGroupName) {
  ResolvedUser u = resolve("1000:staff");
  EXPECT_EQ(u.uid, 1000u);
  EXPECT_EQ(u.gid, 50u);
  u = resolve("4242:staff");
  EXPECT_EQ(u.uid, 4242u);
  EXPECT_EQ(u.gid, 50u);
}

TEST(ResolveUser, UnknownNameNamesPasswd) {
  EXPECT_EQ(error_of("nobodyx"), "user nobodyx: no such user in /rootfs/etc/passwd");
  // A name matches the name field only, not a prefix.
  EXPECT_THAT(error_of("sand"), HasSubstr("no such user"));
}

TEST(ResolveUser, UnknownGroupNamesGroupFile) {
  EXPECT_EQ(error_of("sandbox:wheel"), "group wheel: no such group in /rootfs/etc/group");
  EXPECT_EQ(error_of("1000:wheel"), "group wheel: no such group in /rootfs/etc/group");
}

TEST(ResolveUser, EmptyPartsThrow) {
  EXPECT_THAT(error_of(""), HasSubstr("empty user"));
  EXPECT_THAT(error_of(":staff"), HasSubstr("empty user"));
  EXPECT_THAT(error_of("sandbox:"), HasSubstr("empty group"));
  EXPECT_THAT(error_of(":"), HasSubstr("empty group"));
}

TEST(ResolveUser, MalformedEntries) {
  EXPECT_THAT(error_of("broken"), HasSubstr("user broken: malformed passwd entry"));
  EXPECT_THAT(error_of("short"), HasSubstr("no such user"));  // too few fields: not an entry
  EXPECT_THAT(error_of("sandbox:badgid"), HasSubstr("group badgid: malformed group entry"));
}

TEST(ResolveUser, IdAboveTheLargestValidIsNotANumber) {
  // 4294967295 is (uid_t)-1; it is read as a name, which is not in passwd.
  EXPECT_THAT(error_of("4294967295"), HasSubstr("no such user"));
  EXPECT_EQ(resolve("4294967294").uid, 4294967294u);
}

TEST(ResolveUserInRoot, ReadsTheRootsFiles) {
  openshell::testing::TempDir root;
  openshell::testing::write_file(root / "etc/passwd", "app:x:2000:2001::/srv/app:/bin/sh\n");
  openshell::testing::write_file(root / "etc/group", "ops:x:3000:\n");
  ResolvedUser u = resolve_user_in_root("app:ops", root.path());
  EXPECT_EQ(u.uid, 2000u);
  EXPECT_EQ(u.gid, 3000u);
  EXPECT_EQ(u.home, "/srv/app");
  try {
    resolve_user_in_root("sandbox", root.path());
    FAIL() << "a user of another root was found";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "user sandbox: no such user in " + root.path() + "/etc/passwd");
  }
}

TEST(ResolveUserInRoot, MissingFilesAreEmpty) {
  openshell::testing::TempDir root;
  ResolvedUser u = resolve_user_in_root("1234:5678", root.path());
  EXPECT_EQ(u.uid, 1234u);
  EXPECT_EQ(u.gid, 5678u);
  EXPECT_THROW(resolve_user_in_root("app", root.path()), Error);
}

TEST(ResolveUserInRoot, HostRoot) {
  ResolvedUser u = resolve_user_in_root("0", "/");
  EXPECT_EQ(u.uid, 0u);
  EXPECT_EQ(u.name, "root");  // from the host's /etc/passwd
}

// A hostile root's symlinks lead nowhere on the host: "etc -> /etc" and
// "etc/passwd -> /etc/passwd" resolve inside the root, so the host's own
// users (root among them) are not found there.
TEST(ResolveUserInRoot, SymlinksStayInsideTheRoot) {
  for (const char* kind : {"etc", "passwd", "dotdot"}) {
    SCOPED_TRACE(kind);
    openshell::testing::TempDir root;
    const std::string k = kind;
    if (k == "etc") {
      ASSERT_EQ(::symlink("/etc", (root / "etc").c_str()), 0);
    } else {
      openshell::testing::write_file(root / "etc/group", "");
      ASSERT_EQ(::symlink(k == "passwd" ? "/etc/passwd" : "../../../../../../../etc/passwd",
                          (root / "etc/passwd").c_str()),
                0);
    }
    try {
      resolve_user_in_root("root", root.path());
      FAIL() << "the host's passwd was read";
    } catch (const Error& e) {
      EXPECT_THAT(std::string(e.what()),
                  ::testing::AnyOf(HasSubstr("no such user"), HasSubstr("symbolic links")));
    }
  }
  // A symlink inside the root is followed there.
  openshell::testing::TempDir root;
  openshell::testing::write_file(root / "usr/etc/passwd", "app:x:2000:2001::/srv/app:/bin/sh\n");
  ASSERT_EQ(::symlink("/usr/etc", (root / "etc").c_str()), 0);
  EXPECT_EQ(resolve_user_in_root("app", root.path()).uid, 2000u);
}

TEST(ResolveUserInRoot, OnlyBoundedRegularFiles) {
  openshell::testing::TempDir root;
  openshell::testing::write_file(root / "etc/group", "");
  // A FIFO would block a plain read forever; /dev/zero would never end.
  ASSERT_EQ(::mkfifo((root / "etc/passwd").c_str(), 0644), 0);
  EXPECT_THROW(
      {
        try {
          resolve_user_in_root("app", root.path());
        } catch (const Error& e) {
          EXPECT_EQ(std::string(e.what()), root.path() + "/etc/passwd: not a regular file");
          throw;
        }
      },
      Error);
  ::unlink((root / "etc/passwd").c_str());
  ASSERT_EQ(::symlink("/dev/zero", (root / "etc/passwd").c_str()), 0);
  EXPECT_THAT(error_of_in_root("app", root.path()), HasSubstr("no such user"));
  ::unlink((root / "etc/passwd").c_str());
  std::string huge;
  while (huge.size() <= files::kMaxRootFile) huge += "u:x:5:5::/:/bin/sh\n";
  openshell::testing::write_file(root / "etc/passwd", huge);
  EXPECT_EQ(error_of_in_root("app", root.path()), root.path() + "/etc/passwd: larger than 4 MiB");
  huge.resize(files::kMaxRootFile - 100);
  huge += "\napp:x:7:7::/:/bin/sh\n";
  openshell::testing::write_file(root / "etc/passwd", huge);
  EXPECT_EQ(resolve_user_in_root("app", root.path()).uid, 7u);
}

// Layers, top first: the topmost that has the name decides; a whiteout
// hides lower ones; a symlink resolves inside its own layer.
TEST(ReadFromLayers, AWhiteoutHidesTheLowerFile) {
  if (::geteuid() != 0) GTEST_SKIP() << "a whiteout (a 0/0 character device) needs root to make";
  openshell::testing::TempDir top, bottom;
  openshell::testing::write_file(bottom / "etc/passwd", "low:x:1:1::/:/bin/sh\n");
  openshell::testing::write_file(top / "etc/group", "");
  ASSERT_EQ(::mknod((top / "etc/passwd").c_str(), S_IFCHR, makedev(0, 0)), 0);
  EXPECT_EQ(image::read_from_layers({top.path(), bottom.path()}, "etc/passwd"), "");
  ::unlink((top / "etc/passwd").c_str());
  ::unlink((top / "etc/group").c_str());
}

TEST(ReadFromLayers, TopmostLayerDecidesInsideItself) {
  openshell::testing::TempDir top, bottom;
  openshell::testing::write_file(bottom / "etc/passwd", "low:x:1:1::/:/bin/sh\n");
  openshell::testing::write_file(top / "etc/group", "");
  EXPECT_EQ(image::read_from_layers({top.path(), bottom.path()}, "etc/passwd"),
            "low:x:1:1::/:/bin/sh\n");
  ASSERT_EQ(::symlink("/etc/passwd", (top / "etc/passwd").c_str()), 0);
  // Inside the top layer "/etc/passwd" is the link itself: a loop, not the host's file.
  EXPECT_THROW(image::read_from_layers({top.path(), bottom.path()}, "etc/passwd"), Error);
  ::unlink((top / "etc/passwd").c_str());
  ASSERT_EQ(::symlink("/dev/zero", (top / "etc/passwd").c_str()), 0);
  EXPECT_EQ(image::read_from_layers({top.path(), bottom.path()}, "etc/passwd"),
            "");  // no dev/zero there
  ::unlink((top / "etc/passwd").c_str());
  ::unlink((top / "etc/group").c_str());
  ASSERT_EQ(::rmdir((top / "etc").c_str()), 0);
  ASSERT_EQ(::symlink("/etc", (top / "etc").c_str()), 0);
  try {
    image::read_from_layers({top.path(), bottom.path()}, "etc/passwd");
    FAIL() << "etc -> /etc was followed";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), top.path() + "/etc/passwd: too many levels of symbolic links");
  }
  // A link from one layer into another is followed there, as the merged
  // root would; ".." stops at the root.
  ASSERT_EQ(::unlink((top / "etc").c_str()), 0);
  openshell::testing::write_file(bottom / "usr/lib/passwd", "nix:x:3:3::/:/bin/sh\n");
  for (const char* target :
       {"/usr/lib/passwd", "../usr/lib/passwd", "../../../../usr/lib/passwd"}) {
    ::unlink((top / "etc/passwd").c_str());
    std::filesystem::create_directories(top / "etc");
    ASSERT_EQ(::symlink(target, (top / "etc/passwd").c_str()), 0);
    EXPECT_EQ(image::read_from_layers({top.path(), bottom.path()}, "etc/passwd"),
              "nix:x:3:3::/:/bin/sh\n")
        << target;
  }
  ASSERT_EQ(::mkfifo((bottom / "etc/group").c_str(), 0644), 0);
  EXPECT_THROW(image::read_from_layers({top.path(), bottom.path()}, "etc/group"), Error);
}

// An image's User names root by number, by "root", or by a name its passwd
// maps to uid 0.
TEST(NamesRoot, ComparesResolvedIds) {
  const std::string passwd =
      std::string(kPasswd) + "toor:x:0:0::/:/bin/sh\nzero:x:00:5::/:/bin/sh\n";
  for (const char* spec :
       {"0", "00", "0000", "0:0", "00:1000", "root", "root:staff", "toor", "toor:0", "zero"})
    EXPECT_TRUE(names_root(spec, passwd)) << spec;
  for (const char* spec :
       {"1000", "sandbox", "1000:0", "sandbox:root", "nosuch", "daemon", "", "broken"})
    EXPECT_FALSE(names_root(spec, passwd)) << spec;
  EXPECT_TRUE(names_root("root", ""));  // whatever passwd says
}

}  // namespace
}  // namespace openshell::runtime
