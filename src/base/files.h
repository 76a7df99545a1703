// Whole-file reads and writes with errors that name the file.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace openshell::files {

// Throws Error("read PATH: reason").
std::string read(const std::string& path);
// nullopt when the file cannot be read (used for optional kernel files).
std::optional<std::string> try_read(const std::string& path);
// Appends the file to *out; returns 0 or the errno.
int read_into(const std::string& path, std::string* out);

// One write(2) of the whole content, as kernel interface files expect.
// Returns 0 or the errno.
int write_once(const std::string& path, const std::string& content);

// write_once, throwing Error("write PATH: reason").
void write(const std::string& path, const std::string& content);

// All of data to fd, through EINTR and short writes (and EAGAIN on a
// non-blocking fd, by waiting for it); false on any other error (a closed
// pipe, say).
bool write_all(int fd, std::string_view data);

// Writes a file atomically: a temp file in the same directory, fsync, rename
// over path, fsync of the directory; mode as given. On failure (a full disk
// included) the old file is untouched and no temp file remains. Throws Error.
void write_atomically(const std::string& path, std::string_view bytes, unsigned mode = 0600);
// The same without the fsyncs: a reader sees the old file or the new one,
// whole, but a crash of the machine may leave either (or an empty file). For
// files made again after a reboot.
void replace(const std::string& path, std::string_view bytes, unsigned mode = 0600);

bool exists(const std::string& path);
// A symlink's target; "" when path is none or cannot be read.
std::string read_link(const std::string& path);
bool is_directory(const std::string& path);

// Canonical absolute path; throws Error("WHAT PATH: reason").
std::string canonical(const std::string& path, const std::string& what);

}  // namespace openshell::files
