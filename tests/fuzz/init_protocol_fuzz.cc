// libFuzzer target for the parser of the init's control channel (what a
// process inside the sandbox can write to it). Built only with clang and
// -Dfuzz=true:
//
//   CXX=clang++ meson setup build-fuzz -Dfuzz=true
//   meson compile -C build-fuzz tests/fuzz/init_protocol_fuzz
//   mkdir -p /tmp/init-corpus
//   build-fuzz/tests/fuzz/init_protocol_fuzz -max_total_time=60 \
//       /tmp/init-corpus tests/fuzz/corpus/init_protocol
//
// New inputs go to the first directory; copy a small, interesting one into
// tests/fuzz/corpus/init_protocol (which the unit test InitProtocolCorpus
// replays on every build) when it finds a crash or new coverage worth keeping.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "init_protocol_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string broken = openshell::fuzz::init_protocol_violation(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "init protocol: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
