// One input of the kernel loaders' fuzzer, shared by the fuzzer and the
// unit test that replays its corpus: the first byte picks the format the
// rest is made to look like (1: a bzImage's boot flag and "HdrS" magic, 2:
// an x86-64 ELF executable's header), so that inputs reach the checks past
// the magic at once; the second is the initramfs's size in 256-byte units.
// Returns what load_linux() said: "" when it loaded the kernel.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "vm/boot.h"
#include "vm/guest_memory.h"

namespace openshell::fuzz {

inline std::string load_kernel_input(vm::GuestMemory& memory, const uint8_t* data, size_t size) {
  if (size < 2) return "too short";
  const uint8_t shape = data[0];
  const size_t initramfs_size = size_t{data[1]} << 8;
  std::vector<uint8_t> file(data + 2, data + size);
  if ((shape & 3) == 1 && file.size() >= 0x206) {
    file[0x1fe] = 0x55;
    file[0x1ff] = 0xaa;
    std::memcpy(file.data() + 0x202, "HdrS", 4);
  } else if ((shape & 3) == 2 && file.size() >= 20) {
    const uint8_t ident[] = {0x7f, 'E', 'L', 'F', 2, 1, 1};
    std::memcpy(file.data(), ident, sizeof ident);
    file[16] = 2;  // ET_EXEC
    file[17] = 0;
    file[18] = 62;  // EM_X86_64
    file[19] = 0;
  }
  const std::vector<uint8_t> initramfs(initramfs_size, 0x17);
  try {
    vm::boot::load_linux(memory, file, "console=ttyS0", initramfs);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

}  // namespace openshell::fuzz
