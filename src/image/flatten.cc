#include "image/flatten.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "base/directory.h"
#include "base/error.h"
#include "base/unique_fd.h"

namespace openshell::image {

namespace {

struct DirMeta {
  mode_t mode;
  uid_t uid;
  gid_t gid;
  timespec times[2];
};

class Flattener {
 public:
  explicit Flattener(std::string dest) : dest_(std::move(dest)), root_(::geteuid() == 0) {}

  void layer(const std::string& layer) {
    UniqueFd from(::open(layer.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!from) throw_errno("open layer " + layer);
    UniqueFd to(::open(dest_.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!to) throw_errno("open " + dest_);
    merge(from.get(), to.get(), "");
  }

  // Directories get their modes, owners and times last, deepest first.
  void finish() {
    for (auto it = dirs_.rbegin(); it != dirs_.rend(); ++it) {
      const std::string path = it->first.empty() ? dest_ : dest_ + "/" + it->first;
      const DirMeta& m = it->second;
      if (root_) ::lchown(path.c_str(), m.uid, m.gid);
      ::chmod(path.c_str(), m.mode & 07777);
      ::utimensat(AT_FDCWD, path.c_str(), m.times, AT_SYMLINK_NOFOLLOW);
    }
  }

  uint64_t bytes() const { return bytes_; }

 private:
  std::string where(const std::string& rel) const { return dest_ + "/" + rel; }

  void remove_entry(int dirfd, const char* name, const std::string& rel) {
    if (int err = files::remove_tree_at(dirfd, name)) throw files::removal_error(where(rel), err);
    // It and what was below it need no metadata any more.
    for (auto it = dirs_.lower_bound(rel);
         it != dirs_.end() && it->first.compare(0, rel.size(), rel) == 0;) {
      if (it->first.size() == rel.size() || it->first[rel.size()] == '/')
        it = dirs_.erase(it);
      else
        ++it;
    }
  }

  void clear(int dirfd, const std::string& rel) {
    for (const auto& name : entries(dirfd)) remove_entry(dirfd, name.c_str(), rel + "/" + name);
  }

  static std::vector<std::string> entries(int dirfd) {
    std::vector<std::string> names;
    const int err = files::for_each_entry(dirfd, [&names](const char* name, unsigned char) {
      names.emplace_back(name);
      return true;
    });
    if (err) throw_errno("read a directory", err);
    return names;
  }

  void copy_file(int from_dir, const char* name, int to_dir, const struct stat& st,
                 const std::string& rel) {
    UniqueFd in(::openat(from_dir, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
    if (!in) throw_errno("read " + rel);
    UniqueFd out(
        ::openat(to_dir, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out) throw_errno("create " + where(rel));
    for (off_t left = st.st_size; left > 0;) {
      ssize_t n =
          ::copy_file_range(in.get(), nullptr, out.get(), nullptr, static_cast<size_t>(left), 0);
      if (n < 0 && (errno == EXDEV || errno == ENOSYS || errno == EOPNOTSUPP || errno == EINVAL)) {
        char buf[1 << 16];
        n = ::read(in.get(), buf, sizeof buf);
        if (n > 0 && ::write(out.get(), buf, static_cast<size_t>(n)) != n) n = -1;
      }
      if (n < 0) throw_errno("copy " + where(rel));
      if (n == 0) break;
      left -= n;
      bytes_ += static_cast<uint64_t>(n);
    }
    if (root_ && ::fchown(out.get(), st.st_uid, st.st_gid) != 0) throw_errno("chown " + where(rel));
    if (::fchmod(out.get(), st.st_mode & 07777) != 0) throw_errno("chmod " + where(rel));
    timespec times[2] = {st.st_atim, st.st_mtim};
    ::futimens(out.get(), times);
  }

  void merge(int from_dir, int to_dir, const std::string& prefix) {
    for (const auto& entry : entries(from_dir)) {
      const char* name = entry.c_str();
      const std::string rel = prefix.empty() ? entry : prefix + "/" + entry;
      struct stat st;
      if (::fstatat(from_dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0) throw_errno("stat " + rel);
      struct stat existing;
      const bool exists = ::fstatat(to_dir, name, &existing, AT_SYMLINK_NOFOLLOW) == 0;
      if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {  // a whiteout
        if (exists) remove_entry(to_dir, name, rel);
        continue;
      }
      if (S_ISDIR(st.st_mode)) {
        UniqueFd sub_from(
            ::openat(from_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub_from) throw_errno("open " + rel);
        char opaque[2] = {0, 0};
        const bool is_opaque =
            ::fgetxattr(sub_from.get(), "user.overlay.opaque", opaque, 1) == 1 && opaque[0] == 'y';
        if (exists && !S_ISDIR(existing.st_mode)) remove_entry(to_dir, name, rel);
        if (!exists || !S_ISDIR(existing.st_mode)) {
          if (::mkdirat(to_dir, name, 0700) != 0) throw_errno("create " + where(rel));
        }
        UniqueFd sub_to(::openat(to_dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
        if (!sub_to) throw_errno("open " + where(rel));
        ::fchmod(sub_to.get(), 0700);
        if (exists && S_ISDIR(existing.st_mode) && is_opaque) clear(sub_to.get(), rel);
        dirs_[rel] = DirMeta{st.st_mode, st.st_uid, st.st_gid, {st.st_atim, st.st_mtim}};
        merge(sub_from.get(), sub_to.get(), rel);
        continue;
      }
      if (exists) remove_entry(to_dir, name, rel);
      if (S_ISREG(st.st_mode)) {
        copy_file(from_dir, name, to_dir, st, rel);
      } else if (S_ISLNK(st.st_mode)) {
        char target[4096];
        ssize_t n = ::readlinkat(from_dir, name, target, sizeof target - 1);
        if (n < 0) throw_errno("read link " + rel);
        target[n] = '\0';
        if (::symlinkat(target, to_dir, name) != 0) throw_errno("create " + where(rel));
        if (root_) ::fchownat(to_dir, name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
        timespec times[2] = {st.st_atim, st.st_mtim};
        ::utimensat(to_dir, name, times, AT_SYMLINK_NOFOLLOW);
      } else if (S_ISFIFO(st.st_mode)) {
        if (::mkfifoat(to_dir, name, st.st_mode & 07777) != 0) throw_errno("create " + where(rel));
        if (root_) ::fchownat(to_dir, name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
      }
      // Sockets and device nodes are not part of a root file system here.
    }
  }

  std::string dest_;
  bool root_;
  std::map<std::string, DirMeta> dirs_;
  uint64_t bytes_ = 0;
};

}  // namespace

uint64_t flatten_layers(const std::vector<std::string>& layers_bottom_first,
                        const std::string& dest) {
  Flattener f(dest);
  for (const auto& layer : layers_bottom_first) f.layer(layer);
  f.finish();
  // The root: readable by all, as an image's / is.
  ::chmod(dest.c_str(), 0755);
  return f.bytes();
}

}  // namespace openshell::image
