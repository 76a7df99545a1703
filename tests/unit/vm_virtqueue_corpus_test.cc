// The virtqueue fuzz target's corpus, replayed on every build without clang:
// each input keeps the properties of tests/fuzz/virtqueue_check.h.
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include <gtest/gtest.h>

#include "../fuzz/virtqueue_check.h"

namespace openshell::vm {
namespace {

TEST(VirtqueueCorpus, EveryInputKeepsTheDevicesProperties) {
  namespace fs = std::filesystem;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(OSH_VIRTQUEUE_CORPUS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(fuzz::virtqueue_violation(data), "") << entry.path();
    ++count;
  }
  EXPECT_GE(count, 15) << "the corpus at " OSH_VIRTQUEUE_CORPUS " is missing";
}

std::string seed(const std::string& name) {
  std::ifstream in(std::string(OSH_VIRTQUEUE_CORPUS) + "/" + name, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// The seeds reach what they are named for, so that the fuzzer starts from
// each of the devices' paths.
TEST(VirtqueueCorpus, SeedsReachTheirPaths) {
  for (const char* good : {"blk-read", "blk-write", "blk-flush", "blk-get-id", "blk-indirect",
                           "blk-by-registers", "blk-past-end", "vsock-request", "vsock-rw"}) {
    fuzz::VirtqueueOutcome outcome = fuzz::virtqueue_outcome(seed(good));
    EXPECT_EQ(outcome.fatal, "") << good;
    EXPECT_GE(outcome.used, 1u) << good;
  }
  EXPECT_NE(fuzz::virtqueue_outcome(seed("blk-loop")).fatal.find("(a loop)"), std::string::npos);
  EXPECT_NE(fuzz::virtqueue_outcome(seed("blk-runaway")).fatal.find("runaway queue"),
            std::string::npos);
  EXPECT_NE(fuzz::virtqueue_outcome(seed("blk-outside-ram")).fatal.find("outside guest RAM"),
            std::string::npos);
}

}  // namespace
}  // namespace openshell::vm
