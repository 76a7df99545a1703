// Whether overlayfs stacks a sandbox's root here (tried in a throw-away
// child), and the list form of overlay's options for kernels before 6.8.
#include "namespaces/overlay.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/child_failure.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "namespaces/mount_ops.h"

namespace openshell::namespaces {

using child::fail;

std::string overlay_problem(const std::vector<std::string>& lowers, const std::string& scratch_dir,
                            bool list_form_only) {
  const std::string upper = scratch_dir + "/upper", work = scratch_dir + "/work",
                    merged = scratch_dir + "/merged";
  for (const auto& d : {upper, work, merged})
    if (::mkdir(d.c_str(), 0700) != 0 && errno != EEXIST)
      return errno_message("create " + d, errno);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) return errno_message("pipe", errno);
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  char list_options[4096];
  const bool list_fits =
      overlay_list_options(list_options, sizeof list_options, overlay_lowerdir_list(lowers).c_str(),
                           upper.c_str(), work.c_str());
  // Everything the child needs is made here: after fork it only makes
  // system calls.
  const std::string uid_map = "0 " + std::to_string(uid) + " 1";
  const std::string gid_map = "0 " + std::to_string(gid) + " 1";
  std::vector<const char*> lower_paths;
  for (const auto& lower : lowers) lower_paths.push_back(lower.c_str());
  pid_t pid = ::fork();
  if (pid < 0) {
    int err = errno;
    ::close(report[0]);
    ::close(report[1]);
    return errno_message("fork", err);
  }
  if (pid == 0) {
    ::close(report[0]);
    ChildFailure failure;
    auto done = [&](bool ok) {
      if (!ok) (void)!::write(report[1], &failure, sizeof failure);
      ::_exit(ok ? 0 : 1);
    };
    int flags = CLONE_NEWNS | (uid != 0 ? CLONE_NEWUSER : 0);
    if (::unshare(flags) != 0) done(fail(&failure, errno, "unshare"));
    auto write_file = [](const char* path, const char* text) {
      int fd = ::open(path, O_WRONLY | O_CLOEXEC);
      if (fd < 0) return false;
      bool ok = ::write(fd, text, std::strlen(text)) == static_cast<ssize_t>(std::strlen(text));
      ::close(fd);
      return ok;
    };
    if (uid != 0) {
      if (!write_file("/proc/self/uid_map", uid_map.c_str()) ||
          !write_file("/proc/self/setgroups", "deny"))
        done(fail(&failure, errno, "write", "uid_map"));
      if (!write_file("/proc/self/gid_map", gid_map.c_str()))
        done(fail(&failure, errno, "write", "gid_map"));
    }
    // "lowerdir+" per layer (6.8 on), else the list form through mount(2),
    // as the sandbox's own mount falls back. A kernel without "lowerdir+"
    // refuses it when it is set (6.5 to 6.7) or at the creation (before).
    auto try_lowerdir_plus = [&]() {
      UniqueFd fs(::fsopen("overlay", FSOPEN_CLOEXEC));
      if (fs.get() < 0) return fail(&failure, errno, "fsopen", "overlay");
      bool ok = true;
      for (const char* lower : lower_paths)
        if (ok) ok = ::fsconfig(fs.get(), FSCONFIG_SET_STRING, "lowerdir+", lower, 0) == 0;
      if (!ok || ::fsconfig(fs.get(), FSCONFIG_SET_STRING, "upperdir", upper.c_str(), 0) != 0 ||
          ::fsconfig(fs.get(), FSCONFIG_SET_STRING, "workdir", work.c_str(), 0) != 0 ||
          ::fsconfig(fs.get(), FSCONFIG_SET_FLAG, "userxattr", nullptr, 0) != 0 ||
          ::fsconfig(fs.get(), FSCONFIG_CMD_CREATE, nullptr, nullptr, 0) != 0) {
        fail(&failure, errno, "mount", "overlay");
        mount_ops::read_fs_log(fs.get(), &failure);
        return false;
      }
      return true;
    };
    auto try_list_form = [&]() {
      if (!list_fits)
        return fail(&failure, E2BIG, "overlay options (list form) for", merged.c_str());
      if (::mount("overlay", merged.c_str(), "overlay", MS_NOSUID | MS_NODEV, list_options) != 0)
        return fail(&failure, errno, "mount overlay (list form) at", merged.c_str());
      return true;
    };
    bool mounted = false;
    if (!list_form_only) mounted = try_lowerdir_plus();
    if (list_form_only || (!mounted && failure.err == EINVAL)) mounted = try_list_form();
    done(mounted);
  }
  ::close(report[1]);
  ChildFailure failure;
  ssize_t n = ::read(report[0], &failure, sizeof failure);
  ::close(report[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  // The kernel's work/work directory (mode 000) goes with the rest.
  for (const auto& d : {work + "/work", work + "/index", upper, work, merged}) ::rmdir(d.c_str());
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return "";
  if (n == static_cast<ssize_t>(sizeof failure)) return failure.message();
  return "the overlay probe failed";
}

std::string overlay_lowerdir_list(const std::vector<std::string>& lowers) {
  std::string list;
  for (size_t i = 0; i < lowers.size(); ++i) {
    if (i) list += ':';
    for (char c : lowers[i]) {
      if (c == ':' || c == '\\' || c == ',') list += '\\';
      list += c;
    }
  }
  return list;
}

namespace {

// Appends `src` with ':', ',' and '\' escaped; false when it does not fit.
bool append_escaped(char* out, size_t size, size_t* len, const char* src) {
  for (; *src; ++src) {
    const bool escape = *src == ':' || *src == ',' || *src == '\\';
    if (*len + (escape ? 2 : 1) >= size) return false;
    if (escape) out[(*len)++] = '\\';
    out[(*len)++] = *src;
  }
  out[*len] = '\0';
  return true;
}

bool append_plain(char* out, size_t size, size_t* len, const char* src) {
  for (; *src; ++src) {
    if (*len + 1 >= size) return false;
    out[(*len)++] = *src;
  }
  out[*len] = '\0';
  return true;
}

}  // namespace

bool overlay_list_options(char* out, size_t size, const char* lowers, const char* upper,
                          const char* work) {
  if (size == 0) return false;
  size_t len = 0;
  out[0] = '\0';
  return append_plain(out, size, &len, "lowerdir=") && append_plain(out, size, &len, lowers) &&
         append_plain(out, size, &len, ",upperdir=") && append_escaped(out, size, &len, upper) &&
         append_plain(out, size, &len, ",workdir=") && append_escaped(out, size, &len, work) &&
         append_plain(out, size, &len, ",userxattr");
}

}  // namespace openshell::namespaces
