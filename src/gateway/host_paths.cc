#include "gateway/host_paths.h"

#include <fcntl.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "base/error.h"
#include "base/unique_fd.h"
#include "gateway/principal.h"

namespace openshell::gateway {

namespace {

struct Verdict {
  int index = -1;  // the path refused, or -1
  int err = 0;
  uid_t owner = 0;       // a bind source's owner, when that is why (err 0)
  char entry[256] = {};  // a tree's entry refused, under the path
};

constexpr int kMaxDepth = 128;

// What getdents64 writes (the kernel's struct, which glibc does not declare).
struct Dirent64 {
  uint64_t d_ino;
  int64_t d_off;
  unsigned short d_reclen;
  unsigned char d_type;
  char d_name[];
};

// Whether every entry under the directory fd is readable (directories also
// searchable) by this process, without following symbolic links (which
// resolve inside the sandbox). Only system calls: it runs in the child.
// On a refusal, the entry's name and errno.
bool tree_readable(int dir, int depth, Verdict* v) {
  if (depth > kMaxDepth) {
    v->err = ELOOP;
    return false;
  }
  alignas(8) char buf[16384];
  for (;;) {
    long n = ::syscall(SYS_getdents64, dir, buf, sizeof buf);
    if (n < 0) {
      v->err = errno;
      return false;
    }
    if (n == 0) return true;
    for (long at = 0; at < n;) {
      auto* d = reinterpret_cast<Dirent64*>(buf + at);
      at += d->d_reclen;
      const char* name = d->d_name;
      if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0) continue;
      struct stat st;
      if (::fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || S_ISLNK(st.st_mode)) continue;
      const bool is_dir = S_ISDIR(st.st_mode);
      if (::faccessat(dir, name, R_OK | (is_dir ? X_OK : 0), 0) != 0) {
        v->err = errno;
        std::strncpy(v->entry, name, sizeof v->entry - 1);
        return false;
      }
      if (!is_dir) continue;
      int sub = ::openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      if (sub < 0) {
        v->err = errno;
        std::strncpy(v->entry, name, sizeof v->entry - 1);
        return false;
      }
      bool ok = tree_readable(sub, depth + 1, v);
      ::close(sub);
      if (!ok) {
        if (!v->entry[0]) std::strncpy(v->entry, name, sizeof v->entry - 1);
        return false;
      }
    }
  }
}

}  // namespace

std::string host_path_problem(uid_t uid, gid_t gid, const std::vector<HostPath>& paths) {
  // A path whose components changed since it was made canonical (the CLI
  // resolves --bind sources) may now lead where the user could not go.
  for (const auto& p : paths) {
    std::unique_ptr<char, decltype(&std::free)> real(::realpath(p.path.c_str(), nullptr),
                                                     &std::free);
    if (real && p.path != real.get())
      return p.what + ": " + p.path + " is no longer where it leads (" + real.get() +
             "): give the path itself";
  }
  const std::vector<gid_t> groups = groups_of(uid, gid);
  std::vector<const char*> c_paths;
  std::vector<int> modes;
  std::vector<char> binds, trees;
  for (const auto& p : paths) {
    c_paths.push_back(p.path.c_str());
    modes.push_back(R_OK | (p.write ? W_OK : 0));
    binds.push_back(p.bind);
    trees.push_back(p.tree);
  }
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("check host paths: pipe");
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  pid_t pid = ::fork();
  if (pid < 0) throw_errno("check host paths: fork");
  if (pid == 0) {
    // Only system calls from here: the user's ids, then the checks.
    Verdict v;
    if (::setgroups(groups.size(), groups.data()) != 0 || ::setresgid(gid, gid, gid) != 0 ||
        ::setresuid(uid, uid, uid) != 0) {
      v.err = errno;
    } else {
      for (size_t i = 0; i < c_paths.size(); ++i) {
        struct stat st;
        int mode = modes[i];
        if (::stat(c_paths[i], &st) == 0 && S_ISDIR(st.st_mode)) mode |= X_OK;
        if (::stat(c_paths[i], &st) != 0 || ::access(c_paths[i], mode) != 0) {
          v.index = static_cast<int>(i);
          v.err = errno;
          break;
        }
        if (binds[i] && st.st_uid != uid && st.st_uid != 0) {
          v.index = static_cast<int>(i);
          v.owner = st.st_uid;
          break;
        }
        if (trees[i] && S_ISDIR(st.st_mode)) {
          int dir = ::open(c_paths[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
          if (dir < 0 || !tree_readable(dir, 0, &v)) {
            if (dir < 0) v.err = errno;
            v.index = static_cast<int>(i);
            break;
          }
          ::close(dir);
        }
      }
    }
    ssize_t ignored = ::write(write_end.get(), &v, sizeof v);
    (void)ignored;
    ::_exit(0);
  }
  write_end.reset();
  Verdict v;
  ssize_t n;
  do n = ::read(read_end.get(), &v, sizeof v);
  while (n < 0 && errno == EINTR);
  int status;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (n != static_cast<ssize_t>(sizeof v))
    throw Error("check host paths: the checking process ended without an answer");
  if (v.index < 0 && v.err)
    throw Error(errno_message("check host paths as uid " + std::to_string(uid), v.err));
  if (v.index < 0) return "";
  const HostPath& p = paths[static_cast<size_t>(v.index)];
  if (!v.err)
    return p.what + ": " + p.path + " belongs to uid " + std::to_string(v.owner) + ", not uid " +
           std::to_string(uid) + " (a bind gives the sandbox its owner's rights there)";
  if (v.entry[0])
    return p.what + ": uid " + std::to_string(uid) + " may not read " + p.path + "/…/" + v.entry +
           " (" + std::strerror(v.err) +
           "): a root directory's every file is the sandbox's to read";
  return p.what + ": uid " + std::to_string(uid) + " may not " +
         (p.write ? "read and write " : "read ") + p.path + " (" + std::strerror(v.err) + ")";
}

}  // namespace openshell::gateway
