// The unpack driver: each entry of a layer through the extractor.
#include "image/unpack.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "base/error.h"
#include "base/unique_fd.h"
#include "image/unpack_internal.h"

namespace openshell::image {

using namespace unpack_detail;

namespace {

UniqueFd open_empty_directory(const std::string& dest, const std::string& what) {
  UniqueFd dir(::open(dest.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir) {
    const int err = errno;
    throw_errno(what + ": open " + dest, err);
  }
  alignas(8) char buf[4096];
  ssize_t n = ::getdents64(dir.get(), buf, sizeof buf);
  if (n < 0) {
    const int err = errno;
    throw_errno(what + ": read " + dest, err);
  }
  for (ssize_t pos = 0; pos < n;) {
    auto* entry = reinterpret_cast<dirent64*>(buf + pos);
    pos += entry->d_reclen;
    if (!is_dot_or_dotdot(entry->d_name)) throw Error(what + ": " + dest + " is not empty");
  }
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
