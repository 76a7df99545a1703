// The layer writer: a tree written as a layer and unpacked again is the same
// tree; the same tree always gives the same bytes; what no layer may hold is
// refused. And the store's images made from such layers.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/files.h"
#include "base/unique_fd.h"
#include "image/compose.h"
#include "image/digest.h"
#include "image/layer_writer.h"
#include "image/manifest.h"
#include "image/unpack.h"
#include "test_util.h"

namespace openshell::image {
namespace {

using openshell::testing::error_of;
using openshell::testing::read_file;
using openshell::testing::TempDir;
using openshell::testing::write_file;

std::string xattr_of(const std::string& path, const char* name) {
  char buf[256];
  ssize_t n = ::lgetxattr(path.c_str(), name, buf, sizeof buf);
  return n < 0 ? "<none>" : std::string(buf, static_cast<size_t>(n));
}

// Every entry below root as one line: type, mode, owner, mtime (seconds),
// content or target, the attributes that matter, and which names share an
// inode.
std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> out;
  std::map<ino_t, std::string> first_name;
  std::vector<std::string> paths;
  for (auto it = std::filesystem::recursive_directory_iterator(root);
       it != std::filesystem::recursive_directory_iterator(); ++it)
    paths.push_back(it->path().string());
  std::sort(paths.begin(), paths.end());
  for (const auto& path : paths) {
    struct stat st;
    EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
    const std::string rel = path.substr(root.size() + 1);
    std::string line = std::to_string(st.st_mode) + " " + std::to_string(st.st_uid) + ":" +
                       std::to_string(st.st_gid);
    if (!S_ISDIR(st.st_mode) && !S_ISCHR(st.st_mode))
      line += " t=" + std::to_string(st.st_mtim.tv_sec);
    if (S_ISREG(st.st_mode)) line += " '" + read_file(path) + "'";
    if (S_ISLNK(st.st_mode)) line += " -> " + std::filesystem::read_symlink(path).string();
    if (S_ISCHR(st.st_mode))  // a whiteout's mode and owner mean nothing to overlayfs
      line =
          "char dev " + std::to_string(major(st.st_rdev)) + ":" + std::to_string(minor(st.st_rdev));
    if (S_ISDIR(st.st_mode)) line += " opaque=" + xattr_of(path, "user.overlay.opaque");
    if (S_ISREG(st.st_mode) && ::geteuid() == 0)
      line += " caps=" + xattr_of(path, "security.capability");
    if (!S_ISDIR(st.st_mode) && st.st_nlink > 1) {
      auto [it, fresh] = first_name.try_emplace(st.st_ino, rel);
      line += " inode-of " + it->second;
    }
    out[rel] = line;
  }
  return out;
}

void set_mtime(const std::string& path, time_t seconds) {
  const timespec times[2] = {{seconds, 0}, {seconds, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

class LayerWriter : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::mkdir(src_.c_str(), 0755), 0); }

  LayerBlob write(const std::vector<LayerSource>& sources, const LayerWriteOptions& options = {}) {
    UniqueFd out(::open(blob_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600));
    EXPECT_TRUE(out.valid());
    return write_layer(sources, out.get(), options, "layer test");
  }
  LayerBlob write_src(const LayerWriteOptions& options = {}) {
    return write({{src_, ""}}, options);
  }

  UnpackResult unpack_to(const std::string& dest) {
    ::mkdir(dest.c_str(), 0755);
    UniqueFd in(::open(blob_.c_str(), O_RDONLY | O_CLOEXEC));
    return unpack_layer(in.get(), dest, UnpackOptions{}, "layer test");
  }

  // Files, directories, links, a FIFO, modes and mtimes (what any user can make).
  void make_plain_tree() {
    write_file(src_ + "/etc/motd", "hello\n");
    ::chmod((src_ + "/etc/motd").c_str(), 0640);
    write_file(src_ + "/bin/tool", "#!/bin/sh\n");
    ::chmod((src_ + "/bin/tool").c_str(), 04755);
    ASSERT_EQ(::link((src_ + "/bin/tool").c_str(), (src_ + "/bin/tool2").c_str()), 0);
    ASSERT_EQ(::symlink("../etc/motd", (src_ + "/bin/motd").c_str()), 0);
    ASSERT_EQ(::symlink("/nowhere", (src_ + "/dangling").c_str()), 0);
    ASSERT_EQ(::mkdir((src_ + "/empty").c_str(), 0700), 0);
    ASSERT_EQ(::mkfifo((src_ + "/pipe").c_str(), 0620), 0);
    write_file(src_ + "/big", std::string(3 << 20, 'x'));
    for (const char* p : {"etc/motd", "bin/tool", "bin/motd", "dangling", "pipe", "big"})
      set_mtime(src_ + "/" + p, 1700000000);
    for (const char* d : {"etc", "bin", "empty"}) set_mtime(src_ + "/" + d, 1600000000);
  }

  TempDir tmp_;
  const std::string src_ = tmp_ / "src";
  const std::string blob_ = tmp_ / "blob";
};

TEST_F(LayerWriter, RoundTripGivesTheSameTree) {
  make_plain_tree();
  const LayerBlob blob = write_src();
  const UnpackResult back = unpack_to(tmp_ / "back");
  EXPECT_EQ(back.diff_id, blob.diff_id);
  EXPECT_EQ(back.compressed_digest, blob.digest);
  EXPECT_EQ(back.compressed_size, blob.size);
  EXPECT_EQ(back.content_bytes, blob.content_bytes);
  EXPECT_EQ(blob.size, std::filesystem::file_size(blob_));
  EXPECT_LT(blob.size, blob.tar_size / 10);  // 3 MiB of one byte: compressed
  EXPECT_EQ(snapshot(tmp_ / "back"), snapshot(src_));
  // Hard links came back as one inode, the set-uid bit kept.
  struct stat a, b;
  ASSERT_EQ(::lstat((tmp_ / "back/bin/tool").c_str(), &a), 0);
  ASSERT_EQ(::lstat((tmp_ / "back/bin/tool2").c_str(), &b), 0);
  EXPECT_EQ(a.st_ino, b.st_ino);
  EXPECT_EQ(a.st_mode & 07777, 04755u);
}

TEST_F(LayerWriter, SameTreeGivesTheSameBytes) {
  make_plain_tree();
  const LayerBlob first = write_src();
  const std::string bytes = read_file(blob_);
  const LayerBlob second = write_src();
  EXPECT_EQ(first.diff_id, second.diff_id);
  EXPECT_EQ(first.digest, second.digest);
  EXPECT_EQ(bytes, read_file(blob_));
  // And a change of one mtime is a different layer.
  set_mtime(src_ + "/etc/motd", 1700000001);
  EXPECT_NE(write_src().diff_id, first.diff_id);
}

TEST_F(LayerWriter, WhiteoutsAndOpaqueDirectoriesRoundTrip) {
  // An overlayfs upper dir: a deleted file, a deleted directory, a
  // directory made opaque (removed and made again).
  write_file(src_ + "/etc/kept", "k");
  ASSERT_EQ(::mknod((src_ + "/etc/deleted").c_str(), S_IFCHR | 0600, makedev(0, 0)), 0)
      << "mknod 0:0 whiteout: " << std::strerror(errno);
  ASSERT_EQ(::mknod((src_ + "/gone").c_str(), S_IFCHR | 0600, makedev(0, 0)), 0);
  write_file(src_ + "/var/cache/new", "n");
  ASSERT_EQ(::setxattr((src_ + "/var/cache").c_str(), "user.overlay.opaque", "y", 1, 0), 0)
      << std::strerror(errno);
  const LayerBlob blob = write_src();
  EXPECT_EQ(unpack_to(tmp_ / "back").diff_id, blob.diff_id);
  const auto back = snapshot(tmp_ / "back");
  EXPECT_EQ(back, snapshot(src_));
  EXPECT_NE(back.at("etc/deleted").find("dev 0:0"), std::string::npos);
  EXPECT_NE(back.at("var/cache").find("opaque=y"), std::string::npos);
  EXPECT_NE(back.at("var").find("opaque=<none>"), std::string::npos);
  // In the tar they are OCI whiteouts, and no device node.
  ::mkdir((tmp_ / "plain").c_str(), 0755);
  UniqueFd in(::open(blob_.c_str(), O_RDONLY | O_CLOEXEC));
  UnpackOptions plain;
  plain.whiteouts = false;
  unpack_layer(in.get(), tmp_ / "plain", plain, "plain");
  EXPECT_TRUE(openshell::testing::path_exists(tmp_ / "plain/etc/.wh.deleted"));
  EXPECT_TRUE(openshell::testing::path_exists(tmp_ / "plain/.wh.gone"));
  EXPECT_TRUE(openshell::testing::path_exists(tmp_ / "plain/var/cache/.wh..wh..opq"));
  EXPECT_FALSE(openshell::testing::path_exists(tmp_ / "plain/etc/deleted"));
}

TEST_F(LayerWriter, OwnersAndCapabilitiesRoundTripAsRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown to other ids and security.capability need root";
  write_file(src_ + "/home/u/file", "u");
  ASSERT_EQ(::chown((src_ + "/home/u").c_str(), 1234, 5678), 0);
  ASSERT_EQ(::lchown((src_ + "/home/u/file").c_str(), 4321, 8765), 0);
  write_file(src_ + "/ping", "p");
  std::string caps(20, '\0');  // revision 2, effective, CAP_NET_BIND_SERVICE
  caps[0] = 0x01;
  caps[3] = 0x02;
  caps[5] = 0x04;
  ASSERT_EQ(
      ::setxattr((src_ + "/ping").c_str(), "security.capability", caps.data(), caps.size(), 0), 0)
      << std::strerror(errno);
  write_src();
  unpack_to(tmp_ / "back");
  EXPECT_EQ(snapshot(tmp_ / "back"), snapshot(src_));
  EXPECT_EQ(xattr_of(tmp_ / "back/ping", "security.capability"), caps);
  struct stat st;
  ASSERT_EQ(::lstat((tmp_ / "back/home/u/file").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 4321u);
  EXPECT_EQ(st.st_gid, 8765u);
}

TEST_F(LayerWriter, IdMapsShiftHostIdsToTheLayersIds) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown to subordinate ids needs root";
  write_file(src_ + "/a", "a");
  write_file(src_ + "/b", "b");
  ASSERT_EQ(::chown((src_ + "/a").c_str(), 100000, 100000), 0);
  ASSERT_EQ(::chown((src_ + "/b").c_str(), 101000, 3), 0);  // gid 3: no range covers it
  LayerWriteOptions options;
  options.uid_map = {{0, 100000, 65536}};
  options.gid_map = {{0, 100000, 65536}};
  write_src(options);
  unpack_to(tmp_ / "back");
  struct stat a, b;
  ASSERT_EQ(::lstat((tmp_ / "back/a").c_str(), &a), 0);
  ASSERT_EQ(::lstat((tmp_ / "back/b").c_str(), &b), 0);
  EXPECT_EQ(a.st_uid, 0u);
  EXPECT_EQ(a.st_gid, 0u);
  EXPECT_EQ(b.st_uid, 1000u);
  EXPECT_EQ(b.st_gid, 65534u);
}

TEST_F(LayerWriter, PrefixPutsASourceBelowADirectory) {
  write_file(src_ + "/root-file", "r");
  write_file(tmp_ / "work/notes.txt", "w");
  ::chmod((tmp_ / "work").c_str(), 0770);
  write({{src_, ""}, {tmp_ / "work", "sandbox"}});
  unpack_to(tmp_ / "back");
  EXPECT_EQ(read_file(tmp_ / "back/root-file"), "r");
  EXPECT_EQ(read_file(tmp_ / "back/sandbox/notes.txt"), "w");
  struct stat st;
  ASSERT_EQ(::lstat((tmp_ / "back/sandbox").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0770u);
}

TEST_F(LayerWriter, DeviceNodesAndWhiteoutNamesAreRefusedSocketsSkipped) {
  write_file(src_ + "/ok", "ok");
  const std::string sock = src_ + "/live.sock";
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", sock.c_str());
  ASSERT_EQ(::bind(s.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  write_src();
  unpack_to(tmp_ / "back");
  EXPECT_FALSE(openshell::testing::path_exists(tmp_ / "back/live.sock"));
  EXPECT_EQ(read_file(tmp_ / "back/ok"), "ok");

  write_file(src_ + "/d/.wh.trick", "");
  EXPECT_EQ(error_of([&] { write_src(); }),
            "layer test: 'd/.wh.trick': a name starting with .wh. would read as a whiteout");
  std::filesystem::remove_all(src_ + "/d");
  if (::mknod((src_ + "/null").c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0)
    GTEST_SKIP() << "mknod 1:3: " << std::strerror(errno);
  EXPECT_EQ(error_of([&] { write_src(); }),
            "layer test: 'null': character device (device nodes are not allowed in a layer)");
}

TEST(LayerIdMap, MapsRangesAndOverflows) {
  const std::vector<IdRange> map = {{0, 1000, 1}, {1, 100000, 65536}};
  EXPECT_EQ(map_id(map, 1000), 0u);
  EXPECT_EQ(map_id(map, 100000), 1u);
  EXPECT_EQ(map_id(map, 165535), 65536u);
  EXPECT_EQ(map_id(map, 165536), 65534u);
  EXPECT_EQ(map_id({}, 42), 42u);
}

// ---- images from parts ----------------------------------------------------------

TEST_F(LayerWriter, StoreKeepsTheBlobAndTheUnpackedLayer) {
  make_plain_tree();
  Store store(tmp_ / "store");
  const LayerBlob blob = add_layer(store, {{src_, ""}}, {}, "layer test");
  EXPECT_TRUE(store.has_layer(blob.diff_id));
  EXPECT_TRUE(store.has_blob(blob.digest));
  EXPECT_EQ(sha256_digest(read_file(store.blob_path(blob.digest))), blob.digest);
  EXPECT_EQ(snapshot(store.layer_root(blob.diff_id)), snapshot(src_));
  EXPECT_EQ(store.layer_size(blob.diff_id), blob.content_bytes);

  NewImage image;
  image.name = "localhost/made:1";
  image.layers = {blob};
  image.history = {{"", "copy src /", "first", "", false}, {"", "ENV A=1", "", "", true}};
  image.edits.env = {"A=1", "PATH=/bin"};
  image.edits.cmd = std::vector<std::string>{"/bin/tool"};
  image.edits.labels = {{"org.example.k", "v"}};
  image.edits.exposed_ports = {"8080/tcp"};
  image.source = "test";
  const ImageRecord made = put_image(store, image);
  auto found = store.find("made:1");
  ASSERT_TRUE(found);
  EXPECT_EQ(found->config_digest, made.config_digest);
  EXPECT_EQ(found->diff_ids, std::vector<std::string>{blob.diff_id});
  EXPECT_EQ(found->config.cmd, std::vector<std::string>{"/bin/tool"});
  const Manifest m = parse_manifest(read_file(store.blob_path(made.manifest_digest)), "m");
  ASSERT_EQ(m.layers.size(), 1u);
  EXPECT_EQ(m.layers[0].digest, blob.digest);
  EXPECT_EQ(m.layers[0].media_type, media_type::kOciLayerGzip);
  EXPECT_EQ(m.config.digest, made.config_digest);
  auto config = nlohmann::json::parse(read_file(store.blob_path(made.config_digest)));
  EXPECT_EQ(config["config"]["Labels"]["org.example.k"], "v");
  EXPECT_TRUE(config["config"]["ExposedPorts"].contains("8080/tcp"));
  EXPECT_EQ(config["history"].size(), 2u);
  EXPECT_EQ(config["history"][1]["empty_layer"], true);

  // A second image on top of the first: its layers, then the new one.
  write_file(tmp_ / "more/x", "x");
  NewImage child;
  child.name = "localhost/child:1";
  child.base = made;
  child.layers = {add_layer(store, {{tmp_ / "more", ""}}, {}, "layer 2")};
  child.edits.env = {"A=2"};
  const ImageRecord c = put_image(store, child);
  EXPECT_EQ(c.diff_ids, (std::vector<std::string>{blob.diff_id, child.layers[0].diff_id}));
  EXPECT_EQ(c.config.env, (std::vector<std::string>{"A=2", "PATH=/bin"}));
  EXPECT_EQ(c.config.cmd, std::vector<std::string>{"/bin/tool"});
  const Manifest cm = parse_manifest(read_file(store.blob_path(c.manifest_digest)), "m");
  ASSERT_EQ(cm.layers.size(), 2u);
  EXPECT_EQ(cm.layers[0].digest, blob.digest);

  // Prune keeps the layer blobs of kept images, and drops them with the image.
  EXPECT_EQ(store.prune().blobs, 0);
  EXPECT_TRUE(store.has_blob(child.layers[0].digest));
  store.remove("localhost/child:1");
  EXPECT_GE(store.prune().blobs, 3);  // its manifest, config and layer blob
  EXPECT_FALSE(store.has_blob(child.layers[0].digest));
  EXPECT_TRUE(store.has_blob(blob.digest));
}

}  // namespace
}  // namespace openshell::image
