// A policy's binary path resolved in an image's layers as a micro-VM's guest
// will see them merged (image/resolve.h), and the supervisor's resolver for
// a --vm sandbox (supervisor/guest_vm.h): links followed inside the image
// (absolute, relative, chains; a loop bounded), an upper layer's link or
// whiteout winning over a lower's, an opaque directory hiding what is below
// it; a missing path resolves to itself.
#include "image/resolve.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "base/directory.h"
#include "base/files.h"
#include "image/store.h"
#include "spec/sandbox_spec.h"
#include "supervisor/guest_vm.h"

namespace openshell::image {
namespace {

struct Layer {
  std::vector<std::string> files;
  std::vector<std::pair<std::string, std::string>> links;  // path -> target
  std::vector<std::string> whiteouts = {};
  std::vector<std::string> opaque = {};  // directories
};

Layer whiteouts(std::vector<std::string> paths) { return Layer{{}, {}, std::move(paths)}; }

class ResolveInLayers : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/osh-resolve-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    store_ = std::make_unique<Store>(dir_ + "/images");
  }
  void TearDown() override {
    if (!dir_.empty()) files::remove_tree(dir_);
  }

  static void make_parents(const std::string& root, const std::string& path) {
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1))
      ::mkdir((root + "/" + path.substr(0, slash)).c_str(), 0755);
  }
  static void fill(const std::string& root, const Layer& layer) {
    for (const auto& path : layer.files) {
      make_parents(root, path);
      files::write(root + "/" + path, "#!/bin/sh\n");
    }
    for (const auto& [path, target] : layer.links) {
      make_parents(root, path);
      ASSERT_EQ(::symlink(target.c_str(), (root + "/" + path).c_str()), 0) << path;
    }
    for (const auto& path : layer.whiteouts) {
      make_parents(root, path);
      ASSERT_EQ(::mknod((root + "/" + path).c_str(), S_IFCHR | 0000, makedev(0, 0)), 0) << path;
    }
    for (const auto& path : layer.opaque) {
      make_parents(root, path + "/");
      ASSERT_EQ(::setxattr((root + "/" + path).c_str(), "user.overlay.opaque", "y", 1, 0), 0)
          << path;
    }
  }
  // Commits the layers (bottom first) to the store; their roots, top first.
  std::vector<std::string> image(const std::vector<Layer>& layers_bottom_first) {
    std::vector<std::string> roots;
    diff_ids_.clear();
    for (const Layer& layer : layers_bottom_first) {
      const std::string diff_id = "sha256:" + std::string(63, 'a') + std::to_string(next_++ % 10);
      const std::string tmp = store_->make_temp_dir();
      EXPECT_EQ(::mkdir((tmp + "/root").c_str(), 0755), 0);
      fill(tmp + "/root", layer);
      store_->commit_layer(tmp, diff_id, 100);
      diff_ids_.push_back(diff_id);
      roots.insert(roots.begin(), store_->layer_root(diff_id));
    }
    return roots;
  }

  std::string dir_;
  std::unique_ptr<Store> store_;
  std::vector<std::string> diff_ids_;
  int next_ = 0;
};

TEST_F(ResolveInLayers, AFileIsItselfAndAMissingPathResolvesToItself) {
  const auto roots = image({{{"usr/bin/env"}, {}}});
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/env"), "/usr/bin/env");
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/absent"), "/usr/bin/absent");
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/env/x"), "/usr/bin/env/x") << "not a directory";
  EXPECT_EQ(resolve_in_layers(roots, "/usr//bin/./env"), "/usr/bin/env");
}

TEST_F(ResolveInLayers, RelativeAbsoluteAndChainedLinksAreFollowedInsideTheImage) {
  const auto roots = image({{{"bin/busybox", "usr/bin/python3.11"},
                             {{"bin/wget", "busybox"},
                              {"usr/bin/python3", "/usr/bin/python3.11"},
                              {"usr/bin/python", "python3"},
                              {"usr/local/bin/py", "../../bin/python"},
                              {"usr/bin/escape", "../../../../bin/busybox"}}}});
  EXPECT_EQ(resolve_in_layers(roots, "/bin/wget"), "/bin/busybox");
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/python3"), "/usr/bin/python3.11");
  EXPECT_EQ(resolve_in_layers(roots, "/usr/local/bin/py"), "/usr/bin/python3.11") << "a chain";
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/escape"), "/bin/busybox") << ".. stops at the top";
}

TEST_F(ResolveInLayers, ALinkNeverLeadsToTheHostsFiles) {
  // The host has /etc/passwd; the image does not.
  ASSERT_EQ(::access("/etc/passwd", F_OK), 0);
  const auto roots =
      image({{{"bin/sh"}, {{"bin/passwd", "/etc/passwd"}, {"bin/up", "../../etc"}}}});
  EXPECT_EQ(resolve_in_layers(roots, "/bin/passwd"), "/bin/passwd");
  EXPECT_EQ(resolve_in_layers(roots, "/bin/up/passwd"), "/bin/up/passwd");
}

TEST_F(ResolveInLayers, ALoopIsBoundedAndResolvesToItself) {
  const auto roots =
      image({{{}, {{"bin/a", "b"}, {"bin/b", "/bin/a"}, {"bin/self", "self"}, {"d", "d/x"}}}});
  EXPECT_EQ(resolve_in_layers(roots, "/bin/a"), "/bin/a");
  EXPECT_EQ(resolve_in_layers(roots, "/bin/self"), "/bin/self");
  EXPECT_EQ(resolve_in_layers(roots, "/d/y"), "/d/y");
}

TEST_F(ResolveInLayers, AnUpperLayersLinkReplacesTheLowers) {
  const auto roots = image({
      {{"usr/bin/python3.9"}, {{"usr/bin/python3", "python3.9"}, {"bin/tool", "busybox"}}},
      {{"usr/bin/python3.11", "bin/tool"}, {{"usr/bin/python3", "python3.11"}}},
  });
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/python3"), "/usr/bin/python3.11");
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/python3.9"), "/usr/bin/python3.9")
      << "the lower layer's files are still there";
  EXPECT_EQ(resolve_in_layers(roots, "/bin/tool"), "/bin/tool") << "a file replaced the link";
}

TEST_F(ResolveInLayers, ALowerLayersDirectoryLinkLeadsIntoTheUpperLayers) {
  // A merged /usr: /bin -> usr/bin below, the tool installed above.
  const auto roots = image({
      {{"usr/bin/sh"}, {{"bin", "usr/bin"}}},
      {{"usr/bin/curl"}, {}},
  });
  EXPECT_EQ(resolve_in_layers(roots, "/bin/curl"), "/usr/bin/curl");
  EXPECT_EQ(resolve_in_layers(roots, "/bin/sh"), "/usr/bin/sh");
}

TEST_F(ResolveInLayers, AWhiteoutHidesTheLowerLayersLink) {
  if (geteuid() != 0) GTEST_SKIP() << "whiteouts (character devices 0:0) need root to make";
  const auto roots = image({
      {{"bin/busybox"}, {{"bin/wget", "busybox"}, {"usr/bin/wget", "/bin/wget"}}},
      whiteouts({"bin/wget"}),
  });
  EXPECT_EQ(resolve_in_layers(roots, "/bin/wget"), "/bin/wget");
  EXPECT_EQ(resolve_in_layers(roots, "/usr/bin/wget"), "/usr/bin/wget");
  EXPECT_EQ(resolve_in_layers(roots, "/bin/busybox"), "/bin/busybox");
}

TEST_F(ResolveInLayers, AnOpaqueDirectoryHidesWhatIsBelowIt) {
  const std::string probe = dir_ + "/probe";
  ASSERT_EQ(::mkdir(probe.c_str(), 0755), 0);
  if (::setxattr(probe.c_str(), "user.overlay.opaque", "y", 1, 0) != 0)
    GTEST_SKIP() << "user xattrs not supported on " << dir_;
  const auto roots = image({
      {{"opt/tool/run", "opt/tool/old"}, {{"bin/run", "/opt/tool/run"}}},
      Layer{{"opt/tool/new"}, {}, {}, {"opt/tool"}},
  });
  EXPECT_EQ(resolve_in_layers(roots, "/bin/run"), "/bin/run");
  EXPECT_EQ(resolve_in_layers(roots, "/opt/tool/new"), "/opt/tool/new");
}

TEST_F(ResolveInLayers, TheSupervisorsResolverForAVmSandboxUsesItsImageOrItsDirectory) {
  image({{{"bin/busybox"}, {{"bin/wget", "busybox"}}}, {{}, {{"bin/wget", "/bin/busybox2"}}}});
  SandboxSpec spec;
  spec.vm = SandboxVm{};
  spec.image = SandboxImage{"localhost/two:1", "", "", diff_ids_, "", ""};
  auto resolve = supervisor::guest_path_resolver(spec, dir_ + "/images");
  ASSERT_TRUE(resolve);
  EXPECT_EQ(resolve("/bin/wget"), "/bin/wget") << "the upper layer's link leads nowhere";

  const std::string tree = dir_ + "/tree";
  ASSERT_EQ(::mkdir(tree.c_str(), 0755), 0);
  fill(tree, {{"bin/busybox"}, {{"bin/wget", "/bin/busybox"}}});
  SandboxSpec from;
  from.vm = SandboxVm{};
  from.from = tree;
  resolve = supervisor::guest_path_resolver(from, dir_ + "/images");
  ASSERT_TRUE(resolve);
  EXPECT_EQ(resolve("/bin/wget"), "/bin/busybox");
  EXPECT_EQ(resolve("/bin/nc"), "/bin/nc");
}

}  // namespace
}  // namespace openshell::image
