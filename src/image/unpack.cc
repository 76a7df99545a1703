// The unpack driver: each entry of a layer through the extractor.
#include "image/unpack.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <utility>

#include "base/directory.h"
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
