#include "runtime/init_image.h"

#include <fcntl.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>

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

struct Where {
  uintptr_t address;
  off_t offset = -1;
};

// The image's offset in this binary's file: from the loaded segment that
// holds it.
int find_offset(dl_phdr_info* info, size_t, void* data) {
  auto* where = static_cast<Where*>(data);
  for (int i = 0; i < info->dlpi_phnum; ++i) {
    const ElfW(Phdr)& ph = info->dlpi_phdr[i];
    const uintptr_t start = info->dlpi_addr + ph.p_vaddr;
    if (ph.p_type == PT_LOAD && where->address >= start &&
        where->address + image_size() <= start + ph.p_filesz) {
      where->offset = static_cast<off_t>(ph.p_offset + (where->address - start));
      return 1;
    }
  }
  return 0;
}

// The image copied from this binary's file by the kernel (the page cache to
// the memfd): this process never maps the 0.8 MB, which would count in its
// RSS. Else from memory.
bool fill(int memfd) {
  Where where{reinterpret_cast<uintptr_t>(openshell_init_image_begin)};
  dl_iterate_phdr(find_offset, &where);
  UniqueFd exe(::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  if (where.offset >= 0 && exe) {
    off_t offset = where.offset;
    size_t left = image_size();
    while (left > 0) {
      ssize_t n = ::sendfile(memfd, exe.get(), &offset, left);
      if (n <= 0) break;
      left -= static_cast<size_t>(n);
    }
    if (left == 0) return true;
    if (::ftruncate(memfd, 0) != 0 || ::lseek(memfd, 0, SEEK_SET) != 0) return false;
  }
  return files::write_all(
      memfd,
      std::string_view(reinterpret_cast<const char*>(openshell_init_image_begin), image_size()));
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
  if (!fill(fd.get()) || ::fcntl(fd.get(), F_ADD_SEALS, kSeals) != 0) {
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
