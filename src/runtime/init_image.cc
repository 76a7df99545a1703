#include "runtime/init_image.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"

// Between these two symbols: the bytes of build/openshell-init
// (tools/embed_gen, init_image_embed.cc).
extern "C" const unsigned char openshell_init_image_begin[];
extern "C" const unsigned char openshell_init_image_end[];

namespace openshell::runtime {

namespace {

#ifndef MFD_EXEC
#define MFD_EXEC 0x0010U
#endif

constexpr int kSeals = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;

size_t image_size() {
  return static_cast<size_t>(openshell_init_image_end - openshell_init_image_begin);
}

}  // namespace

UniqueFd make_init_image() {
  // MFD_EXEC says it is to be run (a kernel with vm.memfd_noexec=1 makes
  // memfds not executable unless asked); an older kernel knows no such flag.
  const unsigned flags = MFD_CLOEXEC | MFD_ALLOW_SEALING;
  UniqueFd fd(static_cast<int>(::syscall(SYS_memfd_create, "openshell-init", flags | MFD_EXEC)));
  if (!fd && errno == EINVAL)
    fd.reset(static_cast<int>(::syscall(SYS_memfd_create, "openshell-init", flags)));
  if (!fd) {
    log::debug(errno_message("memfd_create for the init's program", errno) +
               ": this binary is the init");
    return {};
  }
  if (!files::write_all(fd.get(),
                        std::string_view(reinterpret_cast<const char*>(openshell_init_image_begin),
                                         image_size())) ||
      ::fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) {
    log::debug(errno_message("write the init's program", errno) + ": this binary is the init");
    return {};
  }
  return fd;
}

bool is_init_image(int fd) {
  struct stat st;
  if (fd < 0 || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  if (static_cast<size_t>(st.st_size) != image_size()) return false;
  const int seals = ::fcntl(fd, F_GET_SEALS);
  return seals >= 0 && (seals & kSeals) == kSeals;
}

}  // namespace openshell::runtime
