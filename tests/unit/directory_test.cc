#include "base/directory.h"

#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "test_util.h"

namespace openshell::files {
namespace {

using openshell::testing::ChildWriter;
using openshell::testing::path_exists;
using openshell::testing::read_file;
using openshell::testing::run_in_child;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

size_t open_fds() {
  size_t count = 0;
  for_each_entry("/proc/self/fd", [&count](const char*, unsigned char) {
    ++count;
    return true;
  });
  return count;
}

// ---- listing ------------------------------------------------------------------

TEST(ListDirectory, SortedNamesWithoutDots) {
  TempDir tmp;
  write_file(tmp / "b", "");
  write_file(tmp / ".hidden", "");
  write_file(tmp / "a/inner", "");
  ASSERT_EQ(::symlink("/", (tmp / "c").c_str()), 0);
  EXPECT_THAT(list_directory(tmp.path()), ElementsAre(".hidden", "a", "b", "c"));
  EXPECT_THAT(list_directory(tmp / "a"), ElementsAre("inner"));
}

TEST(ListDirectory, AbsentIsEmptyAndOtherErrorsSayWhat) {
  TempDir tmp;
  EXPECT_THAT(list_directory(tmp / "absent"), IsEmpty());
  write_file(tmp / "file", "x");
  try {
    list_directory(tmp / "file");
    ADD_FAILURE() << "listed a file";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "read " + tmp / "file" + ": Not a directory");
  }
}

TEST(ListDirectory, ReadsPastOneBuffer) {
  // 2000 names of 40 bytes need several getdents64 calls of 8 KiB.
  TempDir tmp;
  std::vector<std::string> expected;
  for (int i = 0; i < 2000; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "entry-%04d-%s", i, std::string(28, 'x').c_str());
    expected.push_back(name);
    ASSERT_EQ(::mknod((tmp / name).c_str(), S_IFREG | 0600, 0), 0) << std::strerror(errno);
  }
  EXPECT_EQ(list_directory(tmp.path()), expected);
}

TEST(ForEachEntry, StopsWhenTheVisitorSaysSo) {
  TempDir tmp;
  for (const char* name : {"a", "b", "c", "d"}) write_file(tmp / name, "");
  int seen = 0;
  EXPECT_EQ(for_each_entry(tmp.path(), [&seen](const char*, unsigned char) { return ++seen < 2; }),
            0);
  EXPECT_EQ(seen, 2);
}

TEST(ForEachEntry, TypesAndErrors) {
  TempDir tmp;
  write_file(tmp / "file", "");
  ASSERT_EQ(::mkdir((tmp / "dir").c_str(), 0700), 0);
  std::vector<std::string> seen;
  EXPECT_EQ(for_each_entry(tmp.path(),
                           [&](const char* name, unsigned char type) {
                             if (type != DT_UNKNOWN)
                               seen.push_back(std::string(name) + (type == DT_DIR ? "/" : ""));
                             return true;
                           }),
            0);
  if (seen.empty()) GTEST_SKIP() << "the file system under " << tmp.path() << " gives no types";
  std::sort(seen.begin(), seen.end());
  EXPECT_THAT(seen, ElementsAre("dir/", "file"));
  EXPECT_EQ(for_each_entry(tmp / "absent", [](const char*, unsigned char) { return true; }),
            ENOENT);
  EXPECT_EQ(for_each_entry(tmp / "file", [](const char*, unsigned char) { return true; }), ENOTDIR);
}

TEST(ForEachEntry, ClosesTheDirectoryWhenTheVisitorThrows) {
  TempDir tmp;
  write_file(tmp / "a", "");
  const size_t before = open_fds();
  for (int i = 0; i < 3; ++i) {
    EXPECT_THROW(for_each_entry(tmp.path(),
                                [](const char*, unsigned char) -> bool {
                                  throw std::runtime_error("visitor");
                                }),
                 std::runtime_error);
  }
  EXPECT_EQ(open_fds(), before);
}

TEST(EntryReader, ReadsFromTheStartEveryTime) {
  TempDir tmp;
  write_file(tmp / "only", "");
  UniqueFd dir(::open(tmp.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ASSERT_TRUE(dir);
  for (int pass = 0; pass < 2; ++pass) {
    EntryReader reader(dir.get());
    const dirent64* entry = reader.next();
    ASSERT_NE(entry, nullptr) << "pass " << pass;
    EXPECT_STREQ(entry->d_name, "only");
    EXPECT_EQ(reader.next(), nullptr);
    EXPECT_EQ(reader.error(), 0);
  }
  UniqueFd file(::open((tmp / "only").c_str(), O_RDONLY | O_CLOEXEC));
  EntryReader not_a_directory(file.get());
  EXPECT_EQ(not_a_directory.next(), nullptr);
  EXPECT_EQ(not_a_directory.error(), ENOTDIR);
}

// ---- removing -----------------------------------------------------------------

TEST(RemoveTree, RemovesFilesLinksFifosAndDirectories) {
  TempDir tmp;
  const std::string top = tmp / "top";
  write_file(top + "/a/b/c/file", "x");
  write_file(top + "/a/other", "y");
  ASSERT_EQ(::mkfifo((top + "/a/fifo").c_str(), 0600), 0);
  ASSERT_EQ(::symlink("b", (top + "/a/link").c_str()), 0);
  ASSERT_EQ(::mkdir((top + "/empty").c_str(), 0700), 0);
  remove_tree(top);
  EXPECT_FALSE(path_exists(top));
  EXPECT_THAT(list_directory(tmp.path()), IsEmpty());
  EXPECT_NO_THROW(remove_tree(top));  // absent is fine
  EXPECT_NO_THROW(remove_tree(tmp / "absent/below/it"));
}

TEST(RemoveTree, RemovesAFileOrALinkItself) {
  TempDir tmp;
  write_file(tmp / "file", "x");
  remove_tree(tmp / "file");
  EXPECT_FALSE(path_exists(tmp / "file"));
  write_file(tmp / "kept/inside", "kept");
  ASSERT_EQ(::symlink((tmp / "kept").c_str(), (tmp / "link").c_str()), 0);
  remove_tree(tmp / "link");  // the link goes ...
  EXPECT_FALSE(path_exists(tmp / "link"));
  EXPECT_EQ(read_file(tmp / "kept/inside"), "kept");  // ... not what it points to
  remove_tree(tmp / "kept/");                         // a trailing slash names the same directory
  EXPECT_FALSE(path_exists(tmp / "kept"));
}

TEST(RemoveTree, NeverFollowsASymlinkOutOfTheTree) {
  TempDir tmp;
  const std::string outside = tmp / "outside";
  write_file(outside + "/precious", "keep me");
  ASSERT_EQ(::mkdir((outside + "/sub").c_str(), 0755), 0);
  const std::string top = tmp / "top";
  write_file(top + "/a/file", "");
  ASSERT_EQ(::symlink(outside.c_str(), (top + "/a/to_outside").c_str()), 0);
  ASSERT_EQ(::symlink((outside + "/sub").c_str(), (top + "/to_sub").c_str()), 0);
  ASSERT_EQ(::symlink("../../outside", (top + "/a/relative").c_str()), 0);
  remove_tree(top);
  EXPECT_FALSE(path_exists(top));
  EXPECT_EQ(read_file(outside + "/precious"), "keep me");
  EXPECT_TRUE(path_exists(outside + "/sub"));
}

TEST(RemoveTree, RefusesPathsWithoutALastComponent) {
  for (const char* bad : {"", "/", "//", ".", "..", "/tmp/..", "a/."}) {
    try {
      remove_tree(bad);
      ADD_FAILURE() << "removed '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("remove ") + bad + ": not a removable path");
    }
  }
}

TEST(RemoveTree, DeepTreesWithFewDescriptors) {
  // 200 levels, each with a file and an empty directory, under a limit of 32
  // descriptors: the tree is climbed again from its top below 16 levels.
  TempDir tmp;
  const std::string top = tmp / "top";
  ASSERT_EQ(::mkdir(top.c_str(), 0755), 0);
  {
    UniqueFd dir(::open(top.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    for (int i = 0; i < 200; ++i) {
      ASSERT_EQ(::mknodat(dir.get(), "f", S_IFREG | 0600, 0), 0);
      ASSERT_EQ(::mkdirat(dir.get(), "e", 0700), 0);
      ASSERT_EQ(::mkdirat(dir.get(), "d", 0700), 0);
      dir.reset(::openat(dir.get(), "d", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      ASSERT_TRUE(dir);
    }
  }
  const size_t before = open_fds();
  auto report = run_in_child([&](ChildWriter& out) {
    rlimit limit{32, 32};
    ::setrlimit(RLIMIT_NOFILE, &limit);
    UniqueFd parent(::open(tmp.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    out.say(std::to_string(remove_tree_at(parent.get(), "top")));
  });
  EXPECT_EQ(report.text, "0\n");
  EXPECT_FALSE(path_exists(top));
  EXPECT_EQ(open_fds(), before);
}

TEST(RemoveTree, ModesDoNotStandInTheWay) {
  // As an ordinary user (nobody, when run as root): 0000 and 0555
  // directories, 0000 files.
  TempDir tmp;
  ASSERT_EQ(::chmod(tmp.path().c_str(), 0777), 0);
  const std::string top = tmp / "top";
  auto report = run_in_child([&](ChildWriter& out) {
    if (::geteuid() == 0 &&
        (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
         ::setresuid(65534, 65534, 65534) != 0)) {
      out.say("cannot drop privileges");
      return;
    }
    write_file(top + "/closed/inner/file", "x");
    write_file(top + "/closed/file", "y");
    write_file(top + "/ro/file", "z");
    ::chmod((top + "/closed/inner/file").c_str(), 0);
    ::chmod((top + "/closed/inner").c_str(), 0);
    ::chmod((top + "/closed").c_str(), 0);
    ::chmod((top + "/ro").c_str(), 0555);
    ::chmod(top.c_str(), 0555);
    if (::access((top + "/closed").c_str(), R_OK) == 0) {
      out.say("the modes do not hold here");
      return;
    }
    try {
      remove_tree(top);
      out.say(path_exists(top) ? "still there" : "removed");
    } catch (const Error& e) {
      out.say(e.what());
    }
  });
  if (report.text == "cannot drop privileges\n") GTEST_SKIP() << "cannot become nobody";
  EXPECT_EQ(report.text, "removed\n");
  EXPECT_FALSE(path_exists(top));
}

TEST(RemoveTree, NeverEntersAnotherMount) {
  // In a mount namespace of its own, a tmpfs mounted inside the tree stays
  // whole, and the removal says why it stopped.
  TempDir tmp;
  const std::string top = tmp / "top";
  write_file(top + "/a/file", "x");
  ASSERT_EQ(::mkdir((top + "/a/mnt").c_str(), 0755), 0);
  auto report = run_in_child([&](ChildWriter& out) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) ||
        ::mount("tmpfs", (top + "/a/mnt").c_str(), "tmpfs", 0, nullptr) != 0) {
      out.say(std::string("no mount: ") + std::strerror(errno));
      return;
    }
    write_file(top + "/a/mnt/kept", "kept");
    try {
      remove_tree(top);
      out.say("removed");
    } catch (const Error& e) {
      out.say(e.what());
    }
    out.say(read_file(top + "/a/mnt/kept"));
    out.say(path_exists(top + "/a/file") ? "file there" : "file gone");
    // The mount point itself is refused as a tree's top too.
    UniqueFd parent(::open((top + "/a").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    out.say(std::to_string(remove_tree_at(parent.get(), "mnt") == EXDEV));
    out.say(read_file(top + "/a/mnt/kept"));
  });
  if (report.text.rfind("no mount: ", 0) == 0)
    GTEST_SKIP() << "cannot mount a tmpfs here (" << report.text << ")";
  EXPECT_EQ(report.text, "remove " + top + ": is or holds a mount point; unmount it first\n" +
                             "kept\nfile gone\n1\nkept\n");
}

}  // namespace
}  // namespace openshell::files
