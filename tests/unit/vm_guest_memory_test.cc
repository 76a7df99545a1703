// GuestMemory: the memfd, its slots around the MMIO hole, and span(), which
// every guest-provided address goes through.
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "base/error.h"
#include "test_util.h"
#include "vm/guest_memory.h"
#include "vm/layout.h"

namespace openshell::vm {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// The VmFlags line of the mapping that starts at `start` in /proc/self/smaps.
std::string vm_flags_of(const void* start) {
  std::ifstream smaps("/proc/self/smaps");
  std::ostringstream want;
  want << std::hex << reinterpret_cast<uintptr_t>(start) << "-";
  std::string line;
  bool in_mapping = false;
  while (std::getline(smaps, line)) {
    if (line.rfind(want.str(), 0) == 0) in_mapping = true;
    if (in_mapping && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(VmGuestMemory, RefusesSizesThatAreNotWholeTwoMiBPages) {
  EXPECT_NE(testing::error_of([] { GuestMemory::create(0); }).find("multiple of 2 MiB"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { GuestMemory::create(kMiB); }).find("multiple of 2 MiB"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { GuestMemory::create(3 * kMiB); }).find("multiple of 2 MiB"),
            std::string::npos);
  EXPECT_NE(testing::error_of([] { GuestMemory::create(1ull << 41); }).find("more than 1 TiB"),
            std::string::npos);
}

TEST(VmGuestMemory, SmallGuestHasOneSlotAtZeroAndIsZeroed) {
  GuestMemory memory = GuestMemory::create(16 * kMiB);
  ASSERT_EQ(memory.slots().size(), 1u);
  EXPECT_EQ(memory.slots()[0].guest_address, 0u);
  EXPECT_EQ(memory.slots()[0].size, 16 * kMiB);
  EXPECT_EQ(memory.size(), 16 * kMiB);
  EXPECT_GE(memory.fd(), 0);
  uint64_t word = 1;
  ASSERT_TRUE(memory.read(16 * kMiB - 8, &word, 8));
  EXPECT_EQ(word, 0u);
}

TEST(VmGuestMemory, SpanChecksTheWholeRange) {
  GuestMemory memory = GuestMemory::create(2 * kMiB);
  const uint64_t end = 2 * kMiB;
  EXPECT_EQ(memory.span(0, end), memory.host_base());
  EXPECT_EQ(memory.span(end - 1, 1), memory.host_base() + end - 1);
  EXPECT_NE(memory.span(end, 0), nullptr);  // empty, at the end
  EXPECT_EQ(memory.span(end, 1), nullptr);
  EXPECT_EQ(memory.span(end - 1, 2), nullptr);
  EXPECT_EQ(memory.span(0, end + 1), nullptr);
  EXPECT_EQ(memory.span(end + 1, 0), nullptr);
}

TEST(VmGuestMemory, SpanRefusesRangesThatWrapAround) {
  GuestMemory memory = GuestMemory::create(2 * kMiB);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(memory.span(16, max), nullptr);
  EXPECT_EQ(memory.span(max, 2), nullptr);
  EXPECT_EQ(memory.span(max - 15, 32), nullptr);
  EXPECT_EQ(memory.span(1, max), nullptr);
}

TEST(VmGuestMemory, ReadAndWriteCopyNothingOutsideRam) {
  GuestMemory memory = GuestMemory::create(2 * kMiB);
  const char text[] = "guest";
  ASSERT_TRUE(memory.write(0x1000, text, sizeof text));
  char back[sizeof text] = {};
  ASSERT_TRUE(memory.read(0x1000, back, sizeof back));
  EXPECT_STREQ(back, "guest");
  char untouched[4] = {'x', 'x', 'x', 'x'};
  EXPECT_FALSE(memory.read(2 * kMiB - 2, untouched, 4));
  EXPECT_EQ(untouched[0], 'x');
  EXPECT_FALSE(memory.write(2 * kMiB - 2, text, 4));
  uint16_t last = 1;
  ASSERT_TRUE(memory.read(2 * kMiB - 2, &last, 2));
  EXPECT_EQ(last, 0u);
}

TEST(VmGuestMemory, LargeGuestSkipsTheMmioHole) {
  // 4 MiB more than fits below the hole: those 4 MiB live at 4 GiB.
  GuestMemory memory = GuestMemory::create(layout::kMmioStart + 4 * kMiB);
  ASSERT_EQ(memory.slots().size(), 2u);
  const MemorySlot& low = memory.slots()[0];
  const MemorySlot& high = memory.slots()[1];
  EXPECT_EQ(low.guest_address, 0u);
  EXPECT_EQ(low.size, layout::kMmioStart);
  EXPECT_EQ(high.guest_address, layout::kMmioEnd);
  EXPECT_EQ(high.size, 4 * kMiB);
  EXPECT_EQ(high.offset, layout::kMmioStart);
  EXPECT_NE(low.slot, high.slot);

  EXPECT_EQ(memory.span(layout::kMmioStart - 1, 1), memory.host_base() + layout::kMmioStart - 1);
  EXPECT_EQ(memory.span(layout::kMmioStart, 1), nullptr);  // the hole is no RAM
  EXPECT_EQ(memory.span(layout::mmio_window(3), 4), nullptr);
  EXPECT_EQ(memory.span(layout::kIoapicStart, 4), nullptr);
  EXPECT_EQ(memory.span(layout::kMmioEnd - 1, 1), nullptr);
  EXPECT_EQ(memory.span(layout::kMmioStart - 1, 2), nullptr);  // across the hole's edge
  EXPECT_EQ(memory.span(layout::kMmioEnd, 1), memory.host_base() + layout::kMmioStart);
  EXPECT_EQ(memory.span(layout::kMmioEnd + 4 * kMiB - 4, 4),
            memory.host_base() + layout::kMmioStart + 4 * kMiB - 4);
  EXPECT_EQ(memory.span(layout::kMmioEnd + 4 * kMiB - 4, 5), nullptr);

  // One memfd behind both slots: a write above the hole lands at its offset.
  const uint32_t value = 0x5eed;
  ASSERT_TRUE(memory.write(layout::kMmioEnd + 8, &value, 4));
  uint32_t back = 0;
  std::memcpy(&back, memory.host_base() + layout::kMmioStart + 8, 4);
  EXPECT_EQ(back, value);
}

TEST(VmGuestMemory, IsNotDumpedAndNotInheritedByChildren) {
  GuestMemory memory = GuestMemory::create(4 * kMiB);
  const std::string flags = vm_flags_of(memory.host_base());
  ASSERT_FALSE(flags.empty()) << "no mapping at the guest memory's address in /proc/self/smaps";
  EXPECT_NE(flags.find(" dd"), std::string::npos) << flags;  // MADV_DONTDUMP
  EXPECT_NE(flags.find(" dc"), std::string::npos) << flags;  // MADV_DONTFORK
}

TEST(VmGuestMemory, MovedFromOwnsNothing) {
  GuestMemory first = GuestMemory::create(2 * kMiB);
  uint8_t* base = first.host_base();
  GuestMemory second = std::move(first);
  EXPECT_EQ(second.host_base(), base);
  EXPECT_EQ(first.host_base(), nullptr);
  EXPECT_EQ(first.span(0, 1), nullptr);
  EXPECT_GE(second.fd(), 0);
}

}  // namespace
}  // namespace openshell::vm
