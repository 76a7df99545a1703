// The micro-VM's disks (vm/disk.h): an ext4 image made from a tree without
// mounting anything, its contents as debugfs reads them, its size, the
// per-image cache (a hit does not fill again), the writable layer kept across
// calls, and no file left behind by any failure.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include <gtest/gtest.h>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "image/flatten.h"
#include "vm/disk.h"

namespace openshell::vm {
namespace {

bool have_e2fsprogs() {
  return access("/usr/sbin/mkfs.ext4", X_OK) == 0 && access("/usr/sbin/debugfs", X_OK) == 0;
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

std::string debugfs(const std::string& image, const std::string& request) {
  return run("/usr/sbin/debugfs -R '" + request + "' " + image + " 2>/dev/null");
}

class Disk : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!have_e2fsprogs())
      GTEST_SKIP() << "needs mkfs.ext4 and debugfs (apt-get install e2fsprogs)";
    char tmpl[] = "/tmp/osh-disk-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) files::remove_tree(dir_);
  }
  // A small tree: a busybox-like layout, a script, a link, a private file.
  uint64_t fill(const std::string& root) {
    for (const char* d : {"/bin", "/etc", "/tmp"}) mkdir((root + d).c_str(), 0755);
    chmod((root + "/tmp").c_str(), 01777);
    files::write(root + "/bin/hello", "#!/bin/sh\necho hello\n");
    chmod((root + "/bin/hello").c_str(), 0755);
    files::write(root + "/etc/secret", std::string(10000, 's'));
    chmod((root + "/etc/secret").c_str(), 0600);
    symlink("hello", (root + "/bin/hi").c_str());
    return 21 + 10000;
  }
  std::vector<std::string> entries_in_cache() {
    std::vector<std::string> names = files::list_directory(dir_ + "/cache");
    return names;
  }
  std::string dir_;
};

TEST_F(Disk, AnImageDiskHoldsTheTreeAsDebugfsReadsIt) {
  ASSERT_EQ(mkdir((dir_ + "/cache").c_str(), 0700), 0);
  int fills = 0;
  disk::CachedDisk d =
      disk::image_disk(dir_ + "/cache", "sha256:0123abcd", [&](const std::string& t) {
        ++fills;
        return fill(t);
      });
  EXPECT_TRUE(d.made);
  EXPECT_EQ(d.path, dir_ + "/cache/sha256-0123abcd.ext4");
  std::string root = debugfs(d.path, "ls -l /");
  EXPECT_NE(root.find(" bin"), std::string::npos) << root;
  EXPECT_NE(root.find(" etc"), std::string::npos) << root;
  EXPECT_NE(root.find("41777"), std::string::npos) << "tmp keeps its sticky bit: " << root;
  EXPECT_EQ(debugfs(d.path, "cat /bin/hello"), "#!/bin/sh\necho hello\n");
  EXPECT_EQ(debugfs(d.path, "cat /etc/secret"), std::string(10000, 's'));
  std::string bin = debugfs(d.path, "ls -l /bin");
  EXPECT_NE(bin.find("100755"), std::string::npos) << bin;
  std::string link = debugfs(d.path, "stat /bin/hi");
  EXPECT_NE(link.find("Fast link dest: \"hello\""), std::string::npos) << link;
  std::string secret = debugfs(d.path, "stat /etc/secret");
  EXPECT_NE(secret.find("Mode:  0600"), std::string::npos) << secret;
  EXPECT_NE(debugfs(d.path, "stats").find("Filesystem volume name:   osh-image"),
            std::string::npos);

  struct stat st {};
  ASSERT_EQ(stat(d.path.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), disk::size_for(10021, 7));
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  // The second call finds it: no second fill, the same file.
  disk::CachedDisk again =
      disk::image_disk(dir_ + "/cache", "sha256:0123abcd", [&](const std::string& t) {
        ++fills;
        return fill(t);
      });
  EXPECT_FALSE(again.made);
  EXPECT_EQ(again.path, d.path);
  EXPECT_EQ(fills, 1);
  // Nothing but the disk in the cache: the tree it came from is gone.
  EXPECT_EQ(entries_in_cache(), std::vector<std::string>{"sha256-0123abcd.ext4"});
}

TEST_F(Disk, TheBusyboxImageFlattenedIsADiskWithItsShell) {
  const std::string rootfs = dir_ + "/busybox";
  std::string cmd = std::string(OSH_SOURCE_ROOT) + "/rootfs-tools/build-busybox-rootfs " + rootfs +
                    " >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) GTEST_SKIP() << "needs a static busybox (busybox-static)";
  ASSERT_EQ(mkdir((dir_ + "/cache").c_str(), 0700), 0);
  disk::CachedDisk d = disk::image_disk(dir_ + "/cache", "sha256:b0b0", [&](const std::string& t) {
    return image::flatten_layers({rootfs}, t);
  });
  ASSERT_TRUE(d.made);
  std::string root = debugfs(d.path, "ls -l /");
  for (const char* name : {" bin", " etc", " proc", " sandbox", " tmp", " usr"})
    EXPECT_NE(root.find(name), std::string::npos) << name << " in " << root;
  std::string sh = debugfs(d.path, "stat /bin/sh");
  EXPECT_NE(sh.find("Type: symlink"), std::string::npos) << sh;
  std::string busybox = debugfs(d.path, "stat /bin/busybox");
  EXPECT_NE(busybox.find("Mode:  0755"), std::string::npos) << busybox;
  // e2fsck finds nothing to repair.
  EXPECT_EQ(std::system(("/usr/sbin/e2fsck -fn " + d.path + " >/dev/null 2>&1").c_str()), 0);
}

TEST_F(Disk, SizesGrowWithContentAndEntries) {
  EXPECT_EQ(disk::size_for(0, 0), 64 * disk::kMiB);
  EXPECT_GT(disk::size_for(100 * disk::kMiB, 0), 150 * disk::kMiB);
  EXPECT_GT(disk::size_for(0, 10000), disk::size_for(0, 0));
  EXPECT_EQ(disk::size_for(12345, 3) % disk::kMiB, 0u);
}

TEST_F(Disk, AFailedFillOrMkfsLeavesNoFile) {
  ASSERT_EQ(mkdir((dir_ + "/cache").c_str(), 0700), 0);
  EXPECT_THROW(disk::image_disk(dir_ + "/cache", "sha256:aa",
                                [&](const std::string&) -> uint64_t { throw Error("no layers"); }),
               Error);
  EXPECT_TRUE(entries_in_cache().empty());
  // A tree that does not fit: mkfs.ext4 fails, its line in the error.
  try {
    disk::make_ext4(dir_ + "/cache/small.ext4", 4 * disk::kMiB, dir_ + "/cache", "x");
    files::write(dir_ + "/big", std::string(8 * disk::kMiB, 'b'));
    disk::make_ext4(dir_ + "/cache/tiny.ext4", 4 * disk::kMiB, dir_, "x");
    FAIL() << "mkfs.ext4 fit 8 MiB in 4";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mkfs.ext4 failed"), std::string::npos) << e.what();
  }
  EXPECT_EQ(entries_in_cache(), std::vector<std::string>{"small.ext4"});
  EXPECT_THROW(disk::make_ext4(dir_ + "/cache/small.ext4", 8 * disk::kMiB, "", "x"), Error)
      << "an existing disk is never overwritten";
  EXPECT_THROW(disk::make_ext4(dir_ + "/cache/z.ext4", disk::kMiB, "", "x"), Error);
  EXPECT_THROW(disk::make_ext4(dir_ + "/nodir/z.ext4", 8 * disk::kMiB, "", "x"), Error);
}

TEST_F(Disk, KeysThatAreNotDigestsAreRefused) {
  for (const char* bad : {"", "../x", "a/b", ".hidden", "sha256:ab cd", "x\n"}) {
    EXPECT_THROW(disk::image_disk(dir_, bad, [](const std::string&) { return uint64_t{0}; }), Error)
        << bad;
  }
}

TEST_F(Disk, TheWritableLayerSurvivesASecondCall) {
  std::string layer = dir_ + "/layer.ext4";
  EXPECT_TRUE(disk::writable_layer(layer, 32 * disk::kMiB));
  // What the sandbox wrote (here: debugfs in write mode) is kept.
  run("/usr/sbin/debugfs -w -R 'mkdir kept' " + layer + " 2>/dev/null");
  EXPECT_FALSE(disk::writable_layer(layer, 32 * disk::kMiB));
  EXPECT_NE(debugfs(layer, "ls -l /").find("kept"), std::string::npos);
  EXPECT_NE(debugfs(layer, "stats").find("Filesystem volume name:   osh-layer"), std::string::npos);
  struct stat st {};
  ASSERT_EQ(stat(layer.c_str(), &st), 0);
  EXPECT_EQ(static_cast<uint64_t>(st.st_size), 32 * disk::kMiB);
  EXPECT_LT(static_cast<uint64_t>(st.st_blocks) * 512, 32 * disk::kMiB) << "sparse";
}

// A --from directory's disk: the directory as it is at each start.
TEST_F(Disk, ADirectorysDiskIsMadeAgainFromWhatItHoldsNow) {
  const std::string tree = dir_ + "/tree";
  ASSERT_EQ(mkdir(tree.c_str(), 0755), 0);
  fill(tree);
  const std::string file = dir_ + "/root.ext4";
  disk::directory_disk(file, tree);
  EXPECT_EQ(debugfs(file, "cat /bin/hello"), "#!/bin/sh\necho hello\n");
  EXPECT_NE(debugfs(file, "stats").find("Filesystem volume name:   osh-root"), std::string::npos);
  files::write(tree + "/etc/added", "later\n");
  disk::directory_disk(file, tree);
  EXPECT_EQ(debugfs(file, "cat /etc/added"), "later\n");
  EXPECT_THROW(disk::directory_disk(dir_ + "/other.ext4", dir_ + "/missing"), Error);
  EXPECT_FALSE(files::exists(dir_ + "/other.ext4"));
}

}  // namespace
}  // namespace openshell::vm
