#include "base/time.h"

#include <time.h>

#include <cstdio>

namespace openshell::time {

namespace {

constexpr int64_t kNsPerSecond = 1000000000;

// Days since 1970-01-01 of a proleptic Gregorian date (no time zone, no
// locale: timegm would do, but this needs no struct tm round trip).
int64_t days_from_civil(int64_t year, int64_t month, int64_t day) {
  year -= month <= 2;
  const int64_t era = (year >= 0 ? year : year - 399) / 400;
  const int64_t year_of_era = year - era * 400;
  const int64_t day_of_year = (153 * (month + (month > 2 ? -3 : 9)) + 2) / 5 + day - 1;
  const int64_t day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
  return era * 146097 + day_of_era - 719468;
}

int days_in_month(int64_t year, int64_t month) {
  static const int days[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  const bool leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0;
  return month == 2 && leap ? 29 : days[month - 1];
}

// Reads exactly `count` digits at *pos.
bool digits(std::string_view text, size_t* pos, size_t count, int64_t* value) {
  if (text.size() - *pos < count) return false;
  int64_t out = 0;
  for (size_t i = 0; i < count; ++i) {
    const char c = text[*pos + i];
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  *pos += count;
  *value = out;
  return true;
}

bool literal(std::string_view text, size_t* pos, char expected) {
  if (*pos >= text.size() || text[*pos] != expected) return false;
  ++*pos;
  return true;
}

// UTC time of day and date of a time, and what is left of a second in ns.
struct Civil {
  int64_t year, month, day, hour, minute, second, nanos;
};

Civil to_civil(int64_t time_ns) {
  int64_t seconds = time_ns / kNsPerSecond, nanos = time_ns % kNsPerSecond;
  if (nanos < 0) nanos += kNsPerSecond, --seconds;
  int64_t days = seconds / 86400, rest = seconds % 86400;
  if (rest < 0) rest += 86400, --days;
  // The inverse of days_from_civil.
  days += 719468;
  const int64_t era = (days >= 0 ? days : days - 146096) / 146097;
  const int64_t day_of_era = days - era * 146097;
  const int64_t year_of_era =
      (day_of_era - day_of_era / 1460 + day_of_era / 36524 - day_of_era / 146096) / 365;
  const int64_t day_of_year =
      day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
  const int64_t mp = (5 * day_of_year + 2) / 153;
  const int64_t day = day_of_year - (153 * mp + 2) / 5 + 1;
  const int64_t month = mp < 10 ? mp + 3 : mp - 9;
  return {year_of_era + era * 400 + (month <= 2),
          month,
          day,
          rest / 3600,
          rest / 60 % 60,
          rest % 60,
          nanos};
}

std::string format(int64_t time_ns, int fraction_digits) {
  const Civil c = to_civil(time_ns);
  int64_t fraction = c.nanos;
  for (int i = fraction_digits; i < 9; ++i) fraction /= 10;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%0*lldZ",
                static_cast<long long>(c.year), static_cast<long long>(c.month),
                static_cast<long long>(c.day), static_cast<long long>(c.hour),
                static_cast<long long>(c.minute), static_cast<long long>(c.second), fraction_digits,
                static_cast<long long>(fraction));
  return buf;
}

std::string count(int64_t n, const char* unit) {
  return std::to_string(n) + " " + unit + (n == 1 ? "" : "s") + " ago";
}

}  // namespace

int64_t now_ns() {
  timespec ts;
  ::clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * kNsPerSecond + ts.tv_nsec;
}

int64_t now_ms() { return now_ns() / 1000000; }

std::string format_ns(int64_t time_ns) { return format(time_ns, 9); }

std::string format_ms(int64_t time_ms) { return format(time_ms * 1000000, 3); }

std::optional<int64_t> parse(std::string_view text) {
  size_t pos = 0;
  int64_t year = 0, month = 0, day = 0, hour = 0, minute = 0, second = 0;
  if (!digits(text, &pos, 4, &year) || !literal(text, &pos, '-') ||
      !digits(text, &pos, 2, &month) || !literal(text, &pos, '-') || !digits(text, &pos, 2, &day))
    return std::nullopt;
  if (pos >= text.size() || (text[pos] != 'T' && text[pos] != 't')) return std::nullopt;
  ++pos;
  if (!digits(text, &pos, 2, &hour) || !literal(text, &pos, ':') ||
      !digits(text, &pos, 2, &minute) || !literal(text, &pos, ':') ||
      !digits(text, &pos, 2, &second))
    return std::nullopt;
  if (month < 1 || month > 12 || day < 1 || day > days_in_month(year, month) || hour > 23 ||
      minute > 59 || second > 60)
    return std::nullopt;
  int64_t nanos = 0;
  if (pos < text.size() && text[pos] == '.') {
    ++pos;
    int count = 0;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      if (++count > 9) return std::nullopt;
      nanos = nanos * 10 + (text[pos++] - '0');
    }
    if (count == 0) return std::nullopt;
    for (; count < 9; ++count) nanos *= 10;
  }
  int64_t offset_seconds = 0;
  if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z')) {
    ++pos;
  } else if (pos < text.size() && (text[pos] == '+' || text[pos] == '-')) {
    const int64_t sign = text[pos++] == '+' ? 1 : -1;
    int64_t offset_hours = 0, offset_minutes = 0;
    if (!digits(text, &pos, 2, &offset_hours) || !literal(text, &pos, ':') ||
        !digits(text, &pos, 2, &offset_minutes) || offset_hours > 23 || offset_minutes > 59)
      return std::nullopt;
    offset_seconds = sign * (offset_hours * 3600 + offset_minutes * 60);
  } else {
    return std::nullopt;
  }
  if (pos != text.size()) return std::nullopt;
  // A leap second (:60) reads as the first second of the next minute.
  const int64_t seconds = days_from_civil(year, month, day) * 86400 + hour * 3600 + minute * 60 +
                          second - offset_seconds;
  return seconds * kNsPerSecond + nanos;
}

std::optional<int64_t> parse_duration(std::string_view text) {
  constexpr int64_t kMax = 100LL * 366 * 86400;  // seconds
  if (text.empty() || text.size() > 32) return std::nullopt;
  int64_t seconds = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    int64_t number = 0;
    const size_t start = pos;
    while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
      number = number * 10 + (text[pos] - '0');
      if (number > kMax) return std::nullopt;
      ++pos;
    }
    if (pos == start || pos == text.size()) return std::nullopt;
    int64_t unit = 0;
    switch (text[pos++]) {
      case 's':
        unit = 1;
        break;
      case 'm':
        unit = 60;
        break;
      case 'h':
        unit = 3600;
        break;
      case 'd':
        unit = 86400;
        break;
      default:
        return std::nullopt;
    }
    seconds += number * unit;
    if (seconds > kMax) return std::nullopt;
  }
  if (seconds == 0) return std::nullopt;
  return seconds * kNsPerSecond;
}

std::string short_age(int64_t s) {
  if (s < 0) s = 0;
  if (s < 120) return std::to_string(s) + "s";
  if (s < 7200) return std::to_string(s / 60) + "m";
  if (s < 172800) return std::to_string(s / 3600) + "h";
  return std::to_string(s / 86400) + "d";
}

std::string long_age(int64_t s) {
  if (s < 0) s = 0;
  if (s < 120) return count(s, "second");
  if (s < 7200) return count(s / 60, "minute");
  if (s < 172800) return count(s / 3600, "hour");
  if (s < 86400L * 60) return count(s / 86400, "day");
  if (s < 86400L * 730) return count(s / (86400L * 30), "month");
  return count(s / (86400L * 365), "year");
}

}  // namespace openshell::time
