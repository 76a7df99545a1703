// A micro-VM sandbox's disks from the image store (supervisor/vm_disks.h):
// the image's layers flattened into one ext4 kept in the store (an upper
// layer's whiteout hides the lower's file), found again on the second
// sandbox, refused in one line when a layer is missing; the writable layer
// in the sandbox's directory.
#include "supervisor/vm_disks.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include <gtest/gtest.h>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "image/compose.h"

namespace openshell::supervisor {
namespace {

std::string debugfs(const std::string& image, const std::string& request) {
  std::string out;
  FILE* p =
      popen(("/usr/sbin/debugfs -R '" + request + "' " + image + " 2>/dev/null").c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

class VmDisks : public ::testing::Test {
 protected:
  void SetUp() override {
    if (access("/usr/sbin/mkfs.ext4", X_OK) != 0 || access("/usr/sbin/debugfs", X_OK) != 0)
      GTEST_SKIP() << "needs mkfs.ext4 and debugfs (apt-get install e2fsprogs)";
    char tmpl[] = "/tmp/osh-vmdisks-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) files::remove_tree(dir_);
  }
  // A layer committed to the store: the files given, and whiteouts.
  void layer(image::Store& store, const std::string& diff_id,
             const std::vector<std::pair<std::string, std::string>>& file_list,
             const std::vector<std::string>& whiteouts = {}) {
    std::string tmp = store.make_temp_dir();
    ASSERT_EQ(mkdir((tmp + "/root").c_str(), 0755), 0);
    for (const auto& [path, content] : file_list) files::write(tmp + "/root/" + path, content);
    for (const std::string& path : whiteouts)
      ASSERT_EQ(mknod((tmp + "/root/" + path).c_str(), S_IFCHR | 0000, makedev(0, 0)), 0);
    store.commit_layer(tmp, diff_id, 100);
  }
  std::string dir_;
};

TEST_F(VmDisks, TheImagesDiskIsItsLayersMergedAndMadeOnce) {
  if (geteuid() != 0) GTEST_SKIP() << "whiteouts (character devices 0:0) need root to make";
  image::Store store(dir_ + "/images");
  const std::string lower = "sha256:" + std::string(64, 'a');
  const std::string upper = "sha256:" + std::string(64, 'b');
  layer(store, lower, {{"kept", "from the lower layer\n"}, {"gone", "hidden above\n"}});
  layer(store, upper, {{"added", "from the upper layer\n"}}, {"gone"});
  image::ImageRecord image;
  image.name = "localhost/two:1";
  image.config_digest = "sha256:" + std::string(64, 'c');
  image.diff_ids = {lower, upper};

  vm::disk::CachedDisk d = image_vm_disk(store, image);
  EXPECT_TRUE(d.made);
  EXPECT_EQ(d.path, dir_ + "/images/vm-disks/sha256-" + std::string(64, 'c') + ".ext4");
  EXPECT_EQ(debugfs(d.path, "cat /kept"), "from the lower layer\n");
  EXPECT_EQ(debugfs(d.path, "cat /added"), "from the upper layer\n");
  EXPECT_EQ(debugfs(d.path, "ls /").find("gone"), std::string::npos) << "the whiteout hides it";
  struct stat st {};
  ASSERT_EQ(stat((dir_ + "/images/vm-disks").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  EXPECT_FALSE(image_vm_disk(store, image).made) << "the second sandbox finds it";
}

TEST_F(VmDisks, AMissingLayerIsOneLineAndNoDisk) {
  image::Store store(dir_ + "/images");
  image::ImageRecord image;
  image.name = "localhost/gone:1";
  image.config_digest = "sha256:" + std::string(64, 'd');
  image.diff_ids = {"sha256:" + std::string(64, 'e')};
  try {
    image_vm_disk(store, image);
    FAIL() << "no error for a missing layer";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "image localhost/gone:1: the store lacks its layer sha256:" + std::string(64, 'e'));
  }
  EXPECT_FALSE(files::exists(dir_ + "/images/vm-disks/sha256-" + std::string(64, 'd') + ".ext4"));
}

TEST_F(VmDisks, TheSandboxsLayerIsInItsDirectoryAndKept) {
  std::string layer = sandbox_vm_layer(dir_, 16 * vm::disk::kMiB);
  EXPECT_EQ(layer, dir_ + "/layer.ext4");
  struct stat first {};
  ASSERT_EQ(stat(layer.c_str(), &first), 0);
  EXPECT_EQ(sandbox_vm_layer(dir_, 16 * vm::disk::kMiB), layer);
  struct stat second {};
  ASSERT_EQ(stat(layer.c_str(), &second), 0);
  EXPECT_EQ(first.st_ino, second.st_ino) << "kept, not made again";
}

// image prune: the disk of an image the store still names stays; the disk
// of one it no longer names goes, counted.
TEST_F(VmDisks, PruneRemovesTheDisksOfImagesNoLongerNamed) {
  image::Store store(dir_ + "/images");
  ASSERT_EQ(mkdir((dir_ + "/src").c_str(), 0755), 0);
  files::write(dir_ + "/src/file", "kept\n");
  image::NewImage named;
  named.name = "localhost/named:1";
  named.layers = {image::add_layer(store, {{dir_ + "/src", ""}}, {}, "layer")};
  named.source = "test";
  const image::ImageRecord kept = image::put_image(store, named);
  const std::string kept_disk = image_vm_disk(store, kept).path;
  image::ImageRecord gone = kept;
  gone.name = "localhost/gone:1";
  gone.config_digest = "sha256:" + std::string(64, 'f');
  const std::string gone_disk = image_vm_disk(store, gone).path;
  ASSERT_TRUE(files::exists(gone_disk));

  const image::Store::PruneResult pruned = store.prune();
  EXPECT_EQ(pruned.vm_disks, 1);
  EXPECT_TRUE(files::exists(kept_disk));
  EXPECT_FALSE(files::exists(gone_disk));
  EXPECT_EQ(store.prune().vm_disks, 0);
}

}  // namespace
}  // namespace openshell::supervisor
