#include "base/text.h"

#include <cstdint>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace openshell::text {
namespace {

using ::testing::ElementsAre;
using ::testing::Eq;
using ::testing::Optional;

constexpr uint64_t kKiB = uint64_t{1} << 10;
constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kTiB = uint64_t{1} << 40;

TEST(ParseSize, BinaryUnits) {
  EXPECT_THAT(parse_size("64M"), Optional(Eq(64 * kMiB)));
  EXPECT_THAT(parse_size("1.5G"), Optional(Eq(kGiB + kGiB / 2)));
  EXPECT_THAT(parse_size("512k"), Optional(Eq(512 * kKiB)));
  EXPECT_THAT(parse_size("2GiB"), Optional(Eq(2 * kGiB)));
  EXPECT_THAT(parse_size("3KB"), Optional(Eq(3 * kKiB)));
  EXPECT_THAT(parse_size("1t"), Optional(Eq(kTiB)));
  EXPECT_THAT(parse_size("8mib"), Optional(Eq(8 * kMiB)));
  EXPECT_THAT(parse_size("512Mi"), Optional(Eq(512 * kMiB)));
  EXPECT_THAT(parse_size("4Gi"), Optional(Eq(4 * kGiB)));
  EXPECT_THAT(parse_size("3ki"), Optional(Eq(3 * kKiB)));
}

TEST(ParseSize, BytesWithoutUnitOrWithB) {
  EXPECT_THAT(parse_size("4096"), Optional(Eq(uint64_t{4096})));
  EXPECT_THAT(parse_size("1b"), Optional(Eq(uint64_t{1})));
  EXPECT_THAT(parse_size("1B"), Optional(Eq(uint64_t{1})));
}

TEST(ParseSize, RejectsMalformed) {
  for (const char* bad : {"64Q", "", "-1", "1e3", "M", "1.2.3", " 64M", "64M ", "64Mx", "64Mib2",
                          "1bb", "1KiBs", "+1", ".", "0x10"})
    EXPECT_EQ(parse_size(bad), std::nullopt) << '"' << bad << '"';
}

TEST(ParseSize, RejectsZeroAndBelowOneByte) {
  EXPECT_EQ(parse_size("0"), std::nullopt);
  EXPECT_EQ(parse_size("0M"), std::nullopt);
  EXPECT_EQ(parse_size("0.5"), std::nullopt);
}

TEST(ParseSize, RejectsOverflow) {
  EXPECT_EQ(parse_size("99999999999T"), std::nullopt);
  EXPECT_EQ(parse_size("16777216T"), std::nullopt);  // exactly 2^64
  EXPECT_THAT(parse_size("16777215T"), Optional(Eq(16777215 * kTiB)));
}

TEST(ParseUint, AcceptsDecimal) {
  EXPECT_THAT(parse_uint("0"), Optional(Eq(uint64_t{0})));
  EXPECT_THAT(parse_uint("4096"), Optional(Eq(uint64_t{4096})));
  EXPECT_THAT(parse_uint("18446744073709551615"), Optional(Eq(UINT64_MAX)));
}

TEST(ParseUint, MaxIsInclusive) {
  EXPECT_THAT(parse_uint("65535", 65535), Optional(Eq(uint64_t{65535})));
  EXPECT_EQ(parse_uint("65536", 65535), std::nullopt);
  EXPECT_EQ(parse_uint("1", 0), std::nullopt);
}

TEST(ParseUint, RejectsOverflow) {
  EXPECT_EQ(parse_uint("18446744073709551616"), std::nullopt);
  EXPECT_EQ(parse_uint("99999999999999999999"), std::nullopt);
  EXPECT_EQ(parse_uint("123456789012345678901"), std::nullopt);
}

TEST(ParseUint, RejectsGarbage) {
  for (const char* bad : {"", "-1", "+1", " 1", "1 ", "12a", "0x1", "1.0", "\xef\xbc\x91"})
    EXPECT_EQ(parse_uint(bad), std::nullopt) << '"' << bad << '"';
}

TEST(ParsePositiveDecimal, Accepts) {
  EXPECT_THAT(parse_positive_decimal("1.5"), Optional(Eq(1.5)));
  EXPECT_THAT(parse_positive_decimal("2"), Optional(Eq(2.0)));
  EXPECT_THAT(parse_positive_decimal(".25"), Optional(Eq(0.25)));
  EXPECT_THAT(parse_positive_decimal("3."), Optional(Eq(3.0)));
}

TEST(ParsePositiveDecimal, Rejects) {
  for (const char* bad :
       {"", "0", "0.0", "-1", "+1", "1e3", "abc", "1.2.3", ".", " 1", "inf", "nan", "1,5"})
    EXPECT_EQ(parse_positive_decimal(bad), std::nullopt) << '"' << bad << '"';
}

TEST(Split, KeepsEmptyParts) {
  EXPECT_THAT(split("a,b,,c", ','), ElementsAre("a", "b", "", "c"));
  EXPECT_THAT(split(",", ','), ElementsAre("", ""));
  EXPECT_THAT(split("", ','), ElementsAre(""));
  EXPECT_THAT(split("abc", ','), ElementsAre("abc"));
  EXPECT_THAT(split("a:b", ','), ElementsAre("a:b"));
}

TEST(Trim, RemovesSurroundingWhitespaceOnly) {
  EXPECT_EQ(trim("  a b \t\r\n"), "a b");
  EXPECT_EQ(trim("\tx"), "x");
  EXPECT_EQ(trim("   "), "");
  EXPECT_EQ(trim(""), "");
}

TEST(Join, PutsSeparatorBetween) {
  EXPECT_EQ(join({"a", "b", "c"}, ", "), "a, b, c");
  EXPECT_EQ(join({"x"}, ","), "x");
  EXPECT_EQ(join({}, ","), "");
  EXPECT_EQ(join({"", ""}, "-"), "-");
}

TEST(IsDnsLabel, Accepts) {
  for (const char* good : {"sandbox", "a", "a-1", "0abc", "x0-y1"})
    EXPECT_TRUE(is_dns_label(good)) << good;
  EXPECT_TRUE(is_dns_label(std::string(63, 'a')));
}

TEST(IsDnsLabel, Rejects) {
  for (const char* bad : {"", "-a", "a-", "Bad_Name", "UPPER", "a.b", "a b", "a_b"})
    EXPECT_FALSE(is_dns_label(bad)) << '"' << bad << '"';
  EXPECT_FALSE(is_dns_label(std::string(64, 'a')));
}

TEST(FormatMs, TwoDecimalsRounded) {
  EXPECT_EQ(format_ms(0), "0.00");
  EXPECT_EQ(format_ms(12.345678), "12.35");
  EXPECT_EQ(format_ms(0.004), "0.00");
  EXPECT_EQ(format_ms(1500), "1500.00");
}

TEST(FormatBytes, PicksBinaryUnit) {
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(64 * kMiB), "64.0 MiB");
  EXPECT_EQ(format_bytes(kGiB + kGiB / 2), "1.5 GiB");
  EXPECT_EQ(format_bytes(kTiB), "1.0 TiB");
  EXPECT_EQ(format_bytes(2048 * kTiB), "2048.0 TiB");  // no unit above TiB
}

TEST(Hex, TwoLowerCaseDigitsAByte) {
  const unsigned char bytes[] = {0x00, 0x0a, 0x7f, 0xa0, 0xff};
  EXPECT_EQ(hex(bytes, sizeof bytes), "000a7fa0ff");
  EXPECT_EQ(hex(bytes, 0), "");
}

// ---- percent-encoding ---------------------------------------------------------

TEST(PercentEncode, EncodesEveryByteButTheUnreservedOnesAsUpperCaseHex) {
  EXPECT_EQ(percent_encode("a b/c"), "a%20b%2Fc");
  EXPECT_EQ(percent_encode("AZaz09-._~"), "AZaz09-._~");
  EXPECT_EQ(percent_encode("?&=+%#:@!*'()"), "%3F%26%3D%2B%25%23%3A%40%21%2A%27%28%29");
  EXPECT_EQ(percent_encode("\xc3\xa9\xff\x7f"), "%C3%A9%FF%7F");
  EXPECT_EQ(percent_encode(std::string("\0x", 2)), "%00x");
  EXPECT_EQ(percent_encode(""), "");
}

TEST(PercentDecode, DecodesEscapesInEitherCaseAndLeavesOtherBytes) {
  EXPECT_THAT(percent_decode("a%20b%2fc%2F"), Optional(Eq("a b/c/")));
  EXPECT_THAT(percent_decode("a+b"), Optional(Eq("a+b")));
  EXPECT_THAT(percent_decode("%C3%a9"), Optional(Eq("\xc3\xa9")));
  EXPECT_THAT(percent_decode(""), Optional(Eq("")));
  EXPECT_THAT(percent_decode("%25zz"), Optional(Eq("%zz")));  // decoded once only
}

TEST(PercentDecode, RefusesMalformedEscapesAndAnEncodedNul) {
  for (const char* text : {"%", "a%", "a%4", "%zz", "%4g", "%g4", "%%41", "% 41", "%00", "a%00b"})
    EXPECT_EQ(percent_decode(text), std::nullopt) << text;
}

TEST(PercentDecode, UndoesPercentEncodeForEveryByteButNul) {
  std::string all;
  for (int byte = 1; byte < 256; ++byte) all += static_cast<char>(byte);
  EXPECT_THAT(percent_decode(percent_encode(all)), Optional(Eq(all)));
}

TEST(CheckAbsolutePath, Reasons) {
  EXPECT_EQ(check_absolute_path("/usr/lib"), "");
  EXPECT_EQ(check_absolute_path("/"), "");
  EXPECT_EQ(check_absolute_path("/a/...b"), "");
  EXPECT_EQ(check_absolute_path(""), "must not be empty");
  EXPECT_EQ(check_absolute_path("usr"), "must be an absolute path");
  EXPECT_EQ(check_absolute_path("./usr"), "must be an absolute path");
  EXPECT_EQ(check_absolute_path("/a/../b"), "must not contain '..'");
  EXPECT_EQ(check_absolute_path("/a/.."), "must not contain '..'");
  EXPECT_EQ(check_absolute_path(std::string_view("/a\0b", 4)), "must not contain NUL");
}

TEST(Lower, AsciiLettersOnly) {
  EXPECT_EQ(lower("Content-Type: TEXT/Plain"), "content-type: text/plain");
  EXPECT_EQ(lower("Example.COM."), "example.com.");
  EXPECT_EQ(lower("@[`{09_"), "@[`{09_");      // the neighbours of A-Z stay
  EXPECT_EQ(lower("\xC3\x84X"), "\xC3\x84x");  // UTF-8 bytes stay (no locale folding)
  EXPECT_EQ(lower(std::string_view("A\0B", 3)), std::string("a\0b", 3));
  EXPECT_EQ(lower(""), "");
  EXPECT_EQ(lower('Q'), 'q');
  EXPECT_EQ(lower('q'), 'q');
  EXPECT_EQ(lower('\xC4'), '\xC4');
}

TEST(Upper, AsciiLettersOnly) {
  EXPECT_EQ(upper("cap_net_admin"), "CAP_NET_ADMIN");
  EXPECT_EQ(upper("\xC3\xA4x"), "\xC3\xA4X");
  EXPECT_EQ(upper('z'), 'Z');
  EXPECT_EQ(upper('{'), '{');
}

TEST(Iequals, IgnoresAsciiCaseOnly) {
  EXPECT_TRUE(iequals("Bearer", "bEARER"));
  EXPECT_TRUE(iequals("", ""));
  EXPECT_FALSE(iequals("bearer", "bearer "));
  EXPECT_FALSE(iequals("@", "`"));  // 0x40 and 0x60 differ by the case bit, but are no letters
  EXPECT_FALSE(iequals("\xC3\x84", "\xC3\xA4"));
}

}  // namespace
}  // namespace openshell::text
