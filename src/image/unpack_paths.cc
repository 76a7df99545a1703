// Names inside a layer: normalised, quoted, opened beneath dest.
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <string>
#include <string_view>

#include "image/unpack_internal.h"

namespace openshell::image {
namespace unpack_detail {

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

}  // namespace unpack_detail
}  // namespace openshell::image
