#include "cli/copy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <string>

#include <archive.h>
#include <archive_entry.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/unique_fd.h"
#include "test_util.h"

namespace openshell::cli {
namespace {

using ::testing::HasSubstr;

struct Entry {
  mode_t type;
  mode_t perm;
  int64_t uid, gid;
  std::string link;
  std::string data;
};

// What a tar reader (libarchive's) finds in the archive at path.
std::map<std::string, Entry> read_tar(const std::string& path) {
  std::map<std::string, Entry> entries;
  archive* a = ::archive_read_new();
  ::archive_read_support_format_tar(a);
  EXPECT_EQ(::archive_read_open_filename(a, path.c_str(), 10240), ARCHIVE_OK)
      << ::archive_error_string(a);
  archive_entry* e;
  while (::archive_read_next_header(a, &e) == ARCHIVE_OK) {
    Entry entry{::archive_entry_filetype(e),
                ::archive_entry_perm(e),
                ::archive_entry_uid(e),
                ::archive_entry_gid(e),
                ::archive_entry_symlink(e) ? ::archive_entry_symlink(e) : "",
                ""};
    char buf[4096];
    la_ssize_t n;
    while ((n = ::archive_read_data(a, buf, sizeof buf)) > 0)
      entry.data.append(buf, static_cast<size_t>(n));
    entries[::archive_entry_pathname(e)] = entry;
  }
  ::archive_read_free(a);
  return entries;
}

TEST(WriteTar, WritesADirectoryTreeUnderItsBaseName) {
  testing::TempDir dir;
  const std::string src = dir.path() + "/src";
  ASSERT_EQ(::mkdir(src.c_str(), 0750), 0);
  ASSERT_EQ(::mkdir((src + "/sub").c_str(), 0755), 0);
  testing::write_file(src + "/a.txt", "hello\n");
  ASSERT_EQ(::chmod((src + "/a.txt").c_str(), 04755), 0);
  const std::string long_name(150, 'x');
  testing::write_file(src + "/sub/" + long_name, "long\n");
  const std::string long_target(120, 'y');
  ASSERT_EQ(::symlink(long_target.c_str(), (src + "/link").c_str()), 0);

  const std::string tar = dir.path() + "/out.tar";
  {
    UniqueFd fd(::open(tar.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    ASSERT_TRUE(fd);
    write_tar(src, fd.get());
  }
  auto entries = read_tar(tar);
  ASSERT_EQ(entries.size(), 5u);
  ASSERT_TRUE(entries.count("src/"));
  EXPECT_EQ(entries["src/"].type, AE_IFDIR);
  EXPECT_EQ(entries["src/"].perm, 0750u);
  const Entry& a = entries["src/a.txt"];
  EXPECT_EQ(a.type, AE_IFREG);
  EXPECT_EQ(a.perm, 0755u);  // no setuid bit
  EXPECT_EQ(a.uid, 0);
  EXPECT_EQ(a.gid, 0);
  EXPECT_EQ(a.data, "hello\n");
  EXPECT_EQ(entries["src/sub/" + long_name].data, "long\n");
  EXPECT_EQ(entries["src/link"].type, AE_IFLNK);
  EXPECT_EQ(entries["src/link"].link, long_target);
}

TEST(WriteTar, RefusesWhatIsNotAFileDirectoryOrLink) {
  testing::TempDir dir;
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  UniqueFd out(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  try {
    write_tar(fifo, out.get());
    FAIL() << "a FIFO was archived";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "upload: " + fifo + ": not a file, directory or symbolic link");
  }
}

TEST(UploadFailure, OneLineNamingWhatTheSandboxRefused) {
  // busybox's tar, then GNU's.
  EXPECT_EQ(upload_failure("tar: can't make dir up-x: Permission denied\n", "/usr", 1),
            "upload to /usr/up-x: Permission denied");
  EXPECT_EQ(upload_failure("tar: can't create directory 'up': Permission denied\n"
                           "tar: can't open 'up/a.txt': No such file or directory\n"
                           "tar: error exit delayed from previous errors\n",
                           "/usr", 1),
            "upload to /usr/up: Permission denied");
  EXPECT_EQ(upload_failure("tar: up: Cannot mkdir: Read-only file system\n"
                           "tar: Exiting with failure status due to previous errors\n",
                           "/data", 2),
            "upload to /data/up: Read-only file system");
  EXPECT_EQ(upload_failure("tar: ./x: Cannot write: No space left on device\n", "/", 2),
            "upload to /x: No space left on device");
  EXPECT_EQ(upload_failure("\n  \n", "/usr", 1),
            "upload to /usr: tar in the sandbox ended with status 1");
  EXPECT_EQ(upload_failure("tar: short read\n", "/usr", 1), "upload to /usr: short read");
  EXPECT_EQ(upload_failure("tar: x: Permission denied\n", "/usr", 1),
            "upload to /usr/x: Permission denied");
}

TEST(TarFailure, DownloadNamesThePathInTheSandbox) {
  // busybox's tar, then GNU's.
  EXPECT_EQ(tar_failure("tar: nothere: No such file or directory\n", "download of ", "/sandbox", 1),
            "download of /sandbox/nothere: No such file or directory");
  EXPECT_EQ(tar_failure("tar: can't open './src/secret': Permission denied\n"
                        "tar: error exit delayed from previous errors\n",
                        "download of ", "/sandbox", 1),
            "download of /sandbox/src/secret: Permission denied");
  EXPECT_EQ(tar_failure("tar: ./nothere: Cannot stat: No such file or directory\n"
                        "tar: Exiting with failure status due to previous errors\n",
                        "download of ", "/", 2),
            "download of /nothere: No such file or directory");
}

}  // namespace
}  // namespace openshell::cli
