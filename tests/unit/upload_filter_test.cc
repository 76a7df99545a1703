#include "cli/upload_filter.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/text.h"
#include "base/unique_fd.h"
#include "cli/copy.h"
#include "test_util.h"

namespace openshell::cli {
namespace {

using ::testing::ElementsAre;

// A project: sources, logs, a build directory, an empty directory.
void make_project(const std::string& root) {
  ASSERT_EQ(::mkdir((root + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/build").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/empty").c_str(), 0755), 0);
  testing::write_file(root + "/.gitignore", "# logs\n*.log\n/build/\n\n!keep.log\n");
  testing::write_file(root + "/a.txt", "a\n");
  testing::write_file(root + "/x.log", "log\n");
  testing::write_file(root + "/keep.log", "kept\n");
  testing::write_file(root + "/build/out", "binary\n");
  testing::write_file(root + "/sub/b.txt", "bb\n");
  testing::write_file(root + "/sub/y.log", "log\n");
  testing::write_file(root + "/sub/.gitignore", "b.txt\n");
  testing::write_file(root + "/sub/build", "a file named build: /build/ is anchored\n");
}

// The names write_tar archives from `dir` with the filter.
std::vector<std::string> archived(const std::string& dir, const UploadFilter& filter,
                                  UploadStats* stats = nullptr) {
  UniqueFd out(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  UploadStats s = write_tar(dir, out.get(), filter);
  std::sort(s.names.begin(), s.names.end());
  if (stats) *stats = s;
  return s.names;
}

TEST(UploadFilter, GitignoreFilesWithoutGit) {
  testing::TempDir tmp;
  const std::string root = tmp / "proj";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  make_project(root);
  ASSERT_EQ(::mkdir((root + "/.git").c_str(), 0755), 0);  // not a repository: left out anyway
  GitIgnore ignore = git_ignore_filter(root);
  EXPECT_EQ(ignore.how, ".gitignore files");
  UploadStats stats;
  EXPECT_THAT(archived(root, ignore.filter, &stats),
              ElementsAre("proj", "proj/.gitignore", "proj/a.txt", "proj/empty", "proj/keep.log",
                          "proj/sub", "proj/sub/.gitignore", "proj/sub/build"));
  // .git, build (whole), x.log, sub/b.txt, sub/y.log.
  EXPECT_EQ(stats.ignored, 5u);
  EXPECT_EQ(stats.files, 5u);
  EXPECT_EQ(stats.directories, 3u);
  EXPECT_EQ(upload_summary(stats, "/sandbox", ignore.how),
            "copied 5 files, 3 directories (" + text::format_bytes(stats.bytes) +
                ") into /sandbox; 5 left out by .gitignore files (--no-git-ignore copies them)");
}

TEST(UploadFilter, GitDecidesInAWorkTree) {
  if (std::system("git --version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no git on this machine";
  testing::TempDir tmp;
  const std::string root = tmp / "repo";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  make_project(root);
  ASSERT_EQ(std::system(("git init -q " + root).c_str()), 0);
  GitIgnore ignore = git_ignore_filter(root);
  EXPECT_EQ(ignore.how, "git");
  // As git sees it: the empty directory and .git are not there either.
  EXPECT_THAT(archived(root, ignore.filter),
              ElementsAre("repo", "repo/.gitignore", "repo/a.txt", "repo/keep.log", "repo/sub",
                          "repo/sub/.gitignore", "repo/sub/build"));
  // A subdirectory of the work tree: git's view of it.
  EXPECT_THAT(archived(root + "/sub", git_ignore_filter(root + "/sub").filter),
              ElementsAre("sub", "sub/.gitignore", "sub/build"));
}

TEST(UploadFilter, NoFilterCopiesEverything) {
  testing::TempDir tmp;
  const std::string root = tmp / "all";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  make_project(root);
  UploadStats stats;
  archived(root, {}, &stats);
  EXPECT_EQ(stats.ignored, 0u);
  EXPECT_EQ(stats.files, 9u);
  EXPECT_EQ(upload_summary(UploadStats{1, 0, 0, 2, 0, {}}, "/tmp", "git"),
            "copied 1 file (2 B) into /tmp");
}

}  // namespace
}  // namespace openshell::cli
