#include "vm/initramfs.h"

#include <sys/stat.h>
#include <zlib.h>

#include <cstdio>

#include "base/error.h"
#include "base/files.h"

namespace openshell::vm::initramfs {

namespace {

void hex8(std::string* out, uint64_t value) {
  char buf[9];
  std::snprintf(buf, sizeof buf, "%08X", static_cast<unsigned>(value));
  out->append(buf, 8);
}

void pad4(std::string* out) {
  while (out->size() % 4 != 0) out->push_back('\0');
}

void check_path(const std::string& path) {
  if (path.empty() || path.size() > 4095 || path.front() == '/')
    throw Error("initramfs: bad entry path \"" + path + "\" (empty, absolute or too long)");
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    std::string_view part(path.data() + start, end - start);
    if (part.empty() || part == "." || part == "..")
      throw Error("initramfs: bad entry path \"" + path + "\" (empty, \".\" or \"..\" part)");
    start = end + 1;
  }
}

void record(std::string* out, uint32_t ino, uint32_t mode, uint32_t uid, uint32_t gid,
            uint32_t nlink, std::string_view name, std::string_view data, uint32_t rdev_major = 0,
            uint32_t rdev_minor = 0) {
  out->append("070701");
  hex8(out, ino);
  hex8(out, mode);
  hex8(out, uid);
  hex8(out, gid);
  hex8(out, nlink);
  hex8(out, 0);  // mtime: 0, so the same inputs give the same bytes
  hex8(out, data.size());
  hex8(out, 0);  // devmajor
  hex8(out, 0);  // devminor
  hex8(out, rdev_major);
  hex8(out, rdev_minor);
  hex8(out, name.size() + 1);
  hex8(out, 0);  // check
  out->append(name);
  out->push_back('\0');
  pad4(out);
  out->append(data);
  pad4(out);
}

}  // namespace

std::string write(const std::vector<Entry>& entries) {
  std::string out;
  uint32_t ino = 1;
  for (const Entry& e : entries) {
    check_path(e.path);
    if (e.data.size() > 0xffffffffULL)
      throw Error("initramfs: entry \"" + e.path + "\" is over 4 GiB");
    uint32_t mode = e.mode & 07777;
    uint32_t nlink = 1;
    std::string_view data = e.data;
    switch (e.type) {
      case Entry::Type::kDirectory:
        mode |= S_IFDIR;
        nlink = 2;
        data = {};
        break;
      case Entry::Type::kFile:
        mode |= S_IFREG;
        break;
      case Entry::Type::kSymlink:
        mode = S_IFLNK | 0777;
        break;
      case Entry::Type::kCharDevice:
        mode |= S_IFCHR;
        data = {};
        break;
    }
    record(&out, ino++, mode, e.uid, e.gid, nlink, e.path, data, e.dev_major, e.dev_minor);
  }
  record(&out, 0, 0, 0, 0, 1, "TRAILER!!!", {});
  return out;
}

std::string gzip(std::string_view bytes) {
  z_stream z{};
  // windowBits 15 + 16: a gzip header and trailer rather than zlib's.
  if (deflateInit2(&z, Z_BEST_COMPRESSION, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
    throw Error("initramfs: gzip: deflateInit2 failed");
  std::string out;
  out.resize(deflateBound(&z, bytes.size()) + 64);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(bytes.data()));
  z.avail_in = static_cast<uInt>(bytes.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&z, Z_FINISH);
  size_t produced = z.total_out;
  deflateEnd(&z);
  if (rc != Z_STREAM_END) throw Error("initramfs: gzip: deflate failed");
  out.resize(produced);
  return out;
}

namespace {

std::vector<Entry> init_entries(const std::string& init_binary) {
  using T = Entry::Type;
  std::vector<Entry> entries = {
      {T::kDirectory, "dev", 0755, {}}, {T::kDirectory, "proc", 0555, {}},
      {T::kDirectory, "sys", 0555, {}}, {T::kDirectory, "mnt", 0755, {}},
      {T::kDirectory, "etc", 0755, {}}, {T::kFile, "init", 0755, files::read(init_binary)},
  };
  Entry console{T::kCharDevice, "dev/console", 0600, {}};
  console.dev_major = 5;
  console.dev_minor = 1;
  entries.insert(entries.begin() + 1, console);
  return entries;
}

Entry config_entry(std::string_view guest_config) {
  return {Entry::Type::kFile, std::string(kConfigPath), 0600, std::string(guest_config)};
}

}  // namespace

std::string for_guest(const std::string& init_binary, std::string_view guest_config,
                      bool compress) {
  std::vector<Entry> entries = init_entries(init_binary);
  entries.push_back(config_entry(guest_config));
  std::string archive = write(entries);
  return compress ? gzip(archive) : archive;
}

std::string init_archive(const std::string& init_binary) {
  return write(init_entries(init_binary));
}

std::string config_archive(std::string_view guest_config) {
  return write({{Entry::Type::kDirectory, "etc", 0755, {}}, config_entry(guest_config)});
}

}  // namespace openshell::vm::initramfs
