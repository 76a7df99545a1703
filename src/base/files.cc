#include "base/files.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "base/error.h"
#include "base/random.h"
#include "base/unique_fd.h"

namespace openshell::files {

bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = ::write(fd, data.data(), data.size());
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        pollfd p{fd, POLLOUT, 0};
        ::poll(&p, 1, -1);
        continue;
      }
      return false;
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

int read_into(const std::string& path, std::string* out) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return errno;
  char buf[8192];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return 0;
    out->append(buf, static_cast<size_t>(n));
  }
}

std::string read(const std::string& path) {
  std::string out;
  if (int err = read_into(path, &out)) throw_errno("read " + path, err);
  return out;
}

std::optional<std::string> try_read(const std::string& path) {
  std::string out;
  if (read_into(path, &out) != 0) return std::nullopt;
  return out;
}

int write_once(const std::string& path, const std::string& content) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC | O_NOCTTY));
  if (!fd) {
    // Kernel interface files always exist; a fake tree in tests may not.
    if (errno != ENOENT) return errno;
    fd.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOCTTY, 0644));
    if (!fd) return errno;
  }
  ssize_t n = ::write(fd.get(), content.data(), content.size());
  if (n < 0) return errno;
  if (static_cast<size_t>(n) != content.size()) return EIO;
  return 0;
}

void write(const std::string& path, const std::string& content) {
  if (int err = write_once(path, content)) throw_errno("write " + path, err);
}

namespace {

// A temp file beside path, renamed over it; with sync, the file and then
// the directory are synced.
void write_by_rename(const std::string& path, std::string_view bytes, unsigned mode, bool sync) {
  size_t slash = path.rfind('/');
  std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  if (base.empty() || base == "." || base == "..")
    throw Error("write " + path + ": not a file name");
  std::string temp = dir + "/." + base + ".tmp." + random_hex(8);
  const std::string what = "write " + path;

  UniqueFd fd(::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW,
                     static_cast<mode_t>(mode & 07777)));
  if (!fd) throw_errno(what);
  auto fail = [&](int err) {
    fd.reset();
    ::unlink(temp.c_str());
    throw_errno(what, err);
  };
  // The umask narrowed the mode given to open(2); the caller asked for this one.
  if (::fchmod(fd.get(), static_cast<mode_t>(mode & 07777)) != 0) fail(errno);
  const char* data = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd.get(), data, left);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(errno);
    if (n == 0) fail(ENOSPC);
    data += n;
    left -= static_cast<size_t>(n);
  }
  if (sync && ::fsync(fd.get()) != 0) fail(errno);
  if (::close(fd.release()) != 0) fail(errno);
  if (::rename(temp.c_str(), path.c_str()) != 0) fail(errno);
  if (!sync) return;

  // The rename is durable only once the directory is.
  UniqueFd dir_fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!dir_fd) throw_errno(what + ": the new file is in place, but open " + dir);
  if (::fsync(dir_fd.get()) != 0 && errno != EINVAL)
    throw_errno(what + ": the new file is in place, but fsync " + dir);
}

}  // namespace

void write_atomically(const std::string& path, std::string_view bytes, unsigned mode) {
  write_by_rename(path, bytes, mode, true);
}

void replace(const std::string& path, std::string_view bytes, unsigned mode) {
  write_by_rename(path, bytes, mode, false);
}

bool exists(const std::string& path) {
  struct stat st;
  return ::lstat(path.c_str(), &st) == 0;
}

std::string read_link(const std::string& path) {
  char buf[4096];
  ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n <= 0) return {};
  return std::string(buf, static_cast<size_t>(n));
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string canonical(const std::string& path, const std::string& what) {
  char buf[PATH_MAX];
  if (!::realpath(path.c_str(), buf)) throw_errno(what + " " + path);
  return buf;
}

}  // namespace openshell::files
