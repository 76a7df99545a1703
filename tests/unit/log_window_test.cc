#include "gateway/log_window.h"

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/time.h"
#include "gateway/selector.h"

namespace openshell::gateway {
namespace {

const std::string kRecords =
    "2026-12-01T10:00:00Z stdout F one\n"
    "2026-12-01T10:05:00Z stdout F two\n"
    "2026-12-01T10:10:00Z stderr F three\n";

int64_t at(const char* text) { return *time::parse(text); }

std::string window(const std::string& content, LogKind kind, std::optional<int64_t> since,
                   std::optional<size_t> tail) {
  return content.substr(log_window_start(content, kind, since, tail));
}

TEST(LogWindow, TailCountsLines) {
  EXPECT_EQ(window(kRecords, LogKind::kRecords, std::nullopt, std::nullopt), kRecords);
  EXPECT_EQ(window(kRecords, LogKind::kRecords, std::nullopt, 1),
            "2026-12-01T10:10:00Z stderr F three\n");
  EXPECT_EQ(window(kRecords, LogKind::kRecords, std::nullopt, 0), "");
  EXPECT_EQ(window(kRecords, LogKind::kRecords, std::nullopt, 9), kRecords);
  EXPECT_EQ(window("", LogKind::kRecords, std::nullopt, 3), "");
}

TEST(LogWindow, SinceKeepsWhatIsNoOlder) {
  EXPECT_EQ(window(kRecords, LogKind::kRecords, at("2026-12-01T10:05:00Z"), std::nullopt),
            "2026-12-01T10:05:00Z stdout F two\n2026-12-01T10:10:00Z stderr F three\n");
  EXPECT_EQ(window(kRecords, LogKind::kRecords, at("2026-12-01T10:04:59Z"), 1),
            "2026-12-01T10:10:00Z stderr F three\n");
  EXPECT_EQ(window(kRecords, LogKind::kRecords, at("2026-12-01T11:00:00Z"), std::nullopt), "");
  EXPECT_EQ(window(kRecords, LogKind::kRecords, at("2026-12-01T09:00:00Z"), std::nullopt),
            kRecords);
}

TEST(LogWindow, NetworkLinesByTheirTimeField) {
  const std::string network =
      "{\"action\":\"deny\",\"time\":\"2026-12-01T10:00:00Z\"}\n"
      "{\"action\":\"allow\",\"host\":\"x\\\",\\\"time\\\":\\\"2030-01-01T00:00:00Z\","
      "\"time\":\"2026-12-01T10:01:00Z\"}\n"
      "not json\n"
      "{\"action\":\"allow\",\"time\":\"2026-12-01T10:02:00Z\"}\n";
  EXPECT_EQ(window(network, LogKind::kNetwork, at("2026-12-01T10:00:30Z"), std::nullopt),
            "{\"action\":\"allow\",\"time\":\"2026-12-01T10:02:00Z\"}\n")
      << "a line without a time ends the window";
}

TEST(Selector, CommaMeansAnd) {
  const std::map<std::string, std::string> labels = {{"team", "x"}, {"tier", "web"}};
  EXPECT_TRUE(matches(parse_selector(""), labels));
  EXPECT_TRUE(matches(parse_selector("team=x"), labels));
  EXPECT_TRUE(matches(parse_selector("team=x,tier=web"), labels));
  EXPECT_TRUE(matches(parse_selector("team,tier"), labels));
  EXPECT_FALSE(matches(parse_selector("team=x,tier=db"), labels));
  EXPECT_FALSE(matches(parse_selector("team=x,owner"), labels));
  EXPECT_FALSE(matches(parse_selector("team="), labels));
  EXPECT_TRUE(matches(parse_selector("empty="), {{"empty", ""}}));
}

TEST(Selector, BadTermsAreNamed) {
  auto error_of = [](const std::string& s) -> std::string {
    try {
      parse_selector(s);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_EQ(error_of("a=1,,b"),
            "selector 'a=1,,b': an empty term (expected KEY=VALUE or KEY, comma-separated)");
  EXPECT_EQ(error_of("=x"),
            "selector '=x': '=x' has no key (expected KEY=VALUE or KEY, comma-separated)");
}

TEST(Duration, NumbersWithUnits) {
  constexpr int64_t s = 1000000000;
  EXPECT_EQ(time::parse_duration("30s"), 30 * s);
  EXPECT_EQ(time::parse_duration("5m"), 300 * s);
  EXPECT_EQ(time::parse_duration("1h30m"), 5400 * s);
  EXPECT_EQ(time::parse_duration("2d"), 172800 * s);
  for (const char* bad : {"", "5", "m", "5x", "0s", "-5m", "5 m", "1.5h", "99999999999d"})
    EXPECT_EQ(time::parse_duration(bad), std::nullopt) << bad;
}

}  // namespace
}  // namespace openshell::gateway
