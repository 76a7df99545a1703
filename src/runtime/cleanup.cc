#include "runtime/cleanup.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/unique_fd.h"
#include "namespaces/userns.h"
#include "runtime/cgroup.h"

namespace openshell::runtime {

namespace {

// Removes the entries of dirfd, closes it, and returns 0 or the first errno.
// Raw system calls and a buffer on the stack only: it also runs in a child
// between clone and exit (remove_in_user_namespace), where nothing may
// allocate.
int remove_contents(int dirfd) {
  struct Dirent64 {
    uint64_t ino;
    int64_t off;
    unsigned short reclen;
    unsigned char type;
    char name[];
  };
  int first_error = 0;
  alignas(8) char buf[2048];
  for (;;) {
    long n = ::syscall(SYS_getdents64, dirfd, buf, sizeof buf);
    if (n < 0 && !first_error) first_error = errno;
    if (n <= 0) break;
    for (long pos = 0; pos < n;) {
      const auto* e = reinterpret_cast<const Dirent64*>(buf + pos);
      pos += e->reclen;
      const char* name = e->name;
      if (!std::strcmp(name, ".") || !std::strcmp(name, "..")) continue;
      bool is_dir = e->type == DT_DIR;
      if (e->type == DT_UNKNOWN) {
        struct stat st;
        is_dir = ::fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
      }
      if (is_dir) {
        // A directory left unreadable (overlayfs's work/work is mode 000).
        ::fchmodat(dirfd, name, 0700, 0);
        int sub = ::openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) {
          if (!first_error) first_error = errno;
          continue;
        }
        int err = remove_contents(sub);
        if (err && !first_error) first_error = err;
      }
      if (::unlinkat(dirfd, name, is_dir ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT &&
          !first_error)
        first_error = errno;
    }
  }
  ::close(dirfd);
  return first_error;
}

// rm -rf path; 0 or the first errno. Async-signal-safe.
int remove_path(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return 0;
    if (errno == ENOTDIR || errno == ELOOP) return ::unlink(path.c_str()) == 0 ? 0 : errno;
    return errno;
  }
  int err = remove_contents(fd);
  if (::rmdir(path.c_str()) != 0 && errno != ENOENT && !err) err = errno;
  return err;
}

// As root of a user namespace that maps the caller's subordinate ids: files
// the sandbox made as other ids are ours there.
int remove_in_user_namespace(const std::string& path) {
  namespaces::Identity me = namespaces::current_identity();
  namespaces::IdMap map = namespaces::plan_id_map_for_host(me, 0, 0);
  if (map.is_single()) return EPERM;  // nothing more to gain
  Pipe go = Pipe::create();
  clone_args args{};
  args.flags = CLONE_NEWUSER;
  args.exit_signal = SIGCHLD;
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid < 0) return errno;
  if (pid == 0) {
    // Until _exit: system calls only (remove_path allocates nothing).
    ::close(go.write.get());
    char byte;
    if (::read(go.read.get(), &byte, 1) != 1) ::_exit(1);
    ::_exit(remove_path(path) == 0 ? 0 : 1);
  }
  go.read.reset();
  int result = 0;
  try {
    namespaces::apply_id_map(static_cast<pid_t>(pid), &map);
    if (::write(go.write.get(), "g", 1) != 1) result = errno;
  } catch (const Error&) {
    result = EPERM;
  }
  go.write.reset();
  int status = 0;
  while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
  }
  if (result) return result;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : EACCES;
}

}  // namespace

void remove_cgroups(const std::string& name) noexcept {
  try {
    CgroupLayout layout = CgroupLayout::discover();
    std::vector<std::string> dirs;
    if (layout.unified) dirs.push_back(layout.unified->dir + "/" + name);
    for (const auto& [controller, hierarchy] : layout.controllers)
      dirs.push_back(hierarchy.dir + "/" + name);
    // Tasks that just died may still be leaving: retry briefly.
    for (const auto& dir : dirs)
      for (int attempt = 0; attempt < 50; ++attempt) {
        if (::rmdir(dir.c_str()) == 0 || errno != EBUSY) break;
        ::usleep(2000);
      }
  } catch (...) {
  }
}

void remove_tree(const std::string& path) {
  int err = remove_path(path);
  if (err == EACCES || err == EPERM) err = remove_in_user_namespace(path);
  if (err) throw_errno("remove " + path, err);
}

}  // namespace openshell::runtime
