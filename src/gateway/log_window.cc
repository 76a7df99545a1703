#include "gateway/log_window.h"

#include <string_view>

#include <nlohmann/json.hpp>

#include "base/logfile.h"
#include "base/time.h"

namespace openshell::gateway {

namespace {

std::optional<int64_t> time_of(std::string_view line, LogKind kind) {
  if (kind == LogKind::kRecords) {
    auto record = logfile::parse(line);
    if (!record) return std::nullopt;
    return record->time_ns;
  }
  auto j = nlohmann::json::parse(line, nullptr, false);
  if (!j.is_object() || !j.contains("time") || !j["time"].is_string()) return std::nullopt;
  return time::parse(j["time"].get<std::string>());
}

}  // namespace

size_t log_window_start(const std::string& content, LogKind kind, std::optional<int64_t> since_ns,
                        std::optional<size_t> tail) {
  // Walk back line by line: the log is in time order, so the first line
  // older than `since` ends the walk (as does the tail's count).
  size_t start = content.size();
  size_t count = 0;
  while (start > 0) {
    if (tail && count >= *tail) break;
    // The line ending at start - 1 (its newline) begins after the newline before it.
    size_t begin = start >= 2 ? content.rfind('\n', start - 2) : std::string::npos;
    begin = begin == std::string::npos ? 0 : begin + 1;
    if (since_ns) {
      std::string_view line(content.data() + begin, start - begin);
      if (!line.empty() && line.back() == '\n') line.remove_suffix(1);
      auto t = time_of(line, kind);
      if (!t || *t < *since_ns) break;
    }
    start = begin;
    ++count;
  }
  return start;
}

}  // namespace openshell::gateway
