#include "image/unpack.h"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <archive.h>
#include <archive_entry.h>

#include "base/directory.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "image/digest.h"

namespace openshell::image {

namespace {

constexpr size_t kBufferSize = 1 << 20;        // one read(2), one decompressed chunk
constexpr uint64_t kProgressStep = 256 << 10;  // compressed bytes between progress calls
constexpr size_t kTarBlock = 512;
constexpr size_t kMaxName = 4095;  // PATH_MAX less the NUL: deeper trees are refused

// ---- paths -----------------------------------------------------------------

// openat2 below dirfd, never through a symlink (the last component included)
// nor out of dirfd. EAGAIN: a rename raced the lookup; try again.
int open_beneath(int dirfd, const char* path, uint64_t flags) {
  open_how how{};
  how.flags = flags | O_CLOEXEC;
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  long fd = -1;
  for (int attempt = 0; attempt < 16; ++attempt) {
    fd = ::syscall(SYS_openat2, dirfd, path, &how, sizeof how);
    if (fd >= 0 || errno != EAGAIN) break;
  }
  return static_cast<int>(fd);
}

// A name as it can stand in a one-line message: control bytes escaped, long
// names cut.
std::string printable(std::string_view name) {
  constexpr size_t kLimit = 200;
  std::string out;
  for (size_t i = 0; i < name.size() && i < kLimit; ++i) {
    unsigned char c = static_cast<unsigned char>(name[i]);
    if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  if (name.size() > kLimit) out += "...";
  return out;
}

// 'name', printable.
std::string quoted(std::string_view name) {
  std::string out = "'";
  out += printable(name);
  out += '\'';
  return out;
}

// The entry name as extraction uses it: its components joined by "/", "."
// and empty components dropped ("" is the layer's root). Returns nullptr, or
// why the name is refused.
const char* normalize(std::string_view raw, std::string* out) {
  out->clear();
  if (raw.empty()) return "empty name";
  // "/" alone is the layer's root (umoci writes it so); any other name
  // starting with "/" is refused.
  if (raw.find_first_not_of('/') == std::string_view::npos) return nullptr;
  if (raw.front() == '/') return "absolute path";
  if (raw.size() > kMaxName) return "name longer than 4095 bytes";
  for (size_t start = 0; start <= raw.size();) {
    size_t end = std::min(raw.find('/', start), raw.size());
    std::string_view part = raw.substr(start, end - start);
    if (part == "..") return "'..' in the name";
    if (!part.empty() && part != ".") {
      if (!out->empty()) out->push_back('/');
      out->append(part);
    }
    start = end + 1;
  }
  return nullptr;
}

// ---- reading ---------------------------------------------------------------

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

LayerReader::LayerReader(int fd, const UnpackOptions& options, const std::string& what)
    : fd_(fd), options_(options), what_(what) {
  raw_.reset(archive_read_new());
  tar_.reset(archive_read_new());
  if (!raw_ || !tar_) throw Error(what_ + ": libarchive: out of memory");
  // Only what a layer can be, so that the static link pulls in nothing else.
  // A libarchive without built-in gzip or zstd would run an external program
  // (ARCHIVE_WARN): refused.
  if (archive_read_support_filter_gzip(raw_.get()) != ARCHIVE_OK ||
      archive_read_support_filter_zstd(raw_.get()) != ARCHIVE_OK ||
      archive_read_support_filter_none(raw_.get()) != ARCHIVE_OK ||
      archive_read_support_format_raw(raw_.get()) != ARCHIVE_OK ||
      archive_read_support_format_tar(tar_.get()) != ARCHIVE_OK)
    throw Error(what_ + ": libarchive lacks built-in gzip, zstd or tar support");
  if (archive_read_open(raw_.get(), this, nullptr, read_compressed, nullptr) != ARCHIVE_OK)
    fail(raw_.get());
  archive_entry* stream;
  if (archive_read_next_header(raw_.get(), &stream) != ARCHIVE_OK) fail(raw_.get());
  if (archive_read_open(tar_.get(), this, nullptr, read_tar, nullptr) != ARCHIVE_OK)
    fail(tar_.get());
}

la_ssize_t LayerReader::read_compressed(archive* a, void* self_ptr, const void** block) {
  auto* self = static_cast<LayerReader*>(self_ptr);
  char* buffer = self->compressed_buffer_.get();
  ssize_t n;
  do {
    n = ::read(self->fd_, buffer, kBufferSize);
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    self->read_errno_ = errno;
    archive_set_error(a, self->read_errno_, "read: %s", std::strerror(self->read_errno_));
    return -1;
  }
  *block = buffer;
  if (self->magic_size_ < self->magic_.size()) {
    size_t take = std::min(self->magic_.size() - self->magic_size_, static_cast<size_t>(n));
    std::memcpy(self->magic_.data() + self->magic_size_, buffer, take);
    self->magic_size_ += take;
  }
  self->compressed_hash_.update(buffer, static_cast<size_t>(n));
  if (!self->report_progress()) {
    archive_set_error(a, ECANCELED, "stopped by the progress callback");
    return -1;
  }
  return n;
}

la_ssize_t LayerReader::read_tar(archive* a, void* self_ptr, const void** block) {
  auto* self = static_cast<LayerReader*>(self_ptr);
  la_ssize_t n = self->read_decompressed();
  if (n < 0) {
    archive_set_error(a, EIO, "%s", self->decompress_error_.c_str());
    return -1;
  }
  *block = self->tar_buffer_.get();
  return n;
}

// The next chunk of the decompressed stream into tar_buffer_, hashed; 0 at
// its end, -1 with decompress_error_ set.
la_ssize_t LayerReader::read_decompressed() {
  if (decompressed_all_) return 0;
  la_ssize_t n = archive_read_data(raw_.get(), tar_buffer_.get(), kBufferSize);
  if (n < 0) {
    // Some failures come without a message (gzip's trailer cut short).
    const char* message = archive_error_string(raw_.get());
    const char* filter = archive_filter_name(raw_.get(), 0);
    decompress_error_ = message ? std::string(message)
                        : filter && *filter && std::strcmp(filter, "none") != 0
                            ? std::string("corrupt or truncated ") + filter + " stream"
                            : std::string("unreadable stream");
    return -1;
  }
  if (n == 0) {
    decompressed_all_ = true;
    return 0;
  }
  const char* data = tar_buffer_.get();
  const size_t size = static_cast<size_t>(n);
  tar_hash_.update(data, size);
  return n;
}

// Calls options_.progress every kProgressStep bytes. False when it threw
// (kept for unpack_layer to rethrow: exceptions must not cross libarchive).
bool LayerReader::report_progress() {
  if (!options_.progress) return true;
  const uint64_t bytes = compressed_hash_.bytes();
  if (bytes - reported_ < kProgressStep) return true;
  reported_ = bytes;
  try {
    options_.progress(bytes);
  } catch (...) {
    progress_error_ = std::current_exception();
    return false;
  }
  return true;
}

archive_entry* LayerReader::next() {
  archive_entry* entry = nullptr;
  int r = archive_read_next_header(tar_.get(), &entry);
  if (r == ARCHIVE_EOF) return nullptr;
  // ARCHIVE_WARN: typically a name not convertible to the C locale's
  // charset; libarchive then keeps its bytes as they are, which is what we
  // want. ARCHIVE_RETRY ("Damaged tar archive") is as fatal as FATAL here.
  if (r != ARCHIVE_OK && r != ARCHIVE_WARN) fail(tar_.get());
  return entry;
}

bool LayerReader::data(const void** block, size_t* size, int64_t* offset) {
  la_int64_t at = 0;
  int r = archive_read_data_block(tar_.get(), block, size, &at);
  if (r == ARCHIVE_EOF) return false;
  if (r != ARCHIVE_OK && r != ARCHIVE_WARN) fail(tar_.get());
  *offset = at;
  return true;
}

void LayerReader::finish(UnpackResult* result) {
  // The rest of the tar stream (padding, whatever follows) is part of diff_id.
  la_ssize_t n;
  while ((n = read_decompressed()) > 0) {
  }
  if (n < 0) fail(raw_.get());
  // A tar stream may end without its end-of-archive blocks (umoci's layers
  // do): a cut at an entry boundary is then invisible here, and the layer's
  // digests, which the caller checks, are what catch it.
  // The rest of the blob (after the last gzip member, say) is part of its digest.
  for (;;) {
    ssize_t got = ::read(fd_, compressed_buffer_.get(), kBufferSize);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const int err = errno;
      throw_errno(what_ + ": read", err);
    }
    if (got == 0) break;
    compressed_hash_.update(compressed_buffer_.get(), static_cast<size_t>(got));
  }
  result->compressed_size = compressed_hash_.bytes();
  if (options_.progress) options_.progress(result->compressed_size);
  result->compressed_digest = compressed_hash_.digest();
  result->diff_id = tar_hash_.digest();
}

// "Unrecognized archive format", said for what it is.
std::string LayerReader::unrecognised() const {
  auto starts = [this](std::initializer_list<unsigned char> magic) {
    return magic_size_ >= magic.size() && std::equal(magic.begin(), magic.end(), magic_.begin());
  };
  switch (archive_filter_code(raw_.get(), 0)) {
    case ARCHIVE_FILTER_GZIP:
      return "not a tar archive inside the gzip stream";
    case ARCHIVE_FILTER_ZSTD:
      return "not a tar archive inside the zstd stream";
  }
  if (starts({0xfd, '7', 'z', 'X', 'Z', 0}))
    return "xz-compressed layers are not supported (only gzip and zstd)";
  if (starts({'B', 'Z', 'h'}))
    return "bzip2-compressed layers are not supported (only gzip and zstd)";
  return "not a tar archive, plain or compressed with gzip or zstd";
}

void LayerReader::fail(archive* a) const {
  if (progress_error_) std::rethrow_exception(progress_error_);
  if (read_errno_) throw_errno(what_ + ": read", read_errno_);
  if (compressed_hash_.bytes() == 0) throw Error(what_ + ": empty (no data)");
  const char* message = archive_error_string(a);
  std::string text = !decompress_error_.empty() ? decompress_error_ : message ? message : "";
  if (text == "Unrecognized archive format") text = unrecognised();
  if (text.empty()) text = "unreadable archive";
  // libarchive capitalises ("Truncated tar archive"); a message goes on after "what: ".
  if (text.size() > 1 && std::isupper(static_cast<unsigned char>(text[0])) &&
      std::islower(static_cast<unsigned char>(text[1])))
    text[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(text[0])));
  throw Error(what_ + ": " + text);
}

// ---- writing ---------------------------------------------------------------

struct DirectoryMetadata {
  mode_t mode = 0755;
  uid_t uid = 0;
  gid_t gid = 0;
  timespec mtime{};
  bool from_entry = false;  // false: a parent the archive does not list
};

timespec mtime_of(archive_entry* entry) {
  timespec t{};
  t.tv_sec = archive_entry_mtime(entry);
  long nsec = archive_entry_mtime_nsec(entry);
  t.tv_nsec = nsec >= 0 && nsec < 1000000000 ? nsec : 0;
  return t;
}

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

void Extractor::refuse(const std::string& reason) const {
  throw Error(what_ + ": entry " + quoted(raw_name_) + ": " + reason);
}

void Extractor::fail_errno(const char* action) const {
  const int err = errno;
  fail_errno(std::string(action), err);
}

void Extractor::fail_errno(const std::string& action, int err) const {
  refuse(errno_message(action, err));
}

void Extractor::extract(archive_entry* entry) {
  ++result_.entries;
  const char* raw = archive_entry_pathname(entry);
  raw_name_ = raw ? raw : "";
  if (const char* why = normalize(raw_name_, &path_)) refuse(why);
  size_t slash = path_.rfind('/');
  leaf_at_ = slash == std::string::npos ? 0 : slash + 1;

  if (options_.account) {
    const bool data = archive_entry_filetype(entry) == AE_IFREG && !archive_entry_hardlink(entry);
    const int64_t size = data ? archive_entry_size(entry) : 0;
    options_.account(kEntryCost + (size > 0 ? static_cast<uint64_t>(size) : 0));
  }
  if (options_.whiteouts && !options_.from_sandbox) {
    if (const size_t at = whiteout_above(); at != std::string::npos) {
      if (path_.compare(at, 8, ".wh..wh.") == 0) return;  // inside aufs's own (".wh..wh.plnk/")
      refuse("goes through the whiteout name " + quoted(path_.substr(0, path_.find('/', at))));
    }
    if (std::strncmp(leaf(), ".wh.", 4) == 0) return make_whiteout();
  }
  if (const char* target = archive_entry_hardlink(entry)) return make_hard_link(target);
  const mode_t type = archive_entry_filetype(entry);
  if (type == AE_IFDIR) return make_directory(entry);
  if (path_.empty()) refuse("names the layer's root but is not a directory");
  const char* in = options_.from_sandbox ? "in files from a sandbox" : "in a layer";
  switch (type) {
    case AE_IFREG:
      return make_file(entry);
    case AE_IFLNK:
      return make_symlink(entry);
    case AE_IFIFO:
      if (options_.from_sandbox) refuse(std::string("FIFO (not allowed ") + in + ")");
      return make_fifo(entry);
    case AE_IFCHR:
      refuse(std::string("character device (device nodes are not allowed ") + in + ")");
    case AE_IFBLK:
      refuse(std::string("block device (device nodes are not allowed ") + in + ")");
    case AE_IFSOCK:
      refuse(std::string("socket (not allowed ") + in + ")");
    default:
      refuse("unknown entry type");
  }
}

// Where a ".wh." component starts in the current entry's parent path, or
// npos: such a name is never created, so nothing can be below it.
size_t Extractor::whiteout_above() const {
  for (size_t at = path_.find(".wh."); at != std::string::npos && at < leaf_at_;
       at = path_.find(".wh.", at + 1))
    if (at == 0 || path_[at - 1] == '/') return at;
  return std::string::npos;
}

// The current entry's parent directory, created as needed (0700 until
// finish_directories). Cached: the fd stays valid until the next call.
int Extractor::parent_fd() {
  std::string_view parent = parent_path();
  if (parent.empty()) return dest_.get();
  if (cached_fd_ && parent == cached_parent_) return cached_fd_.get();
  cached_fd_.reset();
  cached_parent_.assign(parent);
  int fd = open_beneath(dest_.get(), cached_parent_.c_str(), O_PATH | O_DIRECTORY);
  cached_fd_ = fd >= 0 ? UniqueFd(fd) : walk(cached_parent_, true, "");
  return cached_fd_.get();
}

// Opens dir one component at a time, creating missing ones when `create`
// says so, and says which component stands in the way. `role` starts the
// reason ("" for the entry itself, "hard link target 'x' ").
UniqueFd Extractor::walk(const std::string& dir, bool create, const std::string& role) {
  UniqueFd current;
  int at = dest_.get();
  for (size_t start = 0; start < dir.size();) {
    size_t end = std::min(dir.find('/', start), dir.size());
    component_.assign(dir, start, end - start);
    const std::string_view prefix(dir.data(), end);
    int fd = open_beneath(at, component_.c_str(), O_PATH | O_DIRECTORY);
    if (fd < 0 && errno == ENOENT && create) {
      if (::mkdirat(at, component_.c_str(), 0700) != 0 && errno != EEXIST) {
        const int err = errno;
        fail_errno("create directory " + quoted(prefix), err);
      }
      directories_.try_emplace(std::string(prefix));
      fd = open_beneath(at, component_.c_str(), O_PATH | O_DIRECTORY);
    }
    if (fd < 0) {
      const int err = errno;
      const std::string name = quoted(prefix);
      switch (err) {
        case ELOOP:
          refuse(role + "goes through the symlink " + name);
        case EXDEV:
          refuse(role + "leaves the layer at " + name);
        case ENOTDIR:
          refuse(role + "goes through " + name + ", which is not a directory");
        case ENOENT:
          refuse(role + "goes through " + name + ", which does not exist");
        default:
          fail_errno("open directory " + name, err);
      }
    }
    current.reset(fd);
    at = fd;
    start = end + 1;
  }
  return current;
}

// make(), and when the name is taken, make() again in its place.
template <typename Make>
int Extractor::create_replacing(int parent, Make make) {
  int rc = make();
  if (rc < 0 && errno == EEXIST) {
    make_room(parent);
    rc = make();
  }
  return rc;
}

// Removes what the current entry replaces: a non-directory, or a directory
// with its contents.
void Extractor::make_room(int parent) {
  struct stat st;
  if (::fstatat(parent, leaf(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) return;
    fail_errno("stat what it replaces");
  }
  if (!S_ISDIR(st.st_mode)) {
    if (::unlinkat(parent, leaf(), 0) != 0 && errno != ENOENT)
      fail_errno("remove what it replaces");
    return;
  }
  // The cached parent is this entry's own parent, so it survives unless it
  // lies below the directory removed.
  if (cached_parent_.size() > path_.size() && cached_parent_.compare(0, path_.size(), path_) == 0 &&
      cached_parent_[path_.size()] == '/')
    cached_fd_.reset();
  forget_directories(path_);
  if (int err = files::remove_tree_at(parent, leaf()))
    fail_errno("remove the directory it replaces", err);
}

void Extractor::forget_directories(const std::string& path) {
  directories_.erase(path);
  const std::string below = path + "/";
  auto it = directories_.lower_bound(below);
  while (it != directories_.end() && it->first.compare(0, below.size(), below) == 0)
    it = directories_.erase(it);
}

void Extractor::make_directory(archive_entry* entry) {
  DirectoryMetadata metadata;
  metadata.mode = mode_of(entry);
  metadata.mtime = mtime_of(entry);
  metadata.from_entry = true;
  if (keeps_owners()) owner_of(entry, &metadata.uid, &metadata.gid);
  if (!path_.empty()) {
    int parent = parent_fd();
    if (::mkdirat(parent, leaf(), 0700) != 0) {
      if (errno != EEXIST) fail_errno("create");
      struct stat st;
      if (::fstatat(parent, leaf(), &st, AT_SYMLINK_NOFOLLOW) != 0) fail_errno("stat");
      if (!S_ISDIR(st.st_mode)) {
        make_room(parent);
        if (::mkdirat(parent, leaf(), 0700) != 0) fail_errno("create");
      }
    }
  }
  directories_.insert_or_assign(path_, metadata);
}

void Extractor::make_file(archive_entry* entry) {
  int parent = parent_fd();
  UniqueFd file(create_replacing(parent, [&] {
    return ::openat(parent, leaf(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  }));
  if (!file) fail_errno("create");
  copy_data(file.get(), entry);
  set_metadata(file.get(), entry, true);
  const int64_t size = archive_entry_size(entry);
  if (size > 0) result_.content_bytes += static_cast<uint64_t>(size);
}

// Writes the entry's data; holes of a sparse entry stay holes.
void Extractor::copy_data(int fd, archive_entry* entry) {
  const void* block;
  size_t size;
  int64_t offset;
  int64_t end = 0;
  while (reader_.data(&block, &size, &offset)) {
    const char* data = static_cast<const char*>(block);
    for (size_t done = 0; done < size;) {
      ssize_t n = ::pwrite(fd, data + done, size - done, offset + static_cast<int64_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : EIO;
        fail_errno("write", err);
      }
      done += static_cast<size_t>(n);
    }
    end = std::max(end, offset + static_cast<int64_t>(size));
  }
  const int64_t size_wanted = archive_entry_size(entry);
  if (end < size_wanted && ::ftruncate(fd, size_wanted) != 0) fail_errno("write");
}

void Extractor::make_symlink(archive_entry* entry) {
  const char* target = archive_entry_symlink(entry);
  if (!target || !*target) refuse("symbolic link without a target");
  if (options_.from_sandbox) check_symlink_target(target);
  int parent = parent_fd();
  if (create_replacing(parent, [&] { return ::symlinkat(target, parent, leaf()); }) != 0)
    fail_errno("create");
  set_link_metadata(parent, entry);
}

void Extractor::make_fifo(archive_entry* entry) {
  int parent = parent_fd();
  if (create_replacing(parent, [&] { return ::mknodat(parent, leaf(), S_IFIFO | 0600, 0); }) != 0)
    fail_errno("create");
  // Opened (without blocking) to set its metadata through the fd: no name
  // lookup that could follow anything.
  UniqueFd fifo(::openat(parent, leaf(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC));
  if (!fifo) fail_errno("open");
  set_metadata(fifo.get(), entry, false);
}

void Extractor::make_hard_link(const char* raw_target) {
  const std::string role = "hard link target " + quoted(raw_target) + " ";
  if (const char* why = normalize(raw_target, &target_))
    refuse(role.substr(0, role.size() - 1) + ": " + why);
  if (target_.empty() || path_.empty()) refuse("hard link to or from the layer's root");
  int parent = parent_fd();

  // The target's directory, resolved as strictly, but never created.
  size_t slash = target_.rfind('/');
  const char* target_leaf = target_.c_str() + (slash == std::string::npos ? 0 : slash + 1);
  int target_dir = dest_.get();
  UniqueFd opened;
  if (slash != std::string::npos) {
    std::string dir = target_.substr(0, slash);
    if (cached_fd_ && dir == cached_parent_) {
      target_dir = cached_fd_.get();
    } else {
      opened.reset(open_beneath(dest_.get(), dir.c_str(), O_PATH | O_DIRECTORY));
      if (!opened) opened = walk(dir, false, role);
      target_dir = opened.get();
    }
  }
  struct stat target_st;
  if (::fstatat(target_dir, target_leaf, &target_st, AT_SYMLINK_NOFOLLOW) != 0) {
    if (errno == ENOENT) refuse(role + "does not exist in this layer");
    fail_errno("stat the hard link target");
  }
  if (S_ISDIR(target_st.st_mode)) refuse(role + "is a directory");
  // linkat without AT_SYMLINK_FOLLOW: a symlink target is linked itself.
  if (::linkat(target_dir, target_leaf, parent, leaf(), 0) == 0) return;
  if (errno != EEXIST) fail_errno("link");
  struct stat existing;
  if (::fstatat(parent, leaf(), &existing, AT_SYMLINK_NOFOLLOW) == 0 &&
      existing.st_dev == target_st.st_dev && existing.st_ino == target_st.st_ino)
    return;  // already that file
  make_room(parent);
  if (::linkat(target_dir, target_leaf, parent, leaf(), 0) != 0) fail_errno("link");
}

// ".wh.NAME": NAME hides what lower layers have there; overlayfs reads that
// from a character device 0:0 (mknod of which needs no privilege since Linux
// 5.8). A name this layer already has stays: whiteouts hide lower layers only.
void Extractor::make_whiteout() {
  std::string_view name = std::string_view(leaf()).substr(4);
  if (name == ".wh..opq") return make_opaque();
  if (name.substr(0, 4) == ".wh.") return;  // aufs's own (".wh..wh.plnk"): nothing for overlayfs
  if (name.empty() || name == "." || name == "..") refuse("not a valid whiteout");
  int parent = parent_fd();
  if (::mknodat(parent, leaf() + 4, S_IFCHR, makedev(0, 0)) != 0 && errno != EEXIST)
    fail_errno("create the whiteout");
}

// ".wh..wh..opq" in D: D hides everything lower layers have below it.
void Extractor::make_opaque() {
  int parent = parent_fd();
  UniqueFd dir(::openat(parent, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) fail_errno("open its directory");
  if (::fsetxattr(dir.get(), "user.overlay.opaque", "y", 1, 0) != 0)
    fail_errno("set user.overlay.opaque on its directory");
}

// A symbolic link out of a sandbox stays inside the top-level entry it came
// with, whatever the names it goes through turn out to be: its target is
// relative, and climbs (with leading ".." only) no higher than that entry.
// A ".." after a name could climb out through a symlink ("l" -> "." makes
// "l/.." the parent), so it is refused.
void Extractor::check_symlink_target(const char* target) const {
  const std::string_view text(target);
  if (leaf_at_ == 0)
    refuse("a top-level symbolic link (only a file or a directory can be downloaded)");
  if (text.front() == '/') refuse("symbolic link to an absolute path (" + quoted(text) + ")");
  // The directories the link's parent lies below, its top-level entry being 1.
  int64_t depth = std::count(path_.begin(), path_.end(), '/');
  bool named = false;
  for (size_t start = 0; start <= text.size();) {
    size_t end = std::min(text.find('/', start), text.size());
    std::string_view part = text.substr(start, end - start);
    if (part == "..") {
      if (named) refuse("symbolic link with '..' after a name (" + quoted(text) + ")");
      if (--depth < 1) refuse("symbolic link out of the download (" + quoted(text) + ")");
    } else if (!part.empty() && part != ".") {
      named = true;
    }
    start = end + 1;
  }
}

// The entry's mode as it is applied: a layer's own; for files out of a
// sandbox, without set-uid, set-gid and sticky bits, less the umask.
mode_t Extractor::mode_of(archive_entry* entry) const {
  const mode_t mode = archive_entry_perm(entry) & 07777;
  return options_.from_sandbox ? mode & 0777 & ~options_.umask : mode;
}

void Extractor::owner_of(archive_entry* entry, uid_t* uid, gid_t* gid) {
  const int64_t u = archive_entry_uid(entry);
  const int64_t g = archive_entry_gid(entry);
  // (uid_t)-1 would mean "unchanged" to chown.
  constexpr int64_t kLimit = 0xffffffffLL;
  if (u < 0 || u >= kLimit) refuse("uid " + std::to_string(u) + " out of range");
  if (g < 0 || g >= kLimit) refuse("gid " + std::to_string(g) + " out of range");
  *uid = static_cast<uid_t>(u);
  *gid = static_cast<gid_t>(g);
}

// Owner, mode, file capabilities, mtime, in that order: chown clears setuid
// bits and capabilities.
void Extractor::set_metadata(int fd, archive_entry* entry, bool regular) {
  if (keeps_owners()) {
    uid_t uid;
    gid_t gid;
    owner_of(entry, &uid, &gid);
    if (::fchown(fd, uid, gid) != 0) fail_errno("chown");
  }
  if (::fchmod(fd, mode_of(entry)) != 0) fail_errno("chmod");
  if (regular && privileged_ && !options_.from_sandbox && archive_entry_xattr_reset(entry) > 0) {
    // Of the archive's extended attributes, only file capabilities; a
    // failure (no support, no privilege) leaves the file without them.
    const char* name;
    const void* value;
    size_t size;
    while (archive_entry_xattr_next(entry, &name, &value, &size) == ARCHIVE_OK)
      if (std::strcmp(name, "security.capability") == 0) ::fsetxattr(fd, name, value, size, 0);
  }
  const timespec times[2] = {mtime_of(entry), mtime_of(entry)};
  if (::futimens(fd, times) != 0) fail_errno("set times");
}

void Extractor::set_link_metadata(int parent, archive_entry* entry) {
  if (keeps_owners()) {
    uid_t uid;
    gid_t gid;
    owner_of(entry, &uid, &gid);
    if (::fchownat(parent, leaf(), uid, gid, AT_SYMLINK_NOFOLLOW) != 0) fail_errno("chown");
  }
  const timespec times[2] = {mtime_of(entry), mtime_of(entry)};
  if (::utimensat(parent, leaf(), times, AT_SYMLINK_NOFOLLOW) != 0) fail_errno("set times");
}

void Extractor::finish_directories() {
  std::vector<std::pair<size_t, const std::pair<const std::string, DirectoryMetadata>*>> order;
  order.reserve(directories_.size());
  for (const auto& item : directories_) {
    const std::string& path = item.first;
    size_t depth = path.empty() ? 0 : 1 + std::count(path.begin(), path.end(), '/');
    order.emplace_back(depth, &item);
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [depth, item] : order) apply_directory(item->first, item->second);
}

void Extractor::apply_directory(const std::string& path, const DirectoryMetadata& metadata) {
  raw_name_ = path;  // for messages
  int fd = dest_.get();
  UniqueFd opened;
  if (!path.empty()) {
    opened.reset(open_beneath(dest_.get(), path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW));
    if (!opened) {
      if (errno == ENOENT || errno == ENOTDIR || errno == ELOOP) return;  // replaced since
      fail_errno("open");
    }
    fd = opened.get();
  }
  if (metadata.from_entry && keeps_owners() && ::fchown(fd, metadata.uid, metadata.gid) != 0)
    fail_errno("chown");
  // A parent the archive does not list gets 0755, less the caller's umask
  // for files out of a sandbox.
  const mode_t mode = !metadata.from_entry && options_.from_sandbox
                          ? metadata.mode & ~options_.umask
                          : metadata.mode;
  if (::fchmod(fd, mode) != 0) fail_errno("chmod");
  if (metadata.from_entry) {
    const timespec times[2] = {metadata.mtime, metadata.mtime};
    if (::futimens(fd, times) != 0) fail_errno("set times");
  }
}

UniqueFd open_empty_directory(const std::string& dest, const std::string& what) {
  UniqueFd dir(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) {
    const int err = errno;
    throw_errno(what + ": open " + dest, err);
  }
  files::EntryReader entries(dir.get());
  if (entries.next()) throw Error(what + ": " + dest + " is not empty");
  if (entries.error()) throw_errno(what + ": read " + dest, entries.error());
  return dir;
}

}  // namespace

UnpackResult unpack_layer(int fd, const std::string& dest, const UnpackOptions& options,
                          const std::string& what) {
  UniqueFd dest_fd = open_empty_directory(dest, what);
  UnpackResult result;
  LayerReader reader(fd, options, what);
  Extractor extractor(std::move(dest_fd), options, what, &reader, &result);
  while (archive_entry* entry = reader.next()) extractor.extract(entry);
  reader.finish(&result);
  extractor.finish_directories();
  return result;
}

}  // namespace openshell::image
