// libFuzzer target for the virtio devices' parsing of what a guest controls:
// guest memory (rings, descriptors, requests, vsock packets) and register
// writes, against virtio-blk and virtio-vsock. Built only with clang and
// -Dfuzz=true:
//
//   CXX=clang++ meson setup build-fuzz -Dfuzz=true
//   meson compile -C build-fuzz tests/fuzz/virtqueue_fuzz
//   mkdir -p /tmp/virtqueue-corpus
//   build-fuzz/tests/fuzz/virtqueue_fuzz -max_total_time=60 \
//       /tmp/virtqueue-corpus tests/fuzz/corpus/virtqueue
//
// The input's layout is in virtqueue_check.h. New inputs go to the first
// directory; copy a small, interesting one into tests/fuzz/corpus/virtqueue
// (which the unit test VirtqueueCorpus replays on every build) when it finds
// a crash or new coverage worth keeping.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "virtqueue_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string broken = openshell::fuzz::virtqueue_violation(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "virtqueue: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
