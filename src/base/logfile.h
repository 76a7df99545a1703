// A sandbox's persisted log, one record per line in the CRI log format that
// Kubernetes uses:
//
//   2026-11-29T19:51:23.123456789Z stdout F hello
//
// time, stream (stdout or stderr), tag (F for a full line, P for a part of a
// longer one) and the text. The supervisor writes it; the gateway reads it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "base/unique_fd.h"

namespace openshell::logfile {

struct Record {
  int64_t time_ns = 0;  // since the epoch
  std::string stream;   // "stdout" or "stderr"
  bool partial = false;
  std::string text;  // without the newline
};

std::string format(const Record& record);            // one line, with its newline
std::optional<Record> parse(std::string_view line);  // line without its newline

// An append-only file of whole lines that keeps one older part: when a
// line would take it past max_bytes, the file becomes PATH.1 (replacing the
// older one) and a new PATH starts. Readers read PATH.1, then PATH. So the
// two take at most 2 * max_bytes (a single line longer than max_bytes
// still lands, alone in its file).
//
// PATH is created 0600, and is never opened through a symbolic link (at its
// last component) nor when it is not a regular file: is_open() is then
// false and error() says why ("is a symbolic link (...)", "is not a regular
// file", or the errno text).
class RotatingFile {
 public:
  static constexpr uint64_t kDefaultMaxBytes = 16 << 20;
  explicit RotatingFile(std::string path, uint64_t max_bytes = kDefaultMaxBytes);
  ~RotatingFile();
  RotatingFile(const RotatingFile&) = delete;
  RotatingFile& operator=(const RotatingFile&) = delete;

  void append(std::string_view lines);  // ends with a newline
  const std::string& path() const { return path_; }
  bool is_open() const { return fd_.valid(); }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  uint64_t max_bytes_;
  UniqueFd fd_;
  uint64_t size_ = 0;
  std::string error_;
};

// Appends a stream's bytes as records: complete lines at once, a partial line
// once it is long or the stream ends.
class Writer {
 public:
  explicit Writer(std::string path, uint64_t max_bytes = 16 << 20);
  ~Writer();
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  void write(const std::string& stream, std::string_view bytes, int64_t time_ns);
  void flush_partial(const std::string& stream, int64_t time_ns);  // at end of stream
  const std::string& path() const { return file_.path(); }

 private:
  void append(const Record& record);
  RotatingFile file_;
  std::string pending_out_, pending_err_;
};

}  // namespace openshell::logfile
