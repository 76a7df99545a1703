// Whiteouts: an image layer's .wh. names turned into what overlayfs reads.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include <cerrno>
#include <string>
#include <string_view>

#include "base/unique_fd.h"
#include "image/unpack_internal.h"

namespace openshell::image::unpack_detail {

// Where a ".wh." component starts in the current entry's parent path, or
// npos: such a name is never created, so nothing can be below it.
size_t Extractor::whiteout_above() const {
  for (size_t at = path_.find(".wh."); at != std::string::npos && at < leaf_at_;
       at = path_.find(".wh.", at + 1))
    if (at == 0 || path_[at - 1] == '/') return at;
  return std::string::npos;
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

}  // namespace openshell::image::unpack_detail
