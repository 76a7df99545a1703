// Private to src/image: what the layer extraction files share.
#pragma once

#include <sys/types.h>
#include <time.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <archive.h>
#include <archive_entry.h>

#include "base/unique_fd.h"
#include "image/digest.h"
#include "image/unpack.h"

namespace openshell::image::unpack_detail {

constexpr size_t kBufferSize = 1 << 20;        // one read(2), one decompressed chunk
constexpr uint64_t kProgressStep = 256 << 10;  // compressed bytes between progress calls
constexpr size_t kTarBlock = 512;
constexpr size_t kMaxName = 4095;  // PATH_MAX less the NUL: deeper trees are refused

// openat2 below dirfd, never through a symlink (the last component included)
// nor out of dirfd. EAGAIN: a rename raced the lookup; try again.
int open_beneath(int dirfd, const char* path, uint64_t flags);

// A name as it can stand in a one-line message: control bytes escaped, long
// names cut.
std::string printable(std::string_view name);

// 'name', printable.
std::string quoted(std::string_view name);

// The entry name as extraction uses it: its components joined by "/", "."
// and empty components dropped ("" is the layer's root). Returns nullptr, or
// why the name is refused.
const char* normalize(std::string_view raw, std::string* out);

using ArchivePtr = std::unique_ptr<archive, int (*)(archive*)>;

// The layer as two libarchive readers: `raw_` decompresses what is read from
// fd (format "raw": the whole decompressed stream is one entry), and `tar_`
// parses that stream. Their read callbacks hash both streams.
class LayerReader {
 public:
  LayerReader(int fd, const UnpackOptions& options, const std::string& what);
  LayerReader(const LayerReader&) = delete;
  LayerReader& operator=(const LayerReader&) = delete;

  // The next entry; nullptr at the end of the archive.
  archive_entry* next();
  // The next block of the current entry's data; false at its end.
  bool data(const void** block, size_t* size, int64_t* offset);
  // After the last entry: reads both streams to their ends, checks that the
  // archive ended with its end-of-archive block, and fills in the digests.
  void finish(UnpackResult* result);

 private:
  static la_ssize_t read_compressed(archive* a, void* self, const void** block);
  static la_ssize_t read_tar(archive* a, void* self, const void** block);
  la_ssize_t read_decompressed();
  bool report_progress();
  [[noreturn]] void fail(archive* a) const;
  std::string unrecognised() const;

  int fd_;
  const UnpackOptions& options_;
  const std::string& what_;
  std::unique_ptr<char[]> compressed_buffer_{new char[kBufferSize]};
  std::unique_ptr<char[]> tar_buffer_{new char[kBufferSize]};
  Sha256 compressed_hash_;
  Sha256 tar_hash_;
  uint64_t reported_ = 0;
  bool decompressed_all_ = false;
  int read_errno_ = 0;
  std::exception_ptr progress_error_;
  std::string decompress_error_;  // the decompressor's message, as the tar reader met it
  std::array<unsigned char, 6> magic_{};
  size_t magic_size_ = 0;
  ArchivePtr raw_{nullptr, archive_read_free};
  ArchivePtr tar_{nullptr, archive_read_free};  // freed first: it reads from raw_
};

struct DirectoryMetadata {
  mode_t mode = 0755;
  uid_t uid = 0;
  gid_t gid = 0;
  timespec mtime{};
  bool from_entry = false;  // false: a parent the archive does not list
};

timespec mtime_of(archive_entry* entry);

// Applies the entries of one layer below dest, refusing what the archive may
// not do (see unpack.h).
class Extractor {
 public:
  Extractor(UniqueFd dest, const UnpackOptions& options, const std::string& what,
            LayerReader* reader, UnpackResult* result)
      : dest_(std::move(dest)),
        options_(options),
        what_(what),
        reader_(*reader),
        result_(*result),
        privileged_(::geteuid() == 0) {}

  void extract(archive_entry* entry);
  // Directories' own mode, owner and mtime, deepest first.
  void finish_directories();

 private:
  void make_directory(archive_entry* entry);
  void make_file(archive_entry* entry);
  void make_symlink(archive_entry* entry);
  void make_fifo(archive_entry* entry);
  void make_hard_link(const char* raw_target);
  void make_whiteout();
  void make_opaque();

  const char* leaf() const { return path_.c_str() + leaf_at_; }
  std::string_view parent_path() const {
    return std::string_view(path_).substr(0, leaf_at_ ? leaf_at_ - 1 : 0);
  }
  size_t whiteout_above() const;
  int parent_fd();
  UniqueFd walk(const std::string& dir, bool create, const std::string& role);
  template <typename Make>
  int create_replacing(int parent, Make make);
  void make_room(int parent);
  void forget_directories(const std::string& path);

  void owner_of(archive_entry* entry, uid_t* uid, gid_t* gid);
  bool keeps_owners() const { return options_.preserve_owners && !options_.from_sandbox; }
  mode_t mode_of(archive_entry* entry) const;
  void check_symlink_target(const char* target) const;
  void set_metadata(int fd, archive_entry* entry, bool regular);
  void set_link_metadata(int parent, archive_entry* entry);
  void copy_data(int fd, archive_entry* entry);
  void apply_directory(const std::string& path, const DirectoryMetadata& metadata);

  [[noreturn]] void refuse(const std::string& reason) const;
  // "ACTION: strerror(err)" as the reason; the first reads errno before
  // anything can change it.
  [[noreturn]] void fail_errno(const char* action) const;
  [[noreturn]] void fail_errno(const std::string& action, int err) const;

  UniqueFd dest_;
  const UnpackOptions& options_;
  const std::string& what_;
  LayerReader& reader_;
  UnpackResult& result_;
  const bool privileged_;

  std::string_view raw_name_;  // the current entry's name as archived
  std::string path_;           // and normalized
  size_t leaf_at_ = 0;         // where its last component starts in path_
  std::string target_;         // a hard link's target, normalized
  std::string component_;
  std::string cached_parent_;  // consecutive entries mostly share a parent
  UniqueFd cached_fd_;
  std::map<std::string, DirectoryMetadata> directories_;
};

}  // namespace openshell::image::unpack_detail
