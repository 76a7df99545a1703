#include "base/logfile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/files.h"
#include "base/text.h"

namespace openshell::logfile {

namespace {

constexpr size_t kMaxLine = 16 * 1024;  // longer lines are split into P records

}  // namespace

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

std::string format_time(int64_t time_ns) {
  time_t seconds = static_cast<time_t>(time_ns / 1000000000);
  tm utc;
  gmtime_r(&seconds, &utc);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%09lldZ", utc.tm_year + 1900,
                utc.tm_mon + 1, utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec,
                static_cast<long long>(time_ns % 1000000000));
  return buf;
}

std::string format(const Record& r) {
  std::string line = format_time(r.time_ns);
  line += ' ';
  line += r.stream;
  line += r.partial ? " P " : " F ";
  line += r.text;
  line += '\n';
  return line;
}

std::optional<Record> parse(std::string_view line) {
  // TIME STREAM TAG TEXT
  size_t a = line.find(' ');
  if (a == std::string_view::npos) return std::nullopt;
  size_t b = line.find(' ', a + 1);
  if (b == std::string_view::npos) return std::nullopt;
  std::string_view time = line.substr(0, a), stream = line.substr(a + 1, b - a - 1);
  if (line.size() < b + 2 || (stream != "stdout" && stream != "stderr")) return std::nullopt;
  char tag = line[b + 1];
  if (tag != 'F' && tag != 'P') return std::nullopt;
  Record r;
  r.stream = std::string(stream);
  r.partial = tag == 'P';
  r.text = line.size() > b + 3 ? std::string(line.substr(b + 3)) : std::string();
  tm utc{};
  int year, month, day, hour, minute, second;
  long long nanos = 0;
  std::string time_text(time);
  if (std::sscanf(time_text.c_str(), "%d-%d-%dT%d:%d:%d.%lldZ", &year, &month, &day, &hour, &minute,
                  &second, &nanos) < 6)
    return std::nullopt;
  utc.tm_year = year - 1900;
  utc.tm_mon = month - 1;
  utc.tm_mday = day;
  utc.tm_hour = hour;
  utc.tm_min = minute;
  utc.tm_sec = second;
  r.time_ns = static_cast<int64_t>(timegm(&utc)) * 1000000000 + nanos;
  return r;
}

namespace {

// Opens a log file for appending without following a symbolic link at its
// last component, and only when it is a regular file: a log must never
// write through a link someone planted, nor into a FIFO or a device.
// O_NONBLOCK makes a FIFO without reader fail instead of hanging.
int open_log(const std::string& path, int extra_flags, std::string* error) {
  int fd = ::open(
      path.c_str(),
      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | extra_flags,
      0600);
  if (fd < 0) {
    int err = errno;
    *error = err == ELOOP   ? "is a symbolic link (a log file is never opened through one)"
             : err == ENXIO ? "is not a regular file"
                            : std::strerror(err);
    return -1;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    *error = "is not a regular file";
    return -1;
  }
  ::fcntl(fd, F_SETFL, O_WRONLY | O_APPEND);  // back to blocking writes
  return fd;
}

}  // namespace

RotatingFile::RotatingFile(std::string path, uint64_t max_bytes)
    : path_(std::move(path)), max_bytes_(max_bytes) {
  fd_ = open_log(path_, 0, &error_);
  struct stat st;
  if (fd_ >= 0 && ::fstat(fd_, &st) == 0) size_ = static_cast<uint64_t>(st.st_size);
}

RotatingFile::~RotatingFile() {
  if (fd_ >= 0) ::close(fd_);
}

void RotatingFile::append(std::string_view lines) {
  if (fd_ < 0) return;
  if (size_ > 0 && size_ + lines.size() > max_bytes_) {
    // Keep one older file; the newest lines always land.
    std::string old = path_ + ".1";
    ::rename(path_.c_str(), old.c_str());
    ::close(fd_);
    fd_ = open_log(path_, O_TRUNC, &error_);
    size_ = 0;
    if (fd_ < 0) return;
  }
  if (files::write_all(fd_, lines)) size_ += lines.size();
}

Writer::Writer(std::string path, uint64_t max_bytes) : file_(std::move(path), max_bytes) {}

Writer::~Writer() = default;

void Writer::append(const Record& record) { file_.append(format(record)); }

void Writer::write(const std::string& stream, std::string_view bytes, int64_t time_ns) {
  std::string& pending = stream == "stderr" ? pending_err_ : pending_out_;
  pending.append(bytes);
  size_t start = 0;
  for (;;) {
    size_t nl = pending.find('\n', start);
    if (nl == std::string::npos) break;
    append(Record{time_ns, stream, false, pending.substr(start, nl - start)});
    start = nl + 1;
  }
  pending.erase(0, start);
  while (pending.size() >= kMaxLine) {
    append(Record{time_ns, stream, true, pending.substr(0, kMaxLine)});
    pending.erase(0, kMaxLine);
  }
}

void Writer::flush_partial(const std::string& stream, int64_t time_ns) {
  std::string& pending = stream == "stderr" ? pending_err_ : pending_out_;
  if (pending.empty()) return;
  // A last line without its newline.
  append(Record{time_ns, stream, true, pending});
  pending.clear();
}

}  // namespace openshell::logfile
