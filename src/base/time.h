// Wall-clock time as text: RFC 3339 in UTC for files and the API, and ages
// for people ("3m", "3 minutes ago").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace openshell::time {

int64_t now_ns();  // CLOCK_REALTIME, since the epoch
int64_t now_ms();

// "2026-11-29T19:51:23.123456789Z": logs, audit lines, the image store.
std::string format_ns(int64_t time_ns);
// "2026-11-29T19:51:23.123Z": the API's times.
std::string format_ms(int64_t time_ms);

// RFC 3339 -> nanoseconds since the epoch: "YYYY-MM-DDTHH:MM:SS", then an
// optional fraction of 1 to 9 digits, then "Z" or an offset "+HH:MM" /
// "-HH:MM" ('t' and 'z' accepted too). nullopt when it is anything else,
// or names no real date and time (a month 13, a 30 February, a second 61).
std::optional<int64_t> parse(std::string_view text);

// A duration as people write it for --since: one or more NUMBER UNIT pairs,
// units s, m, h, d ("30s", "5m", "1h30m", "2d") -> nanoseconds. nullopt
// when it is anything else, or zero, or above 100 years.
std::optional<int64_t> parse_duration(std::string_view text);

// How long ago, for tables: "5s", "3m", "2h", "4d" (a negative age, a clock
// that went back, reads as 0s).
std::string short_age(int64_t seconds);
// The same in words: "5 seconds ago", "3 minutes ago", ..., "2 years ago".
std::string long_age(int64_t seconds);

}  // namespace openshell::time
