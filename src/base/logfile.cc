#include "base/logfile.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/files.h"
#include "base/text.h"
#include "base/time.h"
#include "base/unique_fd.h"

namespace openshell::logfile {

namespace {

constexpr size_t kMaxLine = 16 * 1024;  // longer lines are split into P records

}  // namespace

std::string format(const Record& r) {
  std::string line = time::format_ns(r.time_ns);
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
  auto time_ns = time::parse(time);
  if (!time_ns) return std::nullopt;
  r.time_ns = *time_ns;
  return r;
}

namespace {

// Opens a log file for appending without following a symbolic link at its
// last component, and only when it is a regular file: a log must never
// write through a link someone planted, nor into a FIFO or a device.
// O_NONBLOCK makes a FIFO without reader fail instead of hanging.
UniqueFd open_log(const std::string& path, int extra_flags, std::string* error) {
  UniqueFd fd(::open(
      path.c_str(),
      O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | extra_flags,
      0600));
  if (!fd) {
    int err = errno;
    *error = err == ELOOP   ? "is a symbolic link (a log file is never opened through one)"
             : err == ENXIO ? "is not a regular file"
                            : std::strerror(err);
    return {};
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) {
    *error = "is not a regular file";
    return {};
  }
  ::fcntl(fd.get(), F_SETFL, O_WRONLY | O_APPEND);  // back to blocking writes
  return fd;
}

}  // namespace

RotatingFile::RotatingFile(std::string path, uint64_t max_bytes)
    : path_(std::move(path)), max_bytes_(max_bytes) {
  fd_ = open_log(path_, 0, &error_);
  struct stat st;
  if (fd_ && ::fstat(fd_.get(), &st) == 0) size_ = static_cast<uint64_t>(st.st_size);
}

RotatingFile::~RotatingFile() = default;

void RotatingFile::append(std::string_view lines) {
  if (!fd_) return;
  if (size_ > 0 && size_ + lines.size() > max_bytes_) {
    // Keep one older file; the newest lines always land.
    std::string old = path_ + ".1";
    ::rename(path_.c_str(), old.c_str());
    fd_ = open_log(path_, O_TRUNC, &error_);
    size_ = 0;
    if (!fd_) return;
  }
  if (files::write_all(fd_.get(), lines)) size_ += lines.size();
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
