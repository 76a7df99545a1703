#include "namespaces/mounts.h"

#include <unistd.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "test_util.h"

namespace openshell::namespaces {
namespace {

using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string error_of(const FilesystemSpec& spec) {
  try {
    MountPlan plan(spec);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "MountPlan accepted the spec";
  return "";
}

class MountPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(tmp_ / "rootfs");
    std::filesystem::create_directories(tmp_ / "data");
  }
  FilesystemSpec directory_root() const {
    FilesystemSpec spec;
    spec.root = RootKind::kDirectory;
    spec.rootfs = tmp_ / "rootfs";
    return spec;
  }
  static BindSpec bind(const std::string& source, const std::string& target) {
    BindSpec b;
    b.source = source;
    b.target = target;
    return b;
  }
  TempDir tmp_;
};

TEST_F(MountPlanTest, ValidSpecIsCanonicalised) {
  std::filesystem::create_symlink(tmp_ / "rootfs", tmp_ / "link");
  FilesystemSpec spec = directory_root();
  spec.rootfs = tmp_ / "data/../link/.";
  spec.binds = {bind(tmp_ / "data", "/data")};
  spec.workdir = "/work";
  MountPlan plan(spec);
  EXPECT_EQ(plan.spec().rootfs, std::filesystem::canonical(tmp_.path()).string() + "/rootfs");
  EXPECT_EQ(plan.spec().workdir, "/work");
}

TEST_F(MountPlanTest, HostRootNeedsNoRootfs) {
  FilesystemSpec spec;
  spec.root = RootKind::kHost;
  spec.rootfs = tmp_ / "missing";  // not used for the host root
  MountPlan plan(spec);
  EXPECT_EQ(plan.spec().root, RootKind::kHost);
}

TEST_F(MountPlanTest, MissingRootfs) {
  FilesystemSpec spec = directory_root();
  spec.rootfs = tmp_ / "missing";
  EXPECT_EQ(error_of(spec), "--rootfs " + (tmp_ / "missing") + ": No such file or directory");
  spec.rootfs = "";
  EXPECT_EQ(error_of(spec), "--rootfs: no directory given");
}

TEST_F(MountPlanTest, RootfsThatIsAFile) {
  write_file(tmp_ / "file", "");
  FilesystemSpec spec = directory_root();
  spec.rootfs = tmp_ / "file";
  EXPECT_EQ(error_of(spec), "--rootfs " + (tmp_ / "file") + ": not a directory");
}

TEST_F(MountPlanTest, MissingWritableLayer) {
  FilesystemSpec spec = directory_root();
  spec.layer_dir = tmp_ / "no-layer";
  EXPECT_EQ(error_of(spec),
            "writable layer " + (tmp_ / "no-layer") + ": No such file or directory");
}

TEST_F(MountPlanTest, BindOverTheRoot) {
  FilesystemSpec spec = directory_root();
  spec.binds = {bind(tmp_ / "data", "/")};
  EXPECT_EQ(error_of(spec), "--bind " + (tmp_ / "data") + ":/: cannot replace the root");
}

// Regression (fixed): only the exact string "/" is refused; "//" and "/." name the root too
// and the bind then lands on the new root itself (relative target "" or ".").
TEST_F(MountPlanTest, BindOverTheRootWhateverItsSpelling) {
  for (const char* root : {"//", "/.", "/./"}) {
    FilesystemSpec spec = directory_root();
    spec.binds = {bind(tmp_ / "data", root)};
    EXPECT_EQ(error_of(spec),
              "--bind " + (tmp_ / "data") + ":" + root + ": cannot replace the root")
        << root;
  }
}

TEST_F(MountPlanTest, BindDestinationMustBeAbsoluteWithoutDotDot) {
  FilesystemSpec spec = directory_root();
  spec.binds = {bind(tmp_ / "data", "data")};
  EXPECT_EQ(error_of(spec),
            "--bind " + (tmp_ / "data") + ":data: destination must be an absolute path");
  spec.binds = {bind(tmp_ / "data", "/a/../etc")};
  EXPECT_EQ(error_of(spec),
            "--bind " + (tmp_ / "data") + ":/a/../etc: destination must not contain '..'");
  spec.binds = {bind(tmp_ / "data", "")};
  EXPECT_EQ(error_of(spec), "--bind " + (tmp_ / "data") + ":: destination must not be empty");
}

TEST_F(MountPlanTest, MissingBindSourceIsNamed) {
  FilesystemSpec spec = directory_root();
  spec.binds = {bind(tmp_ / "data", "/ok"), bind(tmp_ / "gone", "/gone")};
  EXPECT_EQ(error_of(spec), "--bind source " + (tmp_ / "gone") + ": No such file or directory");
}

TEST_F(MountPlanTest, WorkdirMustBeAbsolute) {
  FilesystemSpec spec = directory_root();
  spec.workdir = "work";
  EXPECT_EQ(error_of(spec), "--workdir work: must be an absolute path");
  spec.workdir = "/a/../b";
  EXPECT_EQ(error_of(spec), "--workdir /a/../b: must not contain '..'");
  spec.workdir = "";
  EXPECT_EQ(error_of(spec), "--workdir : must not be empty");
}

}  // namespace
}  // namespace openshell::namespaces

// The "lowerdir" list of kernels before 6.8 (no "lowerdir+"), the fallback
// of both the sandbox's root and the overlay probe.
TEST(OverlayLowerdirList, JoinsTopFirstAndEscapesSeparators) {
  EXPECT_EQ(openshell::namespaces::overlay_lowerdir_list({"/a", "/b/c"}), "/a:/b/c");
  EXPECT_EQ(openshell::namespaces::overlay_lowerdir_list({"/x:y", "/p,q", "/back\\slash"}),
            "/x\\:y:/p\\,q:/back\\\\slash");
  EXPECT_EQ(openshell::namespaces::overlay_lowerdir_list({}), "");
}

TEST(OverlayListOptions, EscapesUpperAndWorkAndStopsWhenFull) {
  char out[128];
  ASSERT_TRUE(openshell::namespaces::overlay_list_options(out, sizeof out, "/l0:/l1", "/s,1/upper",
                                                          "/s,1/work"));
  EXPECT_STREQ(out, "lowerdir=/l0:/l1,upperdir=/s\\,1/upper,workdir=/s\\,1/work,userxattr");
  char small[40];
  EXPECT_FALSE(openshell::namespaces::overlay_list_options(small, sizeof small, "/l0:/l1", "/upper",
                                                           "/work"));
}

// The list form through mount(2) takes more than fsconfig()'s 256 bytes:
// six layers with long paths stack (this kernel has "lowerdir+" too; the
// probe is told to try only what kernels before 6.8 get).
TEST(OverlayProbe, ListFormStacksManyLayersWithLongPaths) {
  openshell::testing::TempDir dir;
  std::vector<std::string> lowers;
  for (int i = 0; i < 6; ++i) {
    std::string layer = dir.path() + "/layers/" + std::string(60, 'a' + i) + "/root";
    std::filesystem::create_directories(layer);
    openshell::testing::write_file(layer + "/file" + std::to_string(i), "x");
    lowers.push_back(layer);
  }
  std::filesystem::create_directories(dir.path() + "/scratch");
  size_t total = 0;
  for (const auto& l : lowers) total += l.size() + 1;
  ASSERT_GT(total, 256u);
  EXPECT_EQ(openshell::namespaces::overlay_problem(lowers, dir.path() + "/scratch", true), "");
  EXPECT_EQ(openshell::namespaces::overlay_problem(lowers, dir.path() + "/scratch", false), "");
  // The scratch directory is left empty.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() + "/scratch"));
}
