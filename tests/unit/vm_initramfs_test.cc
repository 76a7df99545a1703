// The micro-VM's initramfs (vm/initramfs.h): a newc cpio archive that
// Debian's cpio reads back entry by entry, byte for byte, gzip that gunzip
// reads, and paths that could escape the archive's root refused.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "vm/initramfs.h"

namespace openshell::vm {
namespace {

using initramfs::Entry;
using T = Entry::Type;

bool have(const char* tool) {
  std::string cmd = std::string("command -v ") + tool + " >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

class Initramfs : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/osh-initramfs-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { files::remove_tree(dir_); }
  std::string dir_;
};

TEST_F(Initramfs, CpioListsAndExtractsEveryEntry) {
  if (!have("cpio")) GTEST_SKIP() << "needs cpio (apt-get install cpio)";
  std::string odd(5, '\0');  // lengths that are not multiples of 4, NULs inside
  odd[2] = 'x';
  std::vector<Entry> entries = {
      {T::kDirectory, "etc", 0755, {}},
      {T::kFile, "etc/config", 0600, "{\"argv\":[\"/bin/true\"]}"},
      {T::kFile, "init", 0755, std::string(70000, 'b')},
      {T::kFile, "etc/odd", 0644, odd},
      {T::kSymlink, "sbin", 0777, "etc"},
  };
  files::write(dir_ + "/a.cpio", initramfs::write(entries));
  EXPECT_EQ(run("cpio -t --quiet < " + dir_ + "/a.cpio"), "etc\netc/config\ninit\netc/odd\nsbin\n");

  ASSERT_EQ(mkdir((dir_ + "/out").c_str(), 0700), 0);
  ASSERT_EQ(std::system(("cd " + dir_ + "/out && cpio -i --quiet < ../a.cpio").c_str()), 0);
  EXPECT_EQ(files::read(dir_ + "/out/etc/config"), entries[1].data);
  EXPECT_EQ(files::read(dir_ + "/out/init"), entries[2].data);
  EXPECT_EQ(files::read(dir_ + "/out/etc/odd"), odd);
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/out/init").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0755u);
  ASSERT_EQ(stat((dir_ + "/out/etc/config").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0600u);
  char target[16] = {};
  ASSERT_EQ(readlink((dir_ + "/out/sbin").c_str(), target, sizeof target - 1), 3);
  EXPECT_STREQ(target, "etc");
}

TEST_F(Initramfs, RecordsArePaddedToFourBytesAndEndWithTheTrailer) {
  std::string a = initramfs::write({{T::kFile, "a", 0644, "xyz"}});
  EXPECT_EQ(a.size() % 4, 0u);
  EXPECT_EQ(a.substr(0, 6), "070701");
  EXPECT_NE(a.find("TRAILER!!!"), std::string::npos);
  // The same entries give the same bytes (mtime 0): the cache can key on them.
  EXPECT_EQ(a, initramfs::write({{T::kFile, "a", 0644, "xyz"}}));
}

TEST_F(Initramfs, GzipIsWhatGunzipReads) {
  if (!have("gzip")) GTEST_SKIP() << "needs gzip";
  std::string archive = initramfs::write({{T::kFile, "init", 0755, std::string(100000, 'q')}});
  std::string packed = initramfs::gzip(archive);
  EXPECT_LT(packed.size(), archive.size() / 10);
  files::write(dir_ + "/a.cpio.gz", packed);
  EXPECT_EQ(run("gzip -dc < " + dir_ + "/a.cpio.gz"), archive);
}

TEST_F(Initramfs, PathsThatCouldLeaveTheRootAreRefused) {
  for (const char* bad : {"", "/init", "../init", "etc/../../x", "a//b", "./init", "etc/."}) {
    EXPECT_THROW(initramfs::write({{T::kFile, bad, 0644, "x"}}), Error) << bad;
  }
  EXPECT_THROW(initramfs::write({{T::kFile, std::string(4096, 'a'), 0644, "x"}}), Error);
}

TEST_F(Initramfs, ForGuestHoldsTheBinaryAsInitAndTheConfig) {
  if (!have("cpio")) GTEST_SKIP() << "needs cpio (apt-get install cpio)";
  files::write(dir_ + "/bin", "ELF-ish");
  files::write(dir_ + "/g.cpio.gz", initramfs::for_guest(dir_ + "/bin", "{\"port\":1024}", true));
  std::string listing = run("gzip -dc < " + dir_ + "/g.cpio.gz | cpio -t --quiet");
  EXPECT_NE(listing.find("\ninit\n"), std::string::npos) << listing;
  EXPECT_NE(listing.find("etc/openshell-guest.json"), std::string::npos) << listing;
  ASSERT_EQ(mkdir((dir_ + "/out").c_str(), 0700), 0);
  ASSERT_EQ(
      std::system(("cd " + dir_ + "/out && gzip -dc < ../g.cpio.gz | cpio -i --quiet").c_str()), 0);
  EXPECT_EQ(files::read(dir_ + "/out/init"), "ELF-ish");
  EXPECT_EQ(files::read(dir_ + "/out/etc/openshell-guest.json"), "{\"port\":1024}");
  try {
    initramfs::for_guest(dir_ + "/missing", "{}", false);
    FAIL() << "no error for a missing binary";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir_ + "/missing"), std::string::npos) << e.what();
  }
}

// The two archives a --vm sandbox's VMM concatenates: the binary's, kept,
// and the configuration's, made at each start; each whole (its own
// trailer), together for_guest's entries.
TEST_F(Initramfs, TheBinarysAndTheConfigurationsArchivesSplitForGuest) {
  if (!have("cpio")) GTEST_SKIP() << "needs cpio (apt-get install cpio)";
  files::write(dir_ + "/bin", "ELF-ish");
  files::write(dir_ + "/init.cpio", initramfs::init_archive(dir_ + "/bin"));
  files::write(dir_ + "/config.cpio", initramfs::config_archive("{\"port\":1024}"));
  std::string init = run("cpio -t --quiet < " + dir_ + "/init.cpio");
  EXPECT_NE(init.find("\ninit\n"), std::string::npos) << init;
  EXPECT_NE(init.find("dev/console"), std::string::npos) << init;
  EXPECT_EQ(init.find("openshell-guest.json"), std::string::npos) << init;
  std::string config = run("cpio -t --quiet < " + dir_ + "/config.cpio");
  EXPECT_EQ(config, "etc\netc/openshell-guest.json\n");
  ASSERT_EQ(mkdir((dir_ + "/out").c_str(), 0700), 0);
  ASSERT_EQ(std::system(("cd " + dir_ + "/out && cpio -i --quiet < ../config.cpio").c_str()), 0);
  EXPECT_EQ(files::read(dir_ + "/out/etc/openshell-guest.json"), "{\"port\":1024}");
  EXPECT_EQ(initramfs::init_archive(dir_ + "/bin").size() % 4, 0u);
}

}  // namespace
}  // namespace openshell::vm
