#include "base/vm_host.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"

namespace openshell::vm_host {

KernelChoice choose_kernel(const std::string& flag, const char* env) {
  if (!flag.empty()) return {flag, "--vm-kernel"};
  if (env && *env) return {env, kKernelVariable};
  return {kPackagedKernel, "the default"};
}

std::string kernel_problem(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK));
  if (!fd) return std::strerror(errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  return "";
}

std::string resolve_kernel(const std::string& flag, const char* env) {
  const KernelChoice choice = choose_kernel(flag, env);
  const std::string shown = choice.source == "--vm-kernel" ? "--vm-kernel " + choice.path
                            : choice.source == kKernelVariable
                                ? std::string(kKernelVariable) + "=" + choice.path
                                : "--vm: " + choice.path;
  if (choice.source == "the default" && !files::exists(choice.path)) throw Error(kNoKernel);
  if (auto why = kernel_problem(choice.path); !why.empty()) throw Error(shown + ": " + why);
  return files::canonical(choice.path, shown);
}

std::string kvm_problem(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (fd) return "";
  const int err = errno;
  std::string line = path + ": " + std::strerror(err);
  if (err == ENOENT) return line + " (no KVM on this host: the kernel lacks it, or it is a guest)";
  if (err == EACCES || err == EPERM)
    return line + " (user " + std::to_string(::geteuid()) + " must be able to open " + path +
           " read-write: root, or a member of its group)";
  return line;
}

}  // namespace openshell::vm_host
