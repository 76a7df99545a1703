// Helpers shared by the unit tests: temporary directories, small files, and
// running a check in a forked child whose confinement must not reach the test
// process (seccomp, Landlock, dropped ids).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include <gtest/gtest.h>

#include "base/error.h"

namespace openshell::testing {

// The message of the Error that action throws; a test failure, and "", when
// it throws none.
template <typename F>
std::string error_of(F&& action) {
  try {
    action();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no Error was thrown";
  return "";
}

// An environment variable set (or, with nullptr or nullopt, unset) for a
// scope; the old value, or its absence, comes back at the end.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    if (value)
      ::setenv(name, value, 1);
    else
      ::unsetenv(name);
  }
  ScopedEnv(const char* name, const std::optional<std::string>& value)
      : ScopedEnv(name, value ? value->c_str() : nullptr) {}
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

// A fresh directory under $TMPDIR (or /tmp), removed with its contents.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string pattern = std::string(base && *base ? base : "/tmp") + "/openshell-unit-XXXXXX";
    if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp: " + pattern);
    path_ = pattern;
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ignored;
    // Tests chmod directories read-only; give write access back first.
    for (auto it = std::filesystem::recursive_directory_iterator(path_, ignored);
         it != std::filesystem::recursive_directory_iterator(); it.increment(ignored))
      if (it->is_directory(ignored)) ::chmod(it->path().c_str(), 0755);
    ::chmod(path_.c_str(), 0755);
    std::filesystem::remove_all(path_, ignored);
  }

  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Creates the parents as needed and writes content.
inline void write_file(const std::string& path, const std::string& content) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  FILE* out = std::fopen(path.c_str(), "w");
  if (!out) throw std::runtime_error("open " + path + ": " + std::strerror(errno));
  std::fwrite(content.data(), 1, content.size(), out);
  std::fclose(out);
}

// The file's content, or "<missing>" when it cannot be read.
inline std::string read_file(const std::string& path) {
  FILE* in = std::fopen(path.c_str(), "r");
  if (!in) return "<missing>";
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, in)) > 0) out.append(buf, n);
  std::fclose(in);
  return out;
}

inline bool path_exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

// What a child reported: "name ret errno" records, and how it ended.
struct ChildReport {
  struct Result {
    long ret = 0;
    int err = 0;
  };
  std::map<std::string, Result> results;
  std::string text;  // free-form lines ("say" records)
  int wait_status = 0;

  bool exited_cleanly() const { return WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0; }
  bool has(const std::string& name) const { return results.count(name) != 0; }
  Result at(const std::string& name) const {
    auto it = results.find(name);
    return it == results.end() ? Result{-12345, -1} : it->second;
  }
};

// The child side's reporting; one write(2) per record so that nothing is
// buffered across the child's exit.
// Records a call's result and its errno, read in that order (as arguments of
// one call, their order of evaluation would be unspecified).
#define RECORD(writer, name, expr)                      \
  do {                                                  \
    long record_rc_ = (expr);                           \
    int record_errno_ = errno;                          \
    (writer).result((name), record_rc_, record_errno_); \
  } while (0)

class ChildWriter {
 public:
  explicit ChildWriter(int fd) : fd_(fd) {}
  // Records the result of a call that returns -1 and sets errno on failure.
  void result(const char* name, long ret, int err) {
    char line[256];
    int n = std::snprintf(line, sizeof line, "R %s %ld %d\n", name, ret, ret < 0 ? err : 0);
    put(line, n);
  }
  void say(const std::string& text) {
    std::string line = "S " + text + "\n";
    put(line.data(), static_cast<int>(line.size()));
  }

 private:
  void put(const char* data, int n) {
    if (n <= 0) return;
    ssize_t ignored = ::write(fd_, data, static_cast<size_t>(n));
    (void)ignored;
  }
  int fd_;
};

// Forks; the child runs body and exits (0 unless body calls _exit itself);
// the parent collects what it reported.
inline ChildReport run_in_child(const std::function<void(ChildWriter&)>& body) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork");
  if (pid == 0) {
    ::close(fds[0]);
    ChildWriter writer(fds[1]);
    body(writer);
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string raw;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    raw.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  ChildReport report;
  while (::waitpid(pid, &report.wait_status, 0) < 0 && errno == EINTR) {
  }
  std::istringstream lines(raw);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("R ", 0) == 0) {
      // "R NAME RET ERR": the name may hold spaces; the numbers do not.
      size_t err_at = line.rfind(' ');
      size_t ret_at = line.rfind(' ', err_at - 1);
      ChildReport::Result r;
      r.ret = std::stol(line.substr(ret_at + 1, err_at - ret_at - 1));
      r.err = std::stoi(line.substr(err_at + 1));
      report.results[line.substr(2, ret_at - 2)] = r;
    } else if (line.rfind("S ", 0) == 0) {
      report.text += line.substr(2) + "\n";
    }
  }
  return report;
}

}  // namespace openshell::testing
