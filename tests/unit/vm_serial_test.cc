// The 8250 UART: what Linux's driver probes, output to the sink, input,
// the divisor latch, and its interrupt on an eventfd. Also the CPUID filter.
#include <sys/eventfd.h>
#include <unistd.h>

#include <string>

#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "vm/kvm.h"
#include "vm/serial.h"

namespace openshell::vm {
namespace {

constexpr uint16_t kData = 0, kIer = 1, kIir = 2, kLcr = 3, kMcr = 4, kLsr = 5, kMsr = 6, kScr = 7;

struct SerialFixture {
  std::string out;
  UniqueFd irq{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};
  Serial serial{[this](const char* data, size_t length) { out.append(data, length); }, irq.get()};
  uint64_t interrupts() {
    uint64_t count = 0;
    return ::read(irq.get(), &count, sizeof count) == sizeof count ? count : 0;
  }
};

TEST(VmSerial, TransmitsToTheSinkAndIsAlwaysReadyToSend) {
  SerialFixture f;
  EXPECT_EQ(f.serial.read(kLsr) & 0x60, 0x60);
  for (char c : std::string("boot\n")) f.serial.write(kData, static_cast<uint8_t>(c));
  EXPECT_EQ(f.out, "boot\n");
  EXPECT_EQ(f.serial.transmitted(), 5u);
  EXPECT_EQ(f.interrupts(), 0u);  // interrupts not enabled
}

TEST(VmSerial, PassesTheDriversScratchAndLoopbackProbe) {
  SerialFixture f;
  f.serial.write(kScr, 0xa5);
  EXPECT_EQ(f.serial.read(kScr), 0xa5);
  f.serial.write(kMcr, 0x1a);  // loop | OUT2 | RTS
  EXPECT_EQ(f.serial.read(kMsr) & 0xf0, 0x90);
  f.serial.write(kData, 'x');  // looped back, not sent
  EXPECT_EQ(f.out, "");
  EXPECT_EQ(f.serial.read(kLsr) & 0x01, 0x01);
  EXPECT_EQ(f.serial.read(kData), 'x');
  f.serial.write(kMcr, 0x0b);
  EXPECT_EQ(f.serial.read(kMsr) & 0xb0, 0xb0);
}

TEST(VmSerial, DivisorLatchShadowsDataAndIer) {
  SerialFixture f;
  f.serial.write(kLcr, 0x83);  // DLAB, 8N1
  f.serial.write(kData, 0x01);
  f.serial.write(kIer, 0x00);
  EXPECT_EQ(f.serial.read(kData), 0x01);
  f.serial.write(kLcr, 0x03);
  EXPECT_EQ(f.serial.read(kIer), 0x00);
  EXPECT_EQ(f.out, "");  // the divisor write sent nothing
  EXPECT_EQ(f.serial.read(kLcr), 0x03);
}

TEST(VmSerial, TransmitEmptyInterruptRisesOnEnableAndAfterEachByte) {
  SerialFixture f;
  EXPECT_EQ(f.serial.read(kIir) & 0x0f, 0x01);  // none pending
  f.serial.write(kIer, 0x02);
  EXPECT_EQ(f.interrupts(), 1u);
  EXPECT_EQ(f.serial.read(kIir) & 0x0f, 0x02);
  EXPECT_EQ(f.serial.read(kIir) & 0x0f, 0x01);  // reading IIR acknowledged it
  f.serial.write(kData, 'a');
  EXPECT_EQ(f.interrupts(), 1u);
  EXPECT_EQ(f.out, "a");
}

TEST(VmSerial, ReceivedBytesRaiseTheInterruptAndReadInOrder) {
  SerialFixture f;
  f.serial.write(kIer, 0x01);
  EXPECT_EQ(f.interrupts(), 0u);
  f.serial.input("ok");
  EXPECT_EQ(f.interrupts(), 1u);
  EXPECT_EQ(f.serial.read(kIir) & 0x0f, 0x04);
  EXPECT_EQ(f.serial.read(kData), 'o');
  EXPECT_EQ(f.serial.read(kData), 'k');
  EXPECT_EQ(f.serial.read(kLsr) & 0x01, 0x00);
  EXPECT_EQ(f.serial.read(kIir) & 0x0f, 0x01);
}

TEST(VmSerial, ReceiveBufferIsBoundedAndCountsWhatItDrops) {
  SerialFixture f;
  f.serial.input(std::string(5000, 'z'));
  EXPECT_EQ(f.serial.dropped(), 5000u - 4096u);
  EXPECT_EQ(f.serial.read(8), 0xff);  // not a register
}

TEST(VmCpuid, SetsTheHypervisorBitAndDropsWhatTheVmmCannotBack) {
  std::vector<kvm_cpuid_entry2> supported(3);
  supported[0].function = 1;
  supported[0].ecx = (1u << 3) | (1u << 15) | (1u << 0);  // MONITOR, PDCM, SSE3
  supported[0].ebx = 0xff00abcd;
  supported[1].function = 0xa;
  supported[1].eax = 0x07300403;
  supported[2].function = 0xb;
  supported[2].edx = 9;
  const auto out = filter_cpuid(supported, 1, 2);
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(out[0].ecx & (1u << 31));
  EXPECT_FALSE(out[0].ecx & (1u << 3));
  EXPECT_FALSE(out[0].ecx & (1u << 15));
  EXPECT_TRUE(out[0].ecx & 1u);
  EXPECT_EQ(out[0].ebx >> 24, 1u);           // the APIC id
  EXPECT_EQ((out[0].ebx >> 16) & 0xff, 2u);  // logical processors
  EXPECT_EQ(out[0].ebx & 0xffff, 0xabcdu);   // the rest kept
  EXPECT_EQ(out[1].eax, 0u);
  EXPECT_EQ(out[2].edx, 1u);
}

}  // namespace
}  // namespace openshell::vm
