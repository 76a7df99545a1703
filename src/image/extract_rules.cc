// What a layer's entry may be and carry: link targets, modes, owners, metadata.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "base/error.h"
#include "image/unpack_internal.h"

namespace openshell::image::unpack_detail {

timespec mtime_of(archive_entry* entry) {
  timespec t{};
  t.tv_sec = archive_entry_mtime(entry);
  long nsec = archive_entry_mtime_nsec(entry);
  t.tv_nsec = nsec >= 0 && nsec < 1000000000 ? nsec : 0;
  return t;
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

}  // namespace openshell::image::unpack_detail
