// libFuzzer target for the layer-7 rules: any method and request-target,
// judged against any path glob and query matcher. Built only with clang and
// -Dfuzz=true:
//
//   CXX=clang++ meson setup build-fuzz -Dfuzz=true
//   meson compile -C build-fuzz tests/fuzz/http_rules_fuzz
//   mkdir -p /tmp/http-rules-corpus
//   build-fuzz/tests/fuzz/http_rules_fuzz -max_total_time=60 \
//       /tmp/http-rules-corpus tests/fuzz/corpus/http_rules
//
// The input's layout and the properties are in http_rules_check.h. The unit
// test HttpRulesCorpus replays tests/fuzz/corpus/http_rules on every build.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "http_rules_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string broken = openshell::fuzz::http_rules_violation(
      std::string_view(reinterpret_cast<const char*>(data), size));
  if (!broken.empty()) {
    std::fprintf(stderr, "http_rules: %s\n", broken.c_str());
    std::abort();
  }
  return 0;
}
