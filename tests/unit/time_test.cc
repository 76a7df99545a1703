#include "base/time.h"

#include <cstdint>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace openshell::time {
namespace {

using ::testing::Eq;
using ::testing::Optional;

constexpr int64_t kNs = 1000000000;
// 2026-11-29T19:51:23Z (date -u -d 2026-11-29T19:51:23Z +%s).
constexpr int64_t kSample = 1795981883;

TEST(TimeFormat, NanosecondsAndMilliseconds) {
  EXPECT_EQ(format_ns(kSample * kNs + 123456789), "2026-11-29T19:51:23.123456789Z");
  EXPECT_EQ(format_ns(0), "1970-01-01T00:00:00.000000000Z");
  EXPECT_EQ(format_ms(kSample * 1000 + 7), "2026-11-29T19:51:23.007Z");
  EXPECT_EQ(format_ms(951782400000), "2000-02-29T00:00:00.000Z");  // a leap day
  EXPECT_EQ(format_ns(-1), "1969-12-31T23:59:59.999999999Z");      // before the epoch
}

TEST(TimeParse, RoundTripsWhatItFormats) {
  for (int64_t t : {int64_t{0}, kSample * kNs + 123456789, int64_t{951782400} * kNs,
                    int64_t{4102444799} * kNs + 999999999, int64_t{-1}}) {
    EXPECT_THAT(parse(format_ns(t)), Optional(Eq(t))) << format_ns(t);
    const int64_t ms = t / 1000000 * 1000000;
    if (t >= 0) {
      EXPECT_THAT(parse(format_ms(t / 1000000)), Optional(Eq(ms))) << t;
    }
  }
  // Every day of a leap year and of a common one.
  for (int64_t day = 0; day < 731; ++day) {
    const int64_t t = (int64_t{946684800} + day * 86400 + 3661) * kNs;  // from 2000-01-01 01:01:01
    ASSERT_THAT(parse(format_ns(t)), Optional(Eq(t))) << format_ns(t);
  }
}

TEST(TimeParse, FractionsAndOffsets) {
  EXPECT_THAT(parse("2026-11-29T19:51:23Z"), Optional(Eq(kSample * kNs)));
  EXPECT_THAT(parse("2026-11-29T19:51:23.5Z"), Optional(Eq(kSample * kNs + 500000000)));
  EXPECT_THAT(parse("2026-11-29t19:51:23.000000001z"), Optional(Eq(kSample * kNs + 1)));
  EXPECT_THAT(parse("2026-11-29T21:51:23+02:00"), Optional(Eq(kSample * kNs)));
  EXPECT_THAT(parse("2026-11-29T14:21:23.25-05:30"), Optional(Eq(kSample * kNs + 250000000)));
  EXPECT_THAT(parse("2016-12-31T23:59:60Z"), Optional(Eq(int64_t{1483228800} * kNs)));
}

TEST(TimeParse, RefusesWhatIsNotRfc3339) {
  for (const char* bad : {"",
                          "2026-11-29",
                          "2026-11-29T19:51Z",
                          "2026-11-29T19:51:23",
                          "2026-11-29 19:51:23Z",
                          "2026-11-29T19:51:23.Z",
                          "2026-11-29T19:51:23.1234567891Z",
                          "2026-11-29T19:51:23+0200",
                          "2026-11-29T19:51:23Z ",
                          " 2026-11-29T19:51:23Z",
                          "2026-13-01T00:00:00Z",
                          "2026-02-29T00:00:00Z",
                          "1900-02-29T00:00:00Z",
                          "2026-04-31T00:00:00Z",
                          "2026-00-10T00:00:00Z",
                          "2026-01-00T00:00:00Z",
                          "2026-01-01T24:00:00Z",
                          "2026-01-01T00:60:00Z",
                          "2026-01-01T00:00:61Z",
                          "2026-01-01T00:00:00+24:00",
                          "26-11-29T19:51:23Z",
                          "2026-1-29T19:51:23Z",
                          "+026-11-29T19:51:23Z"})
    EXPECT_EQ(parse(bad), std::nullopt) << '"' << bad << '"';
  EXPECT_THAT(parse("2000-02-29T00:00:00Z"), Optional(Eq(int64_t{951782400} * kNs)));
}

TEST(TimeNow, IsTheWallClock) {
  // 2026-01-01: a clock before it is wrong, and the tests' times assume it.
  EXPECT_GT(now_ns(), int64_t{1767225600} * kNs);
  EXPECT_EQ(now_ms() / 1000, now_ns() / kNs);
}

TEST(Age, Short) {
  EXPECT_EQ(short_age(-5), "0s");
  EXPECT_EQ(short_age(0), "0s");
  EXPECT_EQ(short_age(119), "119s");
  EXPECT_EQ(short_age(120), "2m");
  EXPECT_EQ(short_age(7199), "119m");
  EXPECT_EQ(short_age(7200), "2h");
  EXPECT_EQ(short_age(172799), "47h");
  EXPECT_EQ(short_age(172800), "2d");
  EXPECT_EQ(short_age(86400 * 400), "400d");
}

TEST(Age, Long) {
  EXPECT_EQ(long_age(-5), "0 seconds ago");
  EXPECT_EQ(long_age(1), "1 second ago");
  EXPECT_EQ(long_age(119), "119 seconds ago");
  EXPECT_EQ(long_age(120), "2 minutes ago");
  EXPECT_EQ(long_age(7200), "2 hours ago");
  EXPECT_EQ(long_age(86400 * 3), "3 days ago");
  EXPECT_EQ(long_age(86400 * 59), "59 days ago");
  EXPECT_EQ(long_age(86400 * 60), "2 months ago");
  EXPECT_EQ(long_age(86400 * 729), "24 months ago");
  EXPECT_EQ(long_age(86400 * 730), "2 years ago");
}

}  // namespace
}  // namespace openshell::time
