// libFuzzer target for the kernel loaders (src/vm/boot.cc): a kernel file
// is the VMM's input, and a hostile one must give an Error, never a read
// outside the file or a write outside guest memory (AddressSanitizer sees
// both). Built only with clang and -Dfuzz=true:
//
//   CXX=clang++ meson setup build-fuzz -Dfuzz=true
//   meson compile -C build-fuzz tests/fuzz/kernel_loader_fuzz
//   mkdir -p /tmp/kernel-corpus
//   build-fuzz/tests/fuzz/kernel_loader_fuzz -max_total_time=60 -max_len=8192 \
//       /tmp/kernel-corpus tests/fuzz/corpus/kernel_loader
//
// The input's shape is in kernel_loader_input.h; the unit test
// VmBoot.FuzzCorpusReplays replays tests/fuzz/corpus/kernel_loader on every
// build.
#include <cstddef>
#include <cstdint>

#include "kernel_loader_input.h"
#include "vm/guest_memory.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static openshell::vm::GuestMemory memory = openshell::vm::GuestMemory::create(8 << 20);
  openshell::fuzz::load_kernel_input(memory, data, size);
  return 0;
}
