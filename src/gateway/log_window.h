// Which part of a sandbox's log `logs` sends first: the records no older
// than a time (--since), and of those the last N (-n); follow goes on from
// the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace openshell::gateway {

enum class LogKind {
  kRecords,  // the main process's output: CRI lines ("TIME STREAM TAG TEXT")
  kNetwork,  // the egress decisions: JSON objects with a "time" field
};

// The offset in `content` (whole lines) where that part starts. A line
// whose time cannot be read counts as older than `since_ns` (never shown
// with --since); `tail` none: every line.
size_t log_window_start(const std::string& content, LogKind kind, std::optional<int64_t> since_ns,
                        std::optional<size_t> tail);

}  // namespace openshell::gateway
