// The sandbox's persisted logs: CRI records, and files that keep one older
// part when they grow past their limit.
#include "base/logfile.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "base/files.h"
#include "test_util.h"

namespace openshell::logfile {
namespace {

using openshell::testing::TempDir;

std::string read(const std::string& path) { return files::try_read(path).value_or("(missing)"); }

TEST(LogRecord, FormatsAndParsesCriLines) {
  Record r{1764445883123456789, "stderr", true, "half a line"};
  const std::string line = format(r);
  EXPECT_EQ(line, "2025-11-29T19:51:23.123456789Z stderr P half a line\n");
  auto back = parse(std::string_view(line).substr(0, line.size() - 1));
  ASSERT_TRUE(back);
  EXPECT_EQ(back->time_ns, r.time_ns);
  EXPECT_EQ(back->stream, "stderr");
  EXPECT_TRUE(back->partial);
  EXPECT_EQ(back->text, "half a line");
  EXPECT_FALSE(parse("not a record"));
}

TEST(LogWriter, WritesWholeLinesAndThePartialOneAtTheEnd) {
  TempDir dir;
  const std::string path = dir.path() + "/main.log";
  {
    Writer w(path);
    w.write("stdout", "one\ntw", 1);
    w.write("stdout", "o\nthree", 2);
    w.flush_partial("stdout", 3);
  }
  EXPECT_EQ(read(path), format({1, "stdout", false, "one"}) + format({2, "stdout", false, "two"}) +
                            format({3, "stdout", true, "three"}));
}

TEST(RotatingFile, KeepsOneOlderPartAndTheNewestLines) {
  TempDir dir;
  const std::string path = dir.path() + "/network.log";
  {
    RotatingFile f(path, 10);
    f.append("aaaa\n");
    f.append("bbbb\n");  // 10 bytes: still fits
    f.append("cccc\n");  // would pass 10: the first part becomes .1
    f.append("dddd\n");
    f.append("eeee\n");  // again: .1 is replaced
  }
  EXPECT_EQ(read(path + ".1"), "cccc\ndddd\n");
  EXPECT_EQ(read(path), "eeee\n");
  // A line longer than the limit still lands, once, in a file of its own.
  {
    RotatingFile f(path, 10);  // reopened: it goes on from the file's size
    f.append("a line longer than ten bytes\n");
  }
  EXPECT_EQ(read(path + ".1"), "eeee\n");
  EXPECT_EQ(read(path), "a line longer than ten bytes\n");
}

TEST(RotatingFile, NeverWritesThroughASymbolicLink) {
  TempDir dir;
  const std::string target = dir.path() + "/precious";
  const std::string link = dir.path() + "/network.log";
  openshell::testing::write_file(target, "keep me\n");
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  RotatingFile f(link, 1 << 20);
  EXPECT_FALSE(f.is_open());
  EXPECT_EQ(f.error(), "is a symbolic link (a log file is never opened through one)");
  f.append("planted\n");
  EXPECT_EQ(read(target), "keep me\n");
  // A dangling link is not followed to create its target either.
  const std::string dangling = dir.path() + "/dangling.log";
  ASSERT_EQ(::symlink((dir.path() + "/created").c_str(), dangling.c_str()), 0);
  EXPECT_FALSE(RotatingFile(dangling).is_open());
  EXPECT_EQ(::access((dir.path() + "/created").c_str(), F_OK), -1);
}

TEST(RotatingFile, RefusesWhatIsNotARegularFile) {
  TempDir dir;
  const std::string fifo = dir.path() + "/fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  RotatingFile f(fifo);  // without O_NONBLOCK this would hang for a reader
  EXPECT_FALSE(f.is_open());
  EXPECT_EQ(f.error(), "is not a regular file");
  RotatingFile null("/dev/null");
  EXPECT_FALSE(null.is_open());
  EXPECT_EQ(null.error(), "is not a regular file");
  RotatingFile missing(dir.path() + "/no/such/dir/log");
  EXPECT_FALSE(missing.is_open());
  EXPECT_EQ(missing.error(), "No such file or directory");
}

TEST(RotatingFile, AFloodStaysWithinTwiceTheLimit) {
  TempDir dir;
  const std::string path = dir.path() + "/network.log";
  const std::string line(999, 'x');
  {
    RotatingFile f(path, 64 * 1024);
    for (int i = 0; i < 5000; ++i) f.append(line + "\n");  // 5 MB offered
  }
  struct stat now {
  }, older{};
  ASSERT_EQ(::stat(path.c_str(), &now), 0);
  ASSERT_EQ(::stat((path + ".1").c_str(), &older), 0);
  EXPECT_LE(now.st_size, 64 * 1024);
  EXPECT_LE(older.st_size, 64 * 1024);
  EXPECT_GT(older.st_size, 60 * 1024);
  EXPECT_EQ(now.st_mode & 07777, 0600u);
}

}  // namespace
}  // namespace openshell::logfile
