// How a child between clone and exec reports why it failed: it fills this
// struct with async-signal-safe code and writes it to a pipe in one write; the
// parent turns it into an Error. No allocation, no locale, no exceptions.
#pragma once

#include <cstddef>
#include <string>

namespace openshell {

struct ChildFailure {
  int err = 0;        // errno, or 0 when the failure has no errno
  int exit_code = 0;  // what openshell should exit with (125, 126, 127)
  char what[128] = {};
  char detail[640] = {};

  // Formats "what detail: strerror(err)" in the parent.
  std::string message() const;
};

namespace child {

// Async-signal-safe bounded copy; always NUL-terminates.
inline void copy(char* dst, size_t size, const char* src) {
  size_t i = 0;
  if (src)
    for (; i + 1 < size && src[i]; ++i) dst[i] = src[i];
  dst[i] = '\0';
}

inline void append(char* dst, size_t size, const char* src) {
  size_t len = 0;
  while (len < size && dst[len]) ++len;
  if (len < size) copy(dst + len, size - len, src);
}

// Records a failure; returns false so that callers can `return fail(...)`.
inline bool fail(ChildFailure* f, int err, const char* what, const char* detail = nullptr,
                 int exit_code = 125) {
  f->err = err;
  f->exit_code = exit_code;
  copy(f->what, sizeof f->what, what);
  copy(f->detail, sizeof f->detail, detail);
  return false;
}

}  // namespace child
}  // namespace openshell
