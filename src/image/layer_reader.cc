// Reading a layer: decompressed, parsed as tar, both streams hashed.
// The compression (none, gzip, zstd) is recognised from the first bytes.
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <exception>
#include <string>

#include "base/error.h"
#include "image/unpack_internal.h"

namespace openshell::image::unpack_detail {

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

}  // namespace openshell::image::unpack_detail
