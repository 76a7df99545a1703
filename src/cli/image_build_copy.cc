// COPY and ADD of `image build`: sources looked up inside the build context
// only (openat2 with RESOLVE_BENEATH: neither "..", an absolute path nor a
// symbolic link leads out of it), .dockerignore honoured, copied into a
// fresh directory that becomes the step's layer, with the digest the cache
// keys the step by.
#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/directory.h"
#include "base/error.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "cli/image_build.h"
#include "image/digest.h"
#include "image/unpack.h"

namespace openshell::cli::build {

namespace {

// openat2 beneath `root`: EXDEV when the path or a link in it leads out.
int open_beneath(int root, const std::string& path, int flags) {
  open_how how{};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
  for (;;) {
    long fd = ::syscall(SYS_openat2, root, path.c_str(), &how, sizeof how);
    if (fd >= 0) return static_cast<int>(fd);
    if (errno != EAGAIN && errno != EINTR) return -1;
  }
}

bool has_glob(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

// ADD unpacks these (the unpacker's formats: tar, gzip, zstd).
bool unpackable_archive(const std::string& name) {
  for (const char* ext : {".tar", ".tar.gz", ".tgz", ".tar.zst", ".tzst"})
    if (name.ends_with(ext)) return true;
  return false;
}

// Archives Docker's ADD would unpack and this one cannot.
bool other_archive(const std::string& name) {
  for (const char* ext : {".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.lz4"})
    if (name.ends_with(ext)) return true;
  return false;
}

class Copier {
 public:
  Copier(const Workspace& ws, const std::string& what, std::optional<mode_t> chmod)
      : ws_(ws), what_(what), chmod_(chmod) {}

  // Copies source (an fd of the context's entry at `rel`) to `dest_fd`/name.
  void copy(int src_fd, const std::string& rel, int dest_parent, const std::string& name,
            const std::string& shown) {
    struct stat st;
    if (::fstat(src_fd, &st) != 0) throw_errno(what_ + ": " + shown);
    hash_entry(shown, st, "");
    if (S_ISDIR(st.st_mode)) {
      if (::mkdirat(dest_parent, name.c_str(), 0700) != 0 && errno != EEXIST)
        throw_errno(what_ + ": create " + shown);
      UniqueFd dir(
          ::openat(dest_parent, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (!dir) throw_errno(what_ + ": open " + shown);
      copy_contents(src_fd, rel, dir.get(), shown);
      ::fchmod(dir.get(), mode_of(st));
      set_time(dir.get(), st);
    } else if (S_ISREG(st.st_mode)) {
      copy_file(src_fd, dest_parent, name, st, shown);
    } else {
      throw Error(what_ + ": " + shown + ": not a regular file or a directory");
    }
  }

  // Everything in src_dir (the context's `rel`) into dest_dir, in name order.
  void copy_contents(int src_dir, const std::string& rel, int dest_dir, const std::string& shown) {
    std::vector<std::string> names;
    {
      UniqueFd again(::openat(src_dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      if (!again) throw_errno(what_ + ": open " + shown);
      DIR* d = ::fdopendir(again.release());
      if (!d) throw_errno(what_ + ": read " + shown);
      while (dirent* e = ::readdir(d)) {
        std::string n = e->d_name;
        if (n != "." && n != "..") names.push_back(n);
      }
      ::closedir(d);
    }
    std::sort(names.begin(), names.end());
    for (const auto& n : names) {
      const std::string child_rel = rel.empty() ? n : rel + "/" + n;
      if (ws_.ignore.excluded(child_rel)) continue;
      const std::string child_shown = shown + "/" + n;
      struct stat st;
      if (::fstatat(src_dir, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0)
        throw_errno(what_ + ": " + child_shown);
      if (S_ISLNK(st.st_mode)) {
        // Kept as a link, never followed: it is the image's to resolve.
        char target[4096];
        ssize_t len = ::readlinkat(src_dir, n.c_str(), target, sizeof target - 1);
        if (len < 0) throw_errno(what_ + ": " + child_shown);
        target[len] = 0;
        hash_entry(child_shown, st, target);
        if (::symlinkat(target, dest_dir, n.c_str()) != 0)
          throw_errno(what_ + ": link " + child_shown);
        continue;
      }
      if (!S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode)) continue;  // sockets, fifos, devices
      UniqueFd child(::openat(src_dir, n.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
      if (!child) throw_errno(what_ + ": " + child_shown);
      copy(child.get(), child_rel, dest_dir, n, child_shown);
    }
  }

  // ADD of a local archive: unpacked into dest_path (a directory of the
  // staged tree) as a plain archive (no whiteouts, owners the caller's,
  // nothing outside dest_path).
  void unpack(int src_fd, const std::string& dest_path, const std::string& shown) {
    image::UnpackOptions options;
    options.preserve_owners = false;
    options.whiteouts = false;
    image::UnpackResult r = image::unpack_layer(src_fd, dest_path, options, what_ + ": " + shown);
    sha_.update("archive\0" + shown + '\0' + r.compressed_digest + '\n');
  }

  std::string digest() { return sha_.digest(); }

 private:
  void copy_file(int src_fd, int dest_parent, const std::string& name, const struct stat& st,
                 const std::string& shown) {
    ::unlinkat(dest_parent, name.c_str(), 0);
    UniqueFd out(::openat(dest_parent, name.c_str(),
                          O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!out) throw_errno(what_ + ": create " + shown);
    image::Sha256 content;
    char buf[65536];
    for (;;) {
      ssize_t n = ::read(src_fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw_errno(what_ + ": read " + shown);
      if (n == 0) break;
      content.update(buf, static_cast<size_t>(n));
      if (::write(out.get(), buf, static_cast<size_t>(n)) != n)
        throw_errno(what_ + ": write " + shown);
    }
    sha_.update(content.digest() + "\n");
    ::fchmod(out.get(), mode_of(st));
    set_time(out.get(), st);
  }

  mode_t mode_of(const struct stat& st) const { return chmod_ ? *chmod_ : st.st_mode & 07777; }

  static void set_time(int fd, const struct stat& st) {
    timespec times[2] = {st.st_atim, st.st_mtim};
    ::futimens(fd, times);
  }

  void hash_entry(const std::string& shown, const struct stat& st, const std::string& target) {
    const char type = S_ISDIR(st.st_mode) ? 'd' : S_ISLNK(st.st_mode) ? 'l' : 'f';
    sha_.update(shown + '\0' + type + '\0' + std::to_string(st.st_mode & 07777) + '\0' +
                std::to_string(S_ISREG(st.st_mode) ? st.st_size : 0) + '\0' + target + '\n');
  }

  const Workspace& ws_;
  std::string what_;
  std::optional<mode_t> chmod_;
  image::Sha256 sha_;
};

// The directory for `dir` (absolute, in the image) under staged, made.
UniqueFd make_dirs(const std::string& staged, const std::string& dir, const std::string& what) {
  UniqueFd fd(::open(staged.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) throw_errno(what + ": open " + staged);
  for (const auto& part : text::split(dir, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") throw Error(what + ": " + dir + ": a destination with '..'");
    if (::mkdirat(fd.get(), part.c_str(), 0755) != 0 && errno != EEXIST)
      throw_errno(what + ": create " + dir);
    UniqueFd next(
        ::openat(fd.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) throw_errno(what + ": open " + dir);
    fd = std::move(next);
  }
  return fd;
}

// The names in a directory (fd), "." and ".." left out.
std::vector<std::string> names_in(int dir_fd) {
  std::vector<std::string> names;
  UniqueFd again(::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  DIR* d = again ? ::fdopendir(again.release()) : nullptr;
  if (!d) throw_errno("read a staged directory");
  while (dirent* e = ::readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  ::closedir(d);
  return names;
}

bool is_empty_dir(int dir_fd) { return names_in(dir_fd).empty(); }

// A source as written -> its path relative to the context; refuses one
// that leads out of it.
std::string relative_source(const std::string& source, const std::string& what) {
  if (source.find("://") != std::string::npos)
    throw Error(what + ": " + source +
                ": URLs are not supported (only files of the build context)");
  if (!source.empty() && source[0] == '/')
    throw Error(what + ": " + source +
                ": an absolute source (sources are relative to the build context)");
  std::vector<std::string> parts;
  for (const auto& part : text::split(source, '/')) {
    if (part.empty() || part == ".") continue;
    if (part == "..") {
      if (parts.empty()) throw Error(what + ": " + source + ": outside the build context");
      parts.pop_back();
      continue;
    }
    parts.push_back(part);
  }
  return text::join(parts, "/");
}

}  // namespace

Staged stage_copy(const Workspace& ws, const std::vector<std::string>& sources,
                  const std::string& dest, const std::string& what, bool add,
                  std::optional<mode_t> chmod) {
  UniqueFd root(::open(ws.context.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root) throw_errno("open the build context " + ws.context);

  // Sources, wildcards in their last part expanded (in name order).
  std::vector<std::string> rels;
  for (const auto& source : sources) {
    std::string rel = relative_source(source, what);
    const size_t slash = rel.rfind('/');
    const std::string leaf = slash == std::string::npos ? rel : rel.substr(slash + 1);
    if (!has_glob(leaf)) {
      rels.push_back(rel);
      continue;
    }
    const std::string parent = slash == std::string::npos ? "" : rel.substr(0, slash);
    UniqueFd dir(open_beneath(root.get(), parent.empty() ? "." : parent, O_RDONLY | O_DIRECTORY));
    if (!dir) throw_errno(what + ": " + source);
    std::vector<std::string> found;
    DIR* d = ::fdopendir(dir.release());
    if (!d) throw_errno(what + ": " + source);
    while (dirent* e = ::readdir(d)) {
      std::string n = e->d_name;
      const std::string r = parent.empty() ? n : parent + "/" + n;
      if (n != "." && n != ".." && image::glob_match(leaf, n) && !ws.ignore.excluded(r))
        found.push_back(r);
    }
    ::closedir(d);
    if (found.empty()) throw Error(what + ": " + source + ": no file of the build context matches");
    std::sort(found.begin(), found.end());
    rels.insert(rels.end(), found.begin(), found.end());
  }
  const bool dir_dest = dest.ends_with("/") || rels.size() > 1;

  int unpacked = 0;
  Staged staged;
  staged.dir = ws.store->make_temp_dir();
  try {
    Copier copier(ws, what, chmod);
    for (const auto& rel : rels) {
      const std::string shown = rel.empty() ? "." : rel;
      if (!rel.empty() && ws.ignore.excluded(rel))
        throw Error(what + ": " + shown + ": not in the build context (.dockerignore excludes it)");
      UniqueFd src(open_beneath(root.get(), rel.empty() ? "." : rel, O_RDONLY));
      if (!src && errno == EXDEV)
        throw Error(what + ": " + shown +
                    ": leads outside the build context (through a symbolic link or \"..\")");
      if (!src && errno == ENOENT)
        throw Error(what + ": " + shown + ": no such file in the build context");
      if (!src) throw_errno(what + ": " + shown);
      struct stat st;
      if (::fstat(src.get(), &st) != 0) throw_errno(what + ": " + shown);
      if (add && S_ISREG(st.st_mode) && other_archive(rel))
        throw Error(what + ": " + shown +
                    ": ADD unpacks tar archives, gzip- or zstd-compressed, only (COPY it and RUN "
                    "tar -x)");
      if (add && S_ISREG(st.st_mode) && unpackable_archive(rel)) {
        // Unpacked into the destination, a directory.
        UniqueFd target = make_dirs(staged.dir, dest, what);
        const std::string target_path = staged.dir + text::normalize_path("/" + dest);
        if (is_empty_dir(target.get())) {
          copier.unpack(src.get(), target_path, shown);
          continue;
        }
        // The unpacker wants an empty directory: beside it, then moved in.
        const std::string side = staged.dir + "/.unpack-" + std::to_string(++unpacked);
        if (::mkdir(side.c_str(), 0755) != 0) throw_errno(what + ": create " + side);
        copier.unpack(src.get(), side, shown);
        UniqueFd side_fd(::open(side.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
        if (!side_fd) throw_errno(what + ": open " + side);
        for (const auto& name : names_in(side_fd.get()))
          if (::renameat(side_fd.get(), name.c_str(), target.get(), name.c_str()) != 0)
            throw Error(what + ": " + shown + ": '" + name + "' is in " + dest +
                        " already (from an earlier source)");
        ::rmdir(side.c_str());
        continue;
      }
      const std::string leaf =
          rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
      if (S_ISDIR(st.st_mode)) {
        // A directory's contents go into the destination directory.
        UniqueFd target = make_dirs(staged.dir, dest, what);
        copier.copy_contents(src.get(), rel, target.get(), shown);
      } else if (dir_dest) {
        UniqueFd target = make_dirs(staged.dir, dest, what);
        copier.copy(src.get(), rel, target.get(), leaf, shown);
      } else {
        const size_t cut = dest.rfind('/');
        UniqueFd target = make_dirs(staged.dir, dest.substr(0, cut), what);
        copier.copy(src.get(), rel, target.get(), dest.substr(cut + 1), shown);
      }
    }
    staged.digest = copier.digest();
  } catch (...) {
    try {
      files::remove_tree(staged.dir);
    } catch (const Error&) {
      // image prune removes what is left in tmp/
    }
    throw;
  }
  return staged;
}

}  // namespace openshell::cli::build
