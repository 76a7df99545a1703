// A directory tree -> a PAX tar (libarchive) -> gzip (zlib) -> a file, both
// digests taken on the way.
#include "image/layer_writer.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <map>
#include <memory>
#include <utility>

#include <archive.h>
#include <archive_entry.h>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "image/digest.h"

namespace openshell::image {

uint32_t map_id(const std::vector<IdRange>& map, uint32_t host_id) {
  if (map.empty()) return host_id;
  for (const auto& r : map)
    if (host_id >= r.host && host_id - r.host < r.count) return r.inside + (host_id - r.host);
  return 65534;
}

namespace {

constexpr uint64_t kProgressStep = 256 * 1024;

// Uncompressed bytes in: hashed, deflated into gzip, hashed again, written.
class GzipSink {
 public:
  GzipSink(int fd, std::function<void(uint64_t)> progress)
      : fd_(fd), progress_(std::move(progress)) {
    // windowBits 15+16: a gzip wrapper; its header carries no time or name.
    if (deflateInit2(&z_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) !=
        Z_OK)
      throw Error("gzip: cannot start the compressor");
  }
  ~GzipSink() { deflateEnd(&z_); }

  // false with error() set on failure (libarchive's callbacks may not throw).
  bool write(const void* data, size_t size) {
    tar_hash_.update(data, size);
    z_.next_in = static_cast<Bytef*>(const_cast<void*>(data));
    z_.avail_in = static_cast<uInt>(size);
    if (!pump(Z_NO_FLUSH)) return false;
    if (progress_ && tar_hash_.bytes() >= next_report_) {
      progress_(tar_hash_.bytes());
      next_report_ = tar_hash_.bytes() + kProgressStep;
    }
    return true;
  }
  bool finish() {
    z_.next_in = nullptr;
    z_.avail_in = 0;
    if (!pump(Z_FINISH)) return false;
    if (progress_) progress_(tar_hash_.bytes());
    return true;
  }

  const std::string& error() const { return error_; }
  uint64_t tar_size() const { return tar_hash_.bytes(); }
  uint64_t blob_size() const { return blob_hash_.bytes(); }
  std::string diff_id() { return tar_hash_.digest(); }
  std::string digest() { return blob_hash_.digest(); }

 private:
  bool pump(int flush) {
    unsigned char out[65536];
    for (;;) {
      z_.next_out = out;
      z_.avail_out = sizeof out;
      const int rc = deflate(&z_, flush);
      if (rc == Z_STREAM_ERROR) {
        error_ = "gzip: compression failed";
        return false;
      }
      const size_t produced = sizeof out - z_.avail_out;
      if (produced > 0) {
        blob_hash_.update(out, produced);
        if (!files::write_all(fd_, std::string_view(reinterpret_cast<char*>(out), produced))) {
          error_ = errno_message("write the layer", errno);
          return false;
        }
      }
      if (flush == Z_FINISH ? rc == Z_STREAM_END : z_.avail_out != 0) return true;
    }
  }

  int fd_;
  std::function<void(uint64_t)> progress_;
  z_stream z_{};
  Sha256 tar_hash_, blob_hash_;
  uint64_t next_report_ = kProgressStep;
  std::string error_;
};

la_ssize_t write_callback(archive* a, void* client, const void* buffer, size_t length) {
  auto* sink = static_cast<GzipSink*>(client);
  if (!sink->write(buffer, length)) {
    archive_set_error(a, EIO, "%s", sink->error().c_str());
    return -1;
  }
  return static_cast<la_ssize_t>(length);
}

struct ArchiveFree {
  void operator()(archive* a) const { archive_write_free(a); }
};
struct EntryFree {
  void operator()(archive_entry* e) const { archive_entry_free(e); }
};

class Writer {
 public:
  Writer(archive* a, const LayerWriteOptions& options, const std::string& what)
      : a_(a), options_(options), what_(what) {}

  // The contents of the directory open as dir_fd, named below `prefix`.
  void write_tree(int dir_fd, const std::string& prefix) {
    std::vector<std::string> names;
    if (int err = files::for_each_entry(dir_fd, [&](const char* name, unsigned char) {
          names.emplace_back(name);
          return true;
        }))
      fail(prefix.empty() ? "." : prefix, errno_message("read directory", err));
    std::sort(names.begin(), names.end());
    for (const auto& name : names) write_entry(dir_fd, name, join(prefix, name));
  }

  // A directory's own entry (for a LayerSource with a prefix).
  void write_directory_entry(int dir_fd, const std::string& path) {
    struct stat st;
    if (::fstat(dir_fd, &st) != 0) fail(path, errno_message("stat", errno));
    header(path, st, AE_IFDIR, 0);
    if (is_opaque(dir_fd)) marker(path + "/.wh..wh..opq", st);
  }

  const LayerBlob& counts() const { return counts_; }

 private:
  static std::string join(const std::string& prefix, const std::string& name) {
    return prefix.empty() ? name : prefix + "/" + name;
  }

  [[noreturn]] void fail(const std::string& path, const std::string& reason) const {
    throw Error(what_ + ": '" + path + "': " + reason);
  }

  void write_entry(int parent, const std::string& name, const std::string& path) {
    if (name.compare(0, 4, ".wh.") == 0)
      fail(path, "a name starting with .wh. would read as a whiteout");
    struct stat st;
    if (::fstatat(parent, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
      fail(path, errno_message("stat", errno));
    switch (st.st_mode & S_IFMT) {
      case S_IFDIR: {
        UniqueFd dir(
            ::openat(parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!dir) fail(path, errno_message("open", errno));
        write_directory_entry(dir.get(), path);
        write_tree(dir.get(), path);
        return;
      }
      case S_IFREG:
        return write_file(parent, name, path, st);
      case S_IFLNK:
        return write_symlink(parent, name, path, st);
      case S_IFIFO:
        if (hard_link(path, st)) return;
        return header(path, st, AE_IFIFO, 0);
      case S_IFCHR:
        if (major(st.st_rdev) == 0 && minor(st.st_rdev) == 0) {
          const size_t slash = path.rfind('/');
          const std::string dir = slash == std::string::npos ? "" : path.substr(0, slash + 1);
          return marker(dir + ".wh." + name, st);
        }
        fail(path, "character device (device nodes are not allowed in a layer)");
      case S_IFBLK:
        fail(path, "block device (device nodes are not allowed in a layer)");
      case S_IFSOCK:
        return;  // nothing unpacks a socket: a live process's, not content
      default:
        fail(path, "unknown file type");
    }
  }

  bool is_opaque(int dir_fd) const {
    for (const char* attr : {"user.overlay.opaque", "trusted.overlay.opaque"}) {
      char value[2] = {0, 0};
      if (::fgetxattr(dir_fd, attr, value, sizeof value) == 1 && value[0] == 'y') return true;
    }
    return false;
  }

  std::unique_ptr<archive_entry, EntryFree> entry_for(const std::string& path,
                                                      const struct stat& st, unsigned type) {
    std::unique_ptr<archive_entry, EntryFree> e(archive_entry_new());
    archive_entry_set_pathname(e.get(), path.c_str());
    archive_entry_set_filetype(e.get(), type);
    archive_entry_set_perm(e.get(), st.st_mode & 07777);
    archive_entry_set_uid(e.get(), map_id(options_.uid_map, st.st_uid));
    archive_entry_set_gid(e.get(), map_id(options_.gid_map, st.st_gid));
    archive_entry_set_mtime(e.get(), st.st_mtim.tv_sec, 0);
    return e;
  }

  void put_header(archive_entry* e, const std::string& path) {
    ++counts_.entries;
    if (archive_write_header(a_, e) != ARCHIVE_OK)
      fail(path, std::string("write: ") + archive_error_string(a_));
  }

  void header(const std::string& path, const struct stat& st, unsigned type, int64_t size) {
    auto e = entry_for(path, st, type);
    archive_entry_set_size(e.get(), size);
    put_header(e.get(), path);
  }

  // An empty regular file standing for a whiteout or an opaque directory.
  void marker(const std::string& path, const struct stat& st) {
    struct stat plain = st;
    plain.st_mode = S_IFREG | 0600;
    header(path, plain, AE_IFREG, 0);
  }

  // A later name for an inode already written: a hard link to the first.
  bool hard_link(const std::string& path, const struct stat& st) {
    if (st.st_nlink < 2) return false;
    auto [it, first] = inodes_.try_emplace({st.st_dev, st.st_ino}, path);
    if (first) return false;
    auto e = entry_for(path, st, AE_IFREG);
    archive_entry_set_hardlink(e.get(), it->second.c_str());
    archive_entry_set_size(e.get(), 0);
    put_header(e.get(), path);
    return true;
  }

  void write_symlink(int parent, const std::string& name, const std::string& path,
                     const struct stat& st) {
    if (hard_link(path, st)) return;
    std::string target(static_cast<size_t>(st.st_size) + 1, '\0');
    const ssize_t n = ::readlinkat(parent, name.c_str(), target.data(), target.size());
    if (n < 0) fail(path, errno_message("read link", errno));
    if (static_cast<size_t>(n) >= target.size()) fail(path, "link changed while read");
    target.resize(static_cast<size_t>(n));
    auto e = entry_for(path, st, AE_IFLNK);
    archive_entry_set_symlink(e.get(), target.c_str());
    put_header(e.get(), path);
  }

  void write_file(int parent, const std::string& name, const std::string& path,
                  const struct stat& st) {
    if (hard_link(path, st)) return;
    UniqueFd file(::openat(parent, name.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!file) fail(path, errno_message("open", errno));
    struct stat now;
    if (::fstat(file.get(), &now) != 0) fail(path, errno_message("stat", errno));
    if (!S_ISREG(now.st_mode) || now.st_ino != st.st_ino) fail(path, "changed while read");
    auto e = entry_for(path, now, AE_IFREG);
    archive_entry_set_size(e.get(), now.st_size);
    char cap[256];
    const ssize_t cap_size = ::fgetxattr(file.get(), "security.capability", cap, sizeof cap);
    if (cap_size > 0)
      archive_entry_xattr_add_entry(e.get(), "security.capability", cap,
                                    static_cast<size_t>(cap_size));
    put_header(e.get(), path);
    // Exactly the size the header promised, even if the file changes now.
    std::vector<char> buf(1 << 16);
    int64_t left = now.st_size;
    while (left > 0) {
      ssize_t n = ::read(file.get(), buf.data(), std::min<size_t>(buf.size(), left));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) fail(path, errno_message("read", errno));
      if (n == 0) {  // shrunk: pad with zeros
        std::fill(buf.begin(), buf.end(), 0);
        n = static_cast<ssize_t>(std::min<int64_t>(static_cast<int64_t>(buf.size()), left));
      }
      if (archive_write_data(a_, buf.data(), static_cast<size_t>(n)) != n)
        fail(path, std::string("write: ") + archive_error_string(a_));
      left -= n;
    }
    counts_.content_bytes += static_cast<uint64_t>(now.st_size);
  }

  archive* a_;
  const LayerWriteOptions& options_;
  const std::string& what_;
  std::map<std::pair<dev_t, ino_t>, std::string> inodes_;
  LayerBlob counts_;
};

}  // namespace

LayerBlob write_layer(const std::vector<LayerSource>& sources, int out_fd,
                      const LayerWriteOptions& options, const std::string& what) {
  GzipSink sink(out_fd, options.progress);
  std::unique_ptr<archive, ArchiveFree> a(archive_write_new());
  if (!a) throw Error(what + ": cannot start the tar writer");
  if (archive_write_set_format_pax_restricted(a.get()) != ARCHIVE_OK ||
      archive_write_add_filter_none(a.get()) != ARCHIVE_OK ||
      archive_write_open(a.get(), &sink, nullptr, write_callback, nullptr) != ARCHIVE_OK)
    throw Error(what + ": " + archive_error_string(a.get()));
  Writer writer(a.get(), options, what);
  for (const auto& source : sources) {
    UniqueFd dir(::open(source.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!dir) throw_errno(what + ": open " + source.dir);
    if (!source.prefix.empty()) writer.write_directory_entry(dir.get(), source.prefix);
    writer.write_tree(dir.get(), source.prefix);
  }
  if (archive_write_close(a.get()) != ARCHIVE_OK)
    throw Error(what + ": " + archive_error_string(a.get()));
  if (!sink.finish()) throw Error(what + ": " + sink.error());
  LayerBlob blob = writer.counts();
  blob.tar_size = sink.tar_size();
  blob.size = sink.blob_size();
  blob.diff_id = sink.diff_id();
  blob.digest = sink.digest();
  return blob;
}

}  // namespace openshell::image
