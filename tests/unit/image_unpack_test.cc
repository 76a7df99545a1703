#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <archive.h>
#include <archive_entry.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/directory.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "image/digest.h"
#include "image/unpack.h"
#include "test_util.h"

namespace openshell::image {
namespace {

using openshell::testing::ChildWriter;
using openshell::testing::path_exists;
using openshell::testing::read_file;
using openshell::testing::run_in_child;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::HasSubstr;

constexpr int64_t kMtime = 1600000000;

// ---- building layers ---------------------------------------------------------
// libarchive's tar writers link in every write format (xar, hence libxml2), so
// the test writes ustar and pax itself and lets libarchive compress.

struct Entry {
  std::string name;
  char type = '0';  // ustar typeflag
  std::string data;
  unsigned mode = 0644;
  int64_t uid = 0;
  int64_t gid = 0;
  int64_t mtime = kMtime;
  std::string link;  // symlink or hard link target
  unsigned dev_major = 0;
  unsigned dev_minor = 0;
  std::map<std::string, std::string> xattrs;
};

Entry file(const std::string& name, const std::string& data, unsigned mode = 0644) {
  Entry e;
  e.name = name;
  e.data = data;
  e.mode = mode;
  return e;
}

Entry dir(const std::string& name, unsigned mode = 0755) {
  Entry e;
  e.name = name;
  e.type = '5';
  e.mode = mode;
  return e;
}

Entry symlink(const std::string& name, const std::string& target) {
  Entry e;
  e.name = name;
  e.type = '2';
  e.mode = 0777;
  e.link = target;
  return e;
}

Entry hardlink(const std::string& name, const std::string& target) {
  Entry e;
  e.name = name;
  e.type = '1';
  e.link = target;
  return e;
}

Entry device(const std::string& name, char type, unsigned major, unsigned minor) {
  Entry e;
  e.name = name;
  e.type = type;
  e.dev_major = major;
  e.dev_minor = minor;
  return e;
}

// width-1 octal digits and a NUL, as ustar wants its numbers.
void put_octal(char* field, size_t width, uint64_t value) {
  field[width - 1] = '\0';
  for (size_t i = width - 1; i-- > 0; value >>= 3) field[i] = static_cast<char>('0' + (value & 7));
}

std::string pax_record(const std::string& key, const std::string& value) {
  const size_t body = key.size() + value.size() + 3;  // ' ', '=', '\n'
  size_t length = body + 1;
  while (std::to_string(length).size() + body != length)
    length = std::to_string(length).size() + body;
  return std::to_string(length) + " " + key + "=" + value + "\n";
}

void pad(std::string* out) { out->append((512 - out->size() % 512) % 512, '\0'); }

class TarWriter {
 public:
  TarWriter& add(const Entry& e) {
    std::string pax;
    bool ascii = true;
    for (unsigned char c : e.name + e.link) ascii = ascii && c < 0x80;
    if (e.name.size() > 100 || !ascii) pax += pax_record("path", e.name);
    if (!e.link.empty() && (e.link.size() > 100 || !ascii)) pax += pax_record("linkpath", e.link);
    for (const auto& [key, value] : e.xattrs) pax += pax_record("SCHILY.xattr." + key, value);
    if (!pax.empty()) {
      Entry header = e;
      header.name = "PaxHeaders/entry";
      header.link.clear();
      out_ += header_block(header, 'x', pax.size());
      out_ += pax;
      pad(&out_);
    }
    out_ += header_block(e, e.type, e.data.size());
    out_ += e.data;
    pad(&out_);
    return *this;
  }
  // With the two null blocks that end an archive.
  std::string finish() const { return out_ + std::string(1024, '\0'); }

 private:
  static std::string header_block(const Entry& e, char type, size_t size) {
    std::string block(512, '\0');
    std::memcpy(&block[0], e.name.data(), std::min<size_t>(e.name.size(), 100));
    put_octal(&block[100], 8, e.mode);
    put_octal(&block[108], 8, static_cast<uint64_t>(e.uid));
    put_octal(&block[116], 8, static_cast<uint64_t>(e.gid));
    put_octal(&block[124], 12, size);
    put_octal(&block[136], 12, static_cast<uint64_t>(e.mtime));
    block[156] = type;
    std::memcpy(&block[157], e.link.data(), std::min<size_t>(e.link.size(), 100));
    std::memcpy(&block[257], "ustar", 6);
    std::memcpy(&block[263], "00", 2);
    put_octal(&block[329], 8, e.dev_major);
    put_octal(&block[337], 8, e.dev_minor);
    std::memset(&block[148], ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : block) sum += c;
    std::snprintf(&block[148], 8, "%06o", sum);
    block[155] = ' ';
    return block;
  }

  std::string out_;
};

std::string tar_of(const std::vector<Entry>& entries) {
  TarWriter writer;
  for (const Entry& e : entries) writer.add(e);
  return writer.finish();
}

enum class Compression { kNone, kGzip, kZstd };

la_ssize_t append_output(archive*, void* out, const void* data, size_t size) {
  static_cast<std::string*>(out)->append(static_cast<const char*>(data), size);
  return static_cast<la_ssize_t>(size);
}

// The tar compressed with libarchive's writer (format "raw": the bytes as
// they are, through the filter).
std::string compress(const std::string& tar, Compression compression) {
  if (compression == Compression::kNone) return tar;
  std::string out;
  archive* w = archive_write_new();
  if (archive_write_set_format_raw(w) != ARCHIVE_OK ||
      (compression == Compression::kGzip ? archive_write_add_filter_gzip(w)
                                         : archive_write_add_filter_zstd(w)) != ARCHIVE_OK ||
      archive_write_set_bytes_in_last_block(w, 1) != ARCHIVE_OK ||
      archive_write_open(w, &out, nullptr, append_output, nullptr) != ARCHIVE_OK)
    throw std::runtime_error(std::string("archive_write: ") + archive_error_string(w));
  archive_entry* entry = archive_entry_new();
  archive_entry_set_pathname(entry, "layer.tar");
  archive_entry_set_filetype(entry, AE_IFREG);
  archive_entry_set_size(entry, static_cast<la_int64_t>(tar.size()));
  if (archive_write_header(w, entry) != ARCHIVE_OK ||
      archive_write_data(w, tar.data(), tar.size()) != static_cast<la_ssize_t>(tar.size()) ||
      archive_write_close(w) != ARCHIVE_OK)
    throw std::runtime_error(std::string("archive_write: ") + archive_error_string(w));
  archive_entry_free(entry);
  archive_write_free(w);
  return out;
}

// Bytes that do not compress away.
std::string noise(size_t size, uint32_t seed) {
  std::string out(size, '\0');
  for (char& c : out) {
    seed = seed * 1664525u + 1013904223u;
    c = static_cast<char>(seed >> 24);
  }
  return out;
}

// A memfd holding blob, read from its start.
UniqueFd blob_fd(const std::string& blob) {
  UniqueFd fd(::memfd_create("layer", MFD_CLOEXEC));
  if (!fd) throw std::runtime_error("memfd_create");
  if (::write(fd.get(), blob.data(), blob.size()) != static_cast<ssize_t>(blob.size()))
    throw std::runtime_error("write memfd");
  ::lseek(fd.get(), 0, SEEK_SET);
  return fd;
}

UnpackResult unpack(const std::string& blob, const std::string& dest,
                    const UnpackOptions& options = {}) {
  UniqueFd fd = blob_fd(blob);
  return unpack_layer(fd.get(), dest, options, "layer test");
}

// The error's message, or "<no error>".
std::string unpack_error(const std::string& blob, const std::string& dest,
                         const UnpackOptions& options = {}) {
  try {
    unpack(blob, dest, options);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

struct stat stat_of(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) st.st_mode = 0;
  return st;
}

unsigned mode_of(const std::string& path) { return stat_of(path).st_mode & 07777; }

std::string readlink_of(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf);
  return n < 0 ? "<not a symlink>" : std::string(buf, static_cast<size_t>(n));
}

std::string xattr_of(const std::string& path, const char* name) {
  char buf[256];
  ssize_t n = ::lgetxattr(path.c_str(), name, buf, sizeof buf);
  return n < 0 ? "<none>" : std::string(buf, static_cast<size_t>(n));
}

std::vector<std::string> names_in(const std::string& path) {
  std::vector<std::string> names;
  std::error_code ignored;
  for (const auto& e : std::filesystem::directory_iterator(path, ignored))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// A layer directory, with a sentinel directory beside it that no layer may
// touch.
class ImageUnpack : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(::mkdir(dest_.c_str(), 0755), 0);
    write_file(sentinel_ + "/keep", "keep");
  }

  void expect_sentinel_untouched(bool layer_exists = true) {
    const std::vector<std::string> expected = layer_exists
                                                  ? std::vector<std::string>{"layer", "sentinel"}
                                                  : std::vector<std::string>{"sentinel"};
    EXPECT_EQ(names_in(tmp_.path()), expected);
    EXPECT_EQ(names_in(sentinel_), std::vector<std::string>{"keep"});
    EXPECT_EQ(read_file(sentinel_ + "/keep"), "keep");
    EXPECT_EQ(stat_of(sentinel_ + "/keep").st_nlink, 1u);
    EXPECT_EQ(xattr_of(sentinel_, "user.overlay.opaque"), "<none>");
  }

  TempDir tmp_;
  const std::string dest_ = tmp_ / "layer";
  const std::string sentinel_ = tmp_ / "sentinel";
};

// ---- what a layer holds, in each compression ---------------------------------

class ImageUnpackFormat : public ImageUnpack, public ::testing::WithParamInterface<Compression> {};

TEST_P(ImageUnpackFormat, ExtractsFilesDirectoriesAndLinks) {
  const std::string big = noise((3 << 20) + 123, 7);
  Entry hosts = file("etc/hosts", "127.0.0.1 localhost\n", 0640);
  hosts.mtime = kMtime + 5;
  Entry etc = dir("etc/", 0751);
  etc.mtime = kMtime + 1;
  Entry ro = dir("ro/", 0555);
  ro.mtime = kMtime + 2;
  const std::string tar = tar_of({
      etc,
      hosts,
      symlink("etc/localtime", "/usr/share/zoneinfo/UTC"),
      hardlink("etc/hosts.bak", "etc/hosts"),
      file("a/b/c/deep", "deep"),
      ro,
      file("ro/inside", "inside", 0444),
      file("ro/sub/nested", "nested", 0600),
      file("big", big, 0755),
      file("./dot/slash//name", "normalized"),
      file("bin/su", "setuid", 04755),
  });
  const std::string blob = compress(tar, GetParam());

  UnpackResult result = unpack(blob, dest_);

  EXPECT_EQ(result.diff_id, sha256_digest(tar));
  EXPECT_EQ(result.compressed_digest, sha256_digest(blob));
  EXPECT_EQ(result.compressed_size, blob.size());
  EXPECT_EQ(result.entries, 11u);
  EXPECT_EQ(result.content_bytes, 20 + 4 + 6 + 6 + big.size() + 10 + 6);

  EXPECT_EQ(stat_of(dest_ + "/etc/hosts").st_atim.tv_sec, kMtime + 5);  // before reading it
  EXPECT_EQ(stat_of(dest_ + "/etc/hosts").st_mtim.tv_sec, kMtime + 5);
  EXPECT_EQ(read_file(dest_ + "/etc/hosts"), "127.0.0.1 localhost\n");
  EXPECT_EQ(mode_of(dest_ + "/etc/hosts"), 0640u);
  EXPECT_TRUE(S_ISDIR(stat_of(dest_ + "/etc").st_mode));
  EXPECT_EQ(mode_of(dest_ + "/etc"), 0751u);
  // Set last: creating entries inside did not move it.
  EXPECT_EQ(stat_of(dest_ + "/etc").st_mtim.tv_sec, kMtime + 1);
  EXPECT_EQ(readlink_of(dest_ + "/etc/localtime"), "/usr/share/zoneinfo/UTC");
  EXPECT_EQ(stat_of(dest_ + "/etc/localtime").st_mtim.tv_sec, kMtime);
  EXPECT_EQ(stat_of(dest_ + "/etc/hosts.bak").st_ino, stat_of(dest_ + "/etc/hosts").st_ino);
  EXPECT_EQ(stat_of(dest_ + "/etc/hosts").st_nlink, 2u);
  EXPECT_EQ(read_file(dest_ + "/a/b/c/deep"), "deep");
  EXPECT_EQ(mode_of(dest_ + "/a/b"), 0755u);  // a parent the archive does not list
  EXPECT_EQ(mode_of(dest_ + "/ro"), 0555u);
  EXPECT_EQ(stat_of(dest_ + "/ro").st_mtim.tv_sec, kMtime + 2);
  EXPECT_EQ(read_file(dest_ + "/ro/inside"), "inside");
  EXPECT_EQ(mode_of(dest_ + "/ro/inside"), 0444u);
  EXPECT_EQ(read_file(dest_ + "/ro/sub/nested"), "nested");
  EXPECT_EQ(read_file(dest_ + "/big"), big);
  EXPECT_EQ(mode_of(dest_ + "/big"), 0755u);
  EXPECT_EQ(read_file(dest_ + "/dot/slash/name"), "normalized");
  EXPECT_EQ(mode_of(dest_ + "/bin/su"), 04755u);
  expect_sentinel_untouched();
}

TEST_P(ImageUnpackFormat, TruncatedStreamIsAnError) {
  const std::string tar = tar_of({file("big", noise(2 << 20, 3)), file("after", "x")});
  const std::string blob = compress(tar, GetParam());
  std::string message = unpack_error(blob.substr(0, blob.size() / 2), dest_);
  EXPECT_THAT(message, HasSubstr("layer test: ")) << message;
  EXPECT_THAT(message, ::testing::Not(HasSubstr("<no error>")));
}

TEST_P(ImageUnpackFormat, TrailingBytesAfterTheArchiveAreHashed) {
  const std::string tar = tar_of({file("f", "x")}) + std::string(4096, '\0') + "trailing";
  const std::string blob = compress(tar, GetParam());
  UnpackResult result = unpack(blob, dest_);
  EXPECT_EQ(result.diff_id, sha256_digest(tar));
  EXPECT_EQ(result.compressed_digest, sha256_digest(blob));
  EXPECT_EQ(read_file(dest_ + "/f"), "x");
}

INSTANTIATE_TEST_SUITE_P(ImageUnpack, ImageUnpackFormat,
                         ::testing::Values(Compression::kNone, Compression::kGzip,
                                           Compression::kZstd),
                         [](const ::testing::TestParamInfo<Compression>& info) {
                           switch (info.param) {
                             case Compression::kGzip:
                               return "gzip";
                             case Compression::kZstd:
                               return "zstd";
                             default:
                               return "plain";
                           }
                         });

// ---- owners -----------------------------------------------------------------

std::vector<Entry> owned_entries() {
  Entry f = file("owned/file", "x");
  Entry d = dir("owned/");
  Entry l = symlink("owned/link", "file");
  for (Entry* e : {&f, &d, &l}) {
    e->uid = 1234;
    e->gid = 5678;
  }
  return {d, f, l};
}

TEST_F(ImageUnpack, PreservesOwnersAsRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "chown to other ids needs root";
  UnpackOptions options;
  EXPECT_TRUE(options.preserve_owners);  // the default as root
  unpack(tar_of(owned_entries()), dest_, options);
  for (const char* name : {"/owned", "/owned/file", "/owned/link"}) {
    EXPECT_EQ(stat_of(dest_ + name).st_uid, 1234u) << name;
    EXPECT_EQ(stat_of(dest_ + name).st_gid, 5678u) << name;
  }
}

TEST_F(ImageUnpack, OwnersAreTheCallersWithoutPreserveOwners) {
  UnpackOptions options;
  options.preserve_owners = false;
  unpack(tar_of(owned_entries()), dest_, options);
  for (const char* name : {"/owned", "/owned/file", "/owned/link"}) {
    EXPECT_EQ(stat_of(dest_ + name).st_uid, ::geteuid()) << name;
    EXPECT_EQ(stat_of(dest_ + name).st_gid, ::getegid()) << name;
  }
}

// ---- whiteouts ----------------------------------------------------------------

TEST_F(ImageUnpack, WhiteoutsBecomeOverlayWhiteouts) {
  const std::string tar = tar_of({
      file(".wh.gone", ""),
      dir("d/"),
      file("d/.wh.old", ""),
      file("d/kept", "kept"),
      file("d/.wh.kept", ""),  // same layer: the file stays
      file("opq/.wh..wh..opq", ""),
      file("opq/new", "new"),
      dir("opq2/"),
      file("opq2/.wh..wh..opq", ""),
      file(".wh..wh.plnk", ""),  // aufs's own: ignored
      dir(".wh..wh.plnk/"),
      file(".wh..wh.plnk/123.456", "hard link store"),
      file(".wh..wh.plnk/.wh.x", ""),
  });
  UnpackResult result = unpack(tar, dest_);
  EXPECT_EQ(result.entries, 13u);

  for (const char* name : {"/gone", "/d/old"}) {
    struct stat st = stat_of(dest_ + name);
    EXPECT_TRUE(S_ISCHR(st.st_mode)) << name;
    EXPECT_EQ(st.st_rdev, makedev(0, 0)) << name;
  }
  EXPECT_EQ(read_file(dest_ + "/d/kept"), "kept");
  EXPECT_EQ(xattr_of(dest_ + "/opq", "user.overlay.opaque"), "y");
  EXPECT_EQ(xattr_of(dest_ + "/opq2", "user.overlay.opaque"), "y");
  EXPECT_EQ(read_file(dest_ + "/opq/new"), "new");
  EXPECT_EQ(xattr_of(dest_ + "/d", "user.overlay.opaque"), "<none>");
  EXPECT_EQ(names_in(dest_), (std::vector<std::string>{"d", "gone", "opq", "opq2"}));
  EXPECT_EQ(names_in(dest_ + "/d"), (std::vector<std::string>{"kept", "old"}));
  EXPECT_EQ(names_in(dest_ + "/opq"), std::vector<std::string>{"new"});
}

TEST_F(ImageUnpack, XattrsFromTheArchiveAreNotApplied) {
  Entry d = dir("d/");
  d.xattrs = {{"user.overlay.opaque", "y"}, {"trusted.overlay.opaque", "y"}};
  Entry f = file("f", "x");
  f.xattrs = {{"user.note", "hello"}, {"user.overlay.redirect", "/etc"}};
  unpack(tar_of({d, f}), dest_);
  EXPECT_EQ(xattr_of(dest_ + "/d", "user.overlay.opaque"), "<none>");
  EXPECT_EQ(xattr_of(dest_ + "/d", "trusted.overlay.opaque"), "<none>");
  EXPECT_EQ(xattr_of(dest_ + "/f", "user.note"), "<none>");
  EXPECT_EQ(xattr_of(dest_ + "/f", "user.overlay.redirect"), "<none>");
}

TEST_F(ImageUnpack, FileCapabilitiesAreAppliedAsRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "security.capability needs CAP_SETFCAP";
  // VFS_CAP_REVISION_2, effective, CAP_NET_BIND_SERVICE (10) permitted.
  std::string caps(20, '\0');
  caps[0] = 0x01;
  caps[3] = 0x02;
  caps[5] = 0x04;
  Entry f = file("ping", "x", 0755);
  f.xattrs = {{"security.capability", caps}};
  unpack(tar_of({f}), dest_);
  char buf[64];
  ssize_t n = ::getxattr((dest_ + "/ping").c_str(), "security.capability", buf, sizeof buf);
  ASSERT_EQ(n, 20) << std::strerror(errno);
  EXPECT_EQ(std::string(buf, 20), caps);
}

// ---- replacing -----------------------------------------------------------------

TEST_F(ImageUnpack, LaterEntriesReplaceEarlierOnes) {
  Entry again = dir("keepdir/", 0700);
  again.mtime = kMtime + 9;
  const std::string tar = tar_of({
      file("x", "first"),
      file("x", "second"),
      file("was-file", "f"),
      dir("was-file/"),
      file("was-file/in", "in"),
      dir("was-dir/"),
      dir("was-dir/sub/", 0555),
      file("was-dir/sub/f", "f", 0000),
      file("was-dir", "now a file"),
      dir("keepdir/"),
      file("keepdir/a", "a"),
      again,
      symlink("link", "x"),
      file("link", "plain now"),
  });
  unpack(tar, dest_);
  EXPECT_EQ(read_file(dest_ + "/x"), "second");
  EXPECT_EQ(read_file(dest_ + "/was-file/in"), "in");
  EXPECT_EQ(read_file(dest_ + "/was-dir"), "now a file");
  EXPECT_EQ(read_file(dest_ + "/keepdir/a"), "a");
  EXPECT_EQ(mode_of(dest_ + "/keepdir"), 0700u);
  EXPECT_EQ(stat_of(dest_ + "/keepdir").st_mtim.tv_sec, kMtime + 9);
  EXPECT_TRUE(S_ISREG(stat_of(dest_ + "/link").st_mode));
  EXPECT_EQ(read_file(dest_ + "/x"), "second");
}

TEST_F(ImageUnpack, ReplacingASymlinkNeverWritesThroughIt) {
  const std::string tar = tar_of({
      symlink("link", sentinel_ + "/keep"),
      file("link", "replaced"),
      symlink("dirlink", sentinel_),
      dir("dirlink/", 0700),
      file("dirlink/inside", "inside"),
  });
  unpack(tar, dest_);
  EXPECT_EQ(read_file(dest_ + "/link"), "replaced");
  EXPECT_TRUE(S_ISDIR(stat_of(dest_ + "/dirlink").st_mode));
  EXPECT_EQ(read_file(dest_ + "/dirlink/inside"), "inside");
  expect_sentinel_untouched();
}

// ---- other entry kinds and names ---------------------------------------------

TEST_F(ImageUnpack, CreatesFifos) {
  Entry fifo = device("run/fifo", '6', 0, 0);
  fifo.mode = 0620;
  unpack(tar_of({fifo}), dest_);
  EXPECT_TRUE(S_ISFIFO(stat_of(dest_ + "/run/fifo").st_mode));
  EXPECT_EQ(mode_of(dest_ + "/run/fifo"), 0620u);
  EXPECT_EQ(stat_of(dest_ + "/run/fifo").st_mtim.tv_sec, kMtime);
}

TEST_F(ImageUnpack, KeepsNamesAsBytes) {
  const std::string long_name = std::string(150, 'n') + "/" + std::string(120, 'm');
  const std::string tar = tar_of({
      file("caf\xc3\xa9", "utf-8"),
      file(long_name, "long"),
      symlink("longlink", std::string(200, 't')),
  });
  unpack(tar, dest_);
  EXPECT_EQ(read_file(dest_ + "/caf\xc3\xa9"), "utf-8");
  EXPECT_EQ(read_file(dest_ + "/" + long_name), "long");
  EXPECT_EQ(readlink_of(dest_ + "/longlink"), std::string(200, 't'));
}

TEST_F(ImageUnpack, RootEntrySetsTheRootsMetadata) {
  Entry root = dir("./", 0750);
  root.mtime = kMtime + 3;
  unpack(tar_of({root, file("f", "x")}), dest_);
  EXPECT_EQ(mode_of(dest_), 0750u);
  EXPECT_EQ(stat_of(dest_).st_mtim.tv_sec, kMtime + 3);
}

TEST_F(ImageUnpack, SlashAloneIsTheRootEntry) {
  // umoci insert writes the layer's root as "/".
  unpack(tar_of({dir("/", 0711), file("f", "x")}), dest_);
  EXPECT_EQ(mode_of(dest_), 0711u);
}

TEST_F(ImageUnpack, DestinationMustBeEmpty) {
  write_file(dest_ + "/already", "x");
  EXPECT_THAT(unpack_error(tar_of({file("f", "x")}), dest_), HasSubstr("is not empty"));
}

// ---- hostile archives -------------------------------------------------------------

struct Hostile {
  const char* title;
  std::vector<Entry> entries;
  std::string expect;  // in the message
};

TEST_F(ImageUnpack, RefusesHostileEntries) {
  const std::string outside = sentinel_;
  const std::vector<Hostile> cases = {
      {"dotdot", {file("../escape", "x")}, "entry '../escape': '..' in the name"},
      {"absolute", {file("/abs", "x")}, "entry '/abs': absolute path"},
      {"dotdot inside", {file("a/../../b", "x")}, "entry 'a/../../b': '..' in the name"},
      {"empty", {file("", "x")}, "entry '': empty name"},
      {"char device", {device("dev/null", '3', 1, 3)}, "entry 'dev/null': character device"},
      {"char device 0:0", {device("wh", '3', 0, 0)}, "entry 'wh': character device"},
      {"block device", {device("dev/sda", '4', 8, 0)}, "entry 'dev/sda': block device"},
      {"through absolute symlink",
       {symlink("evil", outside), file("evil/pwned", "x")},
       "entry 'evil/pwned': goes through the symlink 'evil'"},
      {"through relative symlink",
       {symlink("up", ".."), file("up/x", "x")},
       "entry 'up/x': goes through the symlink 'up'"},
      {"deeper through symlink",
       {dir("a/"), symlink("a/up", "../.."), file("a/up/sentinel/pwned", "x")},
       "entry 'a/up/sentinel/pwned': goes through the symlink 'a/up'"},
      {"directory through symlink",
       {symlink("evil", outside), dir("evil/sub/")},
       "entry 'evil/sub/': goes through the symlink 'evil'"},
      {"symlink through symlink",
       {symlink("evil", outside), symlink("evil/ln", "/etc/passwd")},
       "entry 'evil/ln': goes through the symlink 'evil'"},
      {"hard link out", {hardlink("hl", "../x")}, "entry 'hl': hard link target '../x': '..'"},
      {"hard link absolute",
       {hardlink("hl", outside + "/keep")},
       "entry 'hl': hard link target '" + outside + "/keep': absolute path"},
      {"hard link missing",
       {hardlink("hl", "missing")},
       "entry 'hl': hard link target 'missing' does not exist"},
      {"hard link to directory",
       {dir("d/"), hardlink("hl", "d")},
       "entry 'hl': hard link target 'd' is a directory"},
      {"hard link through symlinked parent",
       {symlink("s", outside), hardlink("hl", "s/keep")},
       "entry 'hl': hard link target 's/keep' goes through the symlink 's'"},
      {"hard link placed through symlink",
       {file("f", "x"), symlink("s", outside), hardlink("s/hl", "f")},
       "entry 's/hl': goes through the symlink 's'"},
      {"whiteout through symlink",
       {symlink("s", outside), file("s/.wh.keep", "")},
       "entry 's/.wh.keep': goes through the symlink 's'"},
      {"opaque through symlink",
       {symlink("s", outside), file("s/.wh..wh..opq", "")},
       "entry 's/.wh..wh..opq': goes through the symlink 's'"},
      {"fifo through symlink",
       {symlink("s", outside), device("s/fifo", '6', 0, 0)},
       "entry 's/fifo': goes through the symlink 's'"},
      {"through a file",
       {file("f", "x"), file("f/g", "y")},
       "entry 'f/g': goes through 'f', which is not a directory"},
      {"invalid whiteout", {file(".wh..", "")}, "entry '.wh..': not a valid whiteout"},
      {"below a whiteout",
       {file("a/.wh.b/c", "")},
       "entry 'a/.wh.b/c': goes through the whiteout name 'a/.wh.b'"},
      {"control bytes", {file("../a\nb", "")}, "entry '../a\\x0ab'"},
  };
  for (const Hostile& c : cases) {
    SCOPED_TRACE(c.title);
    TempDir tmp;
    const std::string dest = tmp / "layer";
    ASSERT_EQ(::mkdir(dest.c_str(), 0755), 0);
    for (auto compression : {Compression::kNone, Compression::kGzip}) {
      std::string message = unpack_error(compress(tar_of(c.entries), compression), dest);
      EXPECT_THAT(message, HasSubstr("layer test: " + c.expect));
      EXPECT_EQ(message.find('\n'), std::string::npos) << message;
      files::remove_tree(dest);
      ASSERT_EQ(::mkdir(dest.c_str(), 0755), 0);
    }
    EXPECT_EQ(names_in(tmp.path()), std::vector<std::string>{"layer"});
    expect_sentinel_untouched();
  }
}

// ---- corrupt input ------------------------------------------------------------------

// Some writers end a layer without the end-of-archive blocks (umoci does):
// such a layer unpacks, and its diff id covers exactly its bytes. (A cut at
// an entry boundary looks the same: the layer's digests catch it.)
TEST_F(ImageUnpack, ALayerWithoutEndBlocksUnpacks) {
  const std::string tar = tar_of({file("a", "alpha"), file("b", "beta")});
  const std::string cut = tar.substr(0, tar.size() - 1024);
  ASSERT_EQ(cut.find_last_not_of('\0') + 1 > cut.size() - 512, true)
      << "the test archive must end in data";
  UnpackResult result = unpack(cut, dest_);
  EXPECT_EQ(result.diff_id, sha256_digest(cut));
  EXPECT_EQ(read_file(dest_ + "/b"), "beta");
}

TEST_F(ImageUnpack, CorruptInputIsAnError) {
  const std::string tar = tar_of({file("a", noise(100000, 1)), file("b", "b")});
  const std::string gz = compress(tar, Compression::kGzip);
  const std::string zst = compress(tar, Compression::kZstd);
  struct Case {
    const char* title;
    std::string blob;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"empty", "", "layer test: empty"},
      {"garbage", std::string("this is not a layer at all ") + std::string(1000, 'x'),
       "layer test: not a tar archive"},
      {"gzip garbage", compress(std::string(2000, 'x'), Compression::kGzip),
       "layer test: not a tar archive inside the gzip stream"},
      {"xz",
       std::string("\xfd"
                   "7zXZ\0",
                   6) +
           std::string(600, 'x'),
       "xz-compressed layers are not supported"},
      {"gzip cut in half", gz.substr(0, gz.size() / 2), "layer test: truncated gzip input"},
      {"gzip without its trailer", gz.substr(0, gz.size() - 6),
       "layer test: corrupt or truncated gzip stream"},
      {"zstd cut in half", zst.substr(0, zst.size() / 2), "layer test: truncated zstd input"},
      {"tar cut in a file", tar.substr(0, 50000), "layer test: truncated tar archive"},
      {"tar cut after a pax header",
       TarWriter().add(file(std::string(150, 'p'), "x")).finish().substr(0, 1024),
       "layer test: damaged tar archive"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.title);
    TempDir tmp;
    std::string message = unpack_error(c.blob, tmp.path());
    EXPECT_THAT(message, HasSubstr(c.expect));
    EXPECT_NE(message, "<no error>");
  }
}

TEST_F(ImageUnpack, OneNullBlockEndsAnArchive) {
  std::string tar = tar_of({file("f", "x")});
  tar.resize(tar.size() - 512);
  UnpackResult result = unpack(tar, dest_);
  EXPECT_EQ(read_file(dest_ + "/f"), "x");
  EXPECT_EQ(result.diff_id, sha256_digest(tar));
}

TEST_F(ImageUnpack, NoSpaceReadsNaturally) {
  if (::geteuid() != 0) GTEST_SKIP() << "mounting a small tmpfs needs root";
  const std::string blob = compress(tar_of({file("big", noise(4 << 20, 9))}), Compression::kGzip);
  auto report = run_in_child([&](ChildWriter& out) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", dest_.c_str(), "tmpfs", 0, "size=1m") != 0) {
      out.say("SKIP");
      return;
    }
    std::string message = unpack_error(blob, dest_);
    out.say(message);
  });
  if (report.text == "SKIP\n") GTEST_SKIP() << "cannot mount tmpfs here";
  EXPECT_EQ(report.text, "layer test: entry 'big': write: No space left on device\n");
}

// ---- reading ---------------------------------------------------------------------------

TEST_F(ImageUnpack, ReadsFromAPipe) {
  const std::string tar = tar_of({file("big", noise(5 << 20, 4)), file("small", "s")});
  const std::string blob = compress(tar, Compression::kZstd);
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  UniqueFd read_end(fds[0]);
  std::thread writer([&, fd = fds[1]] {
    for (size_t done = 0; done < blob.size();) {
      ssize_t n = ::write(fd, blob.data() + done, std::min<size_t>(blob.size() - done, 65536));
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    ::close(fd);
  });
  UnpackResult result = unpack_layer(read_end.get(), dest_, {}, "layer test");
  writer.join();
  EXPECT_EQ(result.compressed_digest, sha256_digest(blob));
  EXPECT_EQ(result.diff_id, sha256_digest(tar));
  EXPECT_EQ(read_file(dest_ + "/small"), "s");
}

TEST_F(ImageUnpack, ReportsProgressAndCanBeStopped) {
  const std::string blob = compress(tar_of({file("big", noise(3 << 20, 5))}), Compression::kGzip);
  std::vector<uint64_t> seen;
  UnpackOptions options;
  options.progress = [&](uint64_t bytes) { seen.push_back(bytes); };
  unpack(blob, dest_, options);
  ASSERT_GE(seen.size(), 2u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), blob.size());
  for (size_t i = 1; i + 1 < seen.size(); ++i) EXPECT_GE(seen[i] - seen[i - 1], 256u << 10);

  TempDir other;
  options.progress = [](uint64_t) { throw std::runtime_error("cancelled by test"); };
  UniqueFd fd = blob_fd(blob);
  try {
    unpack_layer(fd.get(), other.path(), options, "layer test");
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "cancelled by test");
  }
}

TEST_F(ImageUnpack, ReadsGnuTarOutput) {
  if (::access("/usr/bin/tar", X_OK) != 0) GTEST_SKIP() << "no /usr/bin/tar";
  TempDir source;
  const std::string long_dir = source / (std::string(120, 'g') + "/" + std::string(90, 'h'));
  write_file(long_dir + "/file", "gnu long name");
  {
    // A sparse file: 1 MiB hole, data, 1 MiB hole.
    UniqueFd fd(::open((source / "sparse").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd);
    ASSERT_EQ(::pwrite(fd.get(), "data", 4, 1 << 20), 4);
    ASSERT_EQ(::ftruncate(fd.get(), 2 << 20), 0);
  }
  const std::string archive = tmp_ / "gnu.tar";
  const std::string command = "/usr/bin/tar --format=gnu --sparse -C " + source.path() + " -czf " +
                              archive + " . 2>/dev/null";
  ASSERT_EQ(std::system(command.c_str()), 0);
  std::string blob = read_file(archive);
  ::unlink(archive.c_str());
  unpack(blob, dest_);
  EXPECT_EQ(read_file(dest_ + "/" + std::string(120, 'g') + "/" + std::string(90, 'h') + "/file"),
            "gnu long name");
  std::string sparse = read_file(dest_ + "/sparse");
  ASSERT_EQ(sparse.size(), 2u << 20);
  EXPECT_EQ(sparse.substr(1 << 20, 4), "data");
  EXPECT_EQ(sparse.find_first_not_of('\0'), 1u << 20);
  EXPECT_EQ(sparse.find_last_not_of('\0'), (1u << 20) + 3);
}

// ---- removing -----------------------------------------------------------------------------

std::string awkward_layer() {
  return tar_of({
      dir("ro/", 0555),
      dir("ro/deeper/", 0500),
      file("ro/deeper/f", "x", 0000),
      dir("ro/closed/", 0000),
      file("ro/closed/g", "y", 0000),
      dir("ro/closed/inner/", 0000),
      symlink("ro/out", "/"),
      file(".wh.gone", ""),
      file("zero", "", 0000),
  });
}

TEST_F(ImageUnpack, RemoveLayerTreeRemovesUnwritableTrees) {
  unpack(awkward_layer(), dest_);
  ASSERT_EQ(mode_of(dest_ + "/ro"), 0555u);
  files::remove_tree(dest_);
  EXPECT_FALSE(path_exists(dest_));
  EXPECT_NO_THROW(files::remove_tree(dest_));  // missing is fine
  expect_sentinel_untouched(false);
}

TEST_F(ImageUnpack, RemoveLayerTreeAsAnOrdinaryUser) {
  if (::geteuid() != 0) {
    unpack(awkward_layer(), dest_);
    files::remove_tree(dest_);
    EXPECT_FALSE(path_exists(dest_));
    return;
  }
  // As root: extract and remove as nobody, where the modes really matter.
  const std::string home = tmp_ / "nobody";
  const std::string dest = home + "/layer";
  ASSERT_EQ(::chmod(tmp_.path().c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(home.c_str(), 0755), 0);
  ASSERT_EQ(::chown(home.c_str(), 65534, 65534), 0);
  const std::string blob = awkward_layer();
  auto report = run_in_child([&](ChildWriter& out) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(65534, 65534, 65534) != 0 ||
        ::setresuid(65534, 65534, 65534) != 0) {
      out.say("cannot drop privileges");
      return;
    }
    UnpackOptions options;
    out.say(options.preserve_owners ? "preserve" : "no preserve");
    ::mkdir(dest.c_str(), 0755);
    out.say(unpack_error(blob, dest, options));
    out.say(std::to_string(mode_of(dest + "/ro/closed")));
    try {
      files::remove_tree(dest);
      out.say("removed");
    } catch (const Error& e) {
      out.say(e.what());
    }
  });
  EXPECT_EQ(report.text, "no preserve\n<no error>\n0\nremoved\n");
  EXPECT_FALSE(path_exists(dest));
}

TEST_F(ImageUnpack, DeepTreesNeedFewDescriptors) {
  // 300 levels, with at most 64 descriptors.
  std::string deep;
  for (int i = 0; i < 300; ++i) deep += "d/";
  const std::string tar = tar_of({file(deep + "leaf", "deep"), dir(deep.substr(0, 300), 0555)});
  auto report = run_in_child([&](ChildWriter& out) {
    rlimit limit{64, 64};
    ::setrlimit(RLIMIT_NOFILE, &limit);
    out.say(unpack_error(tar, dest_));
    try {
      files::remove_tree(dest_);
      out.say(path_exists(dest_) ? "still there" : "removed");
    } catch (const Error& e) {
      out.say(e.what());
    }
  });
  EXPECT_EQ(report.text, "<no error>\nremoved\n");
}

// ---- files out of a sandbox ----------------------------------------------------------

UnpackOptions sandbox_files(mode_t umask = 022) {
  UnpackOptions options;
  options.preserve_owners = false;
  options.whiteouts = false;
  options.from_sandbox = true;
  options.umask = umask;
  return options;
}

// What a sandbox's tar can send (its user may chmod 4755, and the tar is
// the sandbox's to forge): set-uid, set-gid and sticky bits are dropped and
// the caller's umask applies, owners are the caller's, and no extended
// attribute is written, file capabilities above all (as root too).
TEST_F(ImageUnpack, FilesFromASandboxLoseModesOwnersAndXattrs) {
  // VFS_CAP_REVISION_2, effective, CAP_SETUID (7) and CAP_NET_BIND_SERVICE permitted.
  std::string caps(20, '\0');
  caps[0] = 0x01;
  caps[3] = 0x02;
  caps[4] = static_cast<char>(0x80);
  caps[5] = 0x04;
  Entry top = dir("out/", 01777);
  Entry suid = file("out/suid", "x", 04755);
  Entry sgid = file("out/sgid", "x", 02755);
  Entry capped = file("out/capped", "x", 0755);
  capped.xattrs = {
      {"security.capability", caps}, {"user.note", "n"}, {"trusted.overlay.opaque", "y"}};
  Entry open_dir = dir("out/open/", 0777);
  open_dir.xattrs = {{"user.overlay.opaque", "y"}};
  Entry sticky_file = file("out/open/sticky", "x", 07777);
  for (Entry* e : {&top, &suid, &sgid, &capped, &open_dir, &sticky_file}) {
    e->uid = 0;
    e->gid = 0;
  }
  unpack(tar_of({top, suid, sgid, capped, open_dir, sticky_file, file("out/.wh.plain", "w")}),
         dest_, sandbox_files(027));
  EXPECT_EQ(mode_of(dest_ + "/out"), 0750u);
  EXPECT_EQ(mode_of(dest_ + "/out/suid"), 0750u);
  EXPECT_EQ(mode_of(dest_ + "/out/sgid"), 0750u);
  EXPECT_EQ(mode_of(dest_ + "/out/capped"), 0750u);
  EXPECT_EQ(mode_of(dest_ + "/out/open"), 0750u);
  EXPECT_EQ(mode_of(dest_ + "/out/open/sticky"), 0750u);
  for (const char* name :
       {"/out", "/out/suid", "/out/sgid", "/out/capped", "/out/open", "/out/open/sticky"}) {
    EXPECT_EQ(stat_of(dest_ + name).st_uid, ::geteuid()) << name;
    EXPECT_EQ(stat_of(dest_ + name).st_gid, ::getegid()) << name;
  }
  EXPECT_EQ(xattr_of(dest_ + "/out/capped", "security.capability"), "<none>");
  EXPECT_EQ(xattr_of(dest_ + "/out/capped", "user.note"), "<none>");
  EXPECT_EQ(xattr_of(dest_ + "/out/capped", "trusted.overlay.opaque"), "<none>");
  EXPECT_EQ(xattr_of(dest_ + "/out/open", "user.overlay.opaque"), "<none>");
  EXPECT_EQ(::listxattr((dest_ + "/out/capped").c_str(), nullptr, 0), 0);
  EXPECT_EQ(read_file(dest_ + "/out/.wh.plain"), "w");  // a name, not a whiteout
  // The same archive as an image layer keeps its modes: the rules are the download's own.
  TempDir other;
  const std::string layer = other / "layer";
  ASSERT_EQ(::mkdir(layer.c_str(), 0755), 0);
  unpack(tar_of({top, suid}), layer);
  EXPECT_EQ(mode_of(layer + "/out/suid"), 04755u);
  EXPECT_EQ(mode_of(layer + "/out"), 01777u);
}

TEST_F(ImageUnpack, FilesFromASandboxUnlistedParentsTakeTheUmask) {
  unpack(tar_of({file("out/deep/f", "x", 0666)}), dest_, sandbox_files(077));
  EXPECT_EQ(mode_of(dest_ + "/out"), 0700u);
  EXPECT_EQ(mode_of(dest_ + "/out/deep"), 0700u);
  EXPECT_EQ(mode_of(dest_ + "/out/deep/f"), 0600u);
}

TEST_F(ImageUnpack, FilesFromASandboxWithoutUmask) {
  unpack(tar_of({dir("d/", 0777), file("d/f", "x", 04777)}), dest_, sandbox_files(0));
  EXPECT_EQ(mode_of(dest_ + "/d"), 0777u);
  EXPECT_EQ(mode_of(dest_ + "/d/f"), 0777u);
}

TEST_F(ImageUnpack, FilesFromASandboxKeepLinksInside) {
  unpack(tar_of({dir("out/"), dir("out/a/"), file("out/f", "x"), symlink("out/l1", "f"),
                 symlink("out/a/l2", "../f"), symlink("out/a/l3", "./b/c"),
                 symlink("out/self", "."), hardlink("out/a/h", "out/f")}),
         dest_, sandbox_files());
  EXPECT_EQ(readlink_of(dest_ + "/out/l1"), "f");
  EXPECT_EQ(readlink_of(dest_ + "/out/a/l2"), "../f");
  EXPECT_EQ(readlink_of(dest_ + "/out/a/l3"), "./b/c");
  EXPECT_EQ(read_file(dest_ + "/out/a/h"), "x");
}

TEST_F(ImageUnpack, FilesFromASandboxRefuseWhatALayerMayHave) {
  const std::vector<Hostile> cases = {
      {"fifo",
       {dir("out/"), device("out/fifo", '6', 0, 0)},
       "entry 'out/fifo': FIFO (not allowed in files from a sandbox)"},
      {"char device",
       {dir("out/"), device("out/null", '3', 1, 3)},
       "entry 'out/null': character device"},
      {"block device",
       {dir("out/"), device("out/sda", '4', 8, 0)},
       "entry 'out/sda': block device"},
      {"absolute symlink",
       {dir("out/"), symlink("out/passwd", "/etc/passwd")},
       "entry 'out/passwd': symbolic link to an absolute path ('/etc/passwd')"},
      {"symlink up and out",
       {dir("out/"), symlink("out/up", "..")},
       "entry 'out/up': symbolic link out of the download ('..')"},
      {"deeper symlink out",
       {dir("out/a/"), symlink("out/a/up", "../../x")},
       "entry 'out/a/up': symbolic link out of the download ('../../x')"},
      {"dotdot after a name",
       {dir("out/"), symlink("out/s", "."), symlink("out/t", "s/../..")},
       "entry 'out/t': symbolic link with '..' after a name ('s/../..')"},
      {"top-level symlink", {symlink("x", "/etc")}, "entry 'x': a top-level symbolic link"},
      {"top-level relative symlink", {symlink("x", "etc")}, "entry 'x': a top-level symbolic link"},
  };
  for (const Hostile& c : cases) {
    SCOPED_TRACE(c.title);
    TempDir tmp;
    const std::string dest = tmp / "layer";
    ASSERT_EQ(::mkdir(dest.c_str(), 0755), 0);
    std::string message = unpack_error(tar_of(c.entries), dest, sandbox_files());
    EXPECT_THAT(message, HasSubstr("layer test: " + c.expect));
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    expect_sentinel_untouched();
  }
}

// The unpacked size is counted before anything is written: declared sizes
// (a sparse file's too) and a cost for every entry, hard links included.
TEST_F(ImageUnpack, AccountsDeclaredSizesBeforeWriting) {
  uint64_t counted = 0;
  UnpackOptions options;
  options.account = [&](uint64_t bytes) { counted += bytes; };
  unpack(tar_of({dir("d/"), file("d/a", std::string(1000, 'a')), file("d/b", "bb"),
                 hardlink("d/h", "d/a"), symlink("d/l", "a")}),
         dest_, options);
  EXPECT_EQ(counted, 5 * kEntryCost + 1002);

  // A bound: the accountant throws, and the entry that would pass it is not written.
  TempDir tmp;
  const std::string dest = tmp / "layer";
  ASSERT_EQ(::mkdir(dest.c_str(), 0755), 0);
  uint64_t total = 0;
  options.account = [&](uint64_t bytes) {
    total += bytes;
    if (total > 4096) throw Error("over the bound");
  };
  EXPECT_EQ(
      unpack_error(compress(tar_of({file("small", "s"), file("big", std::string(8192, '\0'))}),
                            Compression::kGzip),
                   dest, options),
      "over the bound");
  EXPECT_TRUE(path_exists(dest + "/small"));
  EXPECT_FALSE(path_exists(dest + "/big"));
}

}  // namespace
}  // namespace openshell::image
