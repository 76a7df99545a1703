// What the benchmark programs share: summary statistics of samples and JSON
// strings for their --json output. Header-only: each program is one file.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

namespace bench {

struct Stats {
  double median, p10, p90, p99, mean, min, max;
};

// Percentile by linear interpolation between closest ranks; `sorted` is
// sorted and not empty.
inline double percentile(const std::vector<double>& sorted, double p) {
  if (sorted.size() == 1) return sorted[0];
  double pos = p * static_cast<double>(sorted.size() - 1);
  size_t lo = static_cast<size_t>(std::floor(pos));
  size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - static_cast<double>(lo));
}

inline Stats stats_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s{};
  s.median = percentile(v, 0.5);
  s.p10 = percentile(v, 0.1);
  s.p90 = percentile(v, 0.9);
  s.p99 = percentile(v, 0.99);
  s.mean = std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
  s.min = v.front();
  s.max = v.back();
  return s;
}

// s as a JSON string, quotes included.
inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (unsigned char ch : s) {
    if (ch == '"' || ch == '\\') {
      out += '\\';
      out += static_cast<char>(ch);
    } else if (ch < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", ch);
      out += buf;
    } else {
      out += static_cast<char>(ch);
    }
  }
  return out + "\"";
}

}  // namespace bench
