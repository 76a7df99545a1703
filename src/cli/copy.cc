#include "cli/copy.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "image/budget.h"
#include "image/unpack.h"

namespace openshell::cli {

namespace {

namespace fs = std::filesystem;

// The last component of a path, without trailing slashes ("a/b/" -> "b").
std::string base_name(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  auto slash = path.rfind('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string parent_of(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  auto slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// SIGPIPE ignored while one end of a pipe may go away under the other.
class NoSigpipe {
 public:
  NoSigpipe() {
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    ::sigaction(SIGPIPE, &ignore, &saved_);
  }
  ~NoSigpipe() { ::sigaction(SIGPIPE, &saved_, nullptr); }

 private:
  struct sigaction saved_ {};
};

// A tar stream in GNU's format (what busybox's and GNU's tar read), written
// here: libarchive's writers would pull every format it has (XML included)
// into the static binary.
class TarWriter {
 public:
  explicit TarWriter(int fd) : fd_(fd) {}

  // One file system object, as `name`.
  void add(const std::string& host_path, const std::string& name) {
    struct stat st;
    if (::lstat(host_path.c_str(), &st) != 0) throw_errno("upload: " + host_path);
    char type;
    std::string target;
    uint64_t size = 0;
    if (S_ISREG(st.st_mode)) {
      type = '0';
      size = static_cast<uint64_t>(st.st_size);
    } else if (S_ISDIR(st.st_mode)) {
      type = '5';
    } else if (S_ISLNK(st.st_mode)) {
      type = '2';
      char buf[4096];
      ssize_t n = ::readlink(host_path.c_str(), buf, sizeof buf);
      if (n < 0) throw_errno("upload: readlink " + host_path);
      target.assign(buf, static_cast<size_t>(n));
    } else {
      throw Error("upload: " + host_path + ": not a file, directory or symbolic link");
    }
    const std::string entry_name = type == '5' ? name + "/" : name;
    if (entry_name.size() > 100) long_field('L', entry_name);
    if (target.size() > 100) long_field('K', target);
    header(entry_name, type, st.st_mode & 0777, size, st.st_mtim.tv_sec, target);
    if (type != '0') return;
    UniqueFd fd(::open(host_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    if (!fd) throw_errno("upload: " + host_path);
    char buf[65536];
    uint64_t left = size;
    while (left > 0) {
      ssize_t n = ::read(fd.get(), buf, static_cast<size_t>(std::min<uint64_t>(left, sizeof buf)));
      if (n < 0) throw_errno("upload: " + host_path);
      if (n == 0) throw Error("upload: " + host_path + ": it shrank while being read");
      put(buf, static_cast<size_t>(n));
      left -= static_cast<uint64_t>(n);
    }
    pad(size);
  }

  // Two zero blocks end the archive.
  void finish() {
    char zeros[1024] = {};
    put(zeros, sizeof zeros);
  }

 private:
  static void octal(char* field, size_t width, uint64_t value) {
    // width-1 digits and a NUL; larger sizes in base 256 (a GNU extension).
    if (width >= 12 && value >= (uint64_t{1} << (3 * (width - 1)))) {
      std::memset(field, 0, width);
      field[0] = static_cast<char>(0x80);
      for (size_t i = width - 1; i > 0 && value; --i, value >>= 8)
        field[i] = static_cast<char>(value & 0xff);
      return;
    }
    std::snprintf(field, width, "%0*llo", static_cast<int>(width - 1),
                  static_cast<unsigned long long>(value));
  }

  void header(const std::string& name, char type, unsigned mode, uint64_t size, int64_t mtime,
              const std::string& target) {
    char h[512] = {};
    std::memcpy(h, name.data(), std::min<size_t>(name.size(), 100));
    octal(h + 100, 8, mode);
    octal(h + 108, 8, 0);
    octal(h + 116, 8, 0);
    octal(h + 124, 12, size);
    octal(h + 136, 12, static_cast<uint64_t>(mtime < 0 ? 0 : mtime));
    h[156] = type;
    std::memcpy(h + 157, target.data(), std::min<size_t>(target.size(), 100));
    std::memcpy(h + 257, "ustar  ", 8);  // GNU's magic and version
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    h[155] = ' ';
    put(h, sizeof h);
  }

  // A GNU long name ('L') or long link target ('K') record before a header.
  void long_field(char type, const std::string& value) {
    header("././@LongLink", type, 0, value.size() + 1, 0, "");
    put(value.data(), value.size());
    const char nul = '\0';
    put(&nul, 1);
    pad(value.size() + 1);
  }

  void pad(uint64_t size) {
    static const char zeros[512] = {};
    if (size % 512) put(zeros, 512 - size % 512);
  }

  void put(const char* data, size_t n) {
    while (n > 0) {
      ssize_t w = ::write(fd_, data, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw Error("upload: the sandbox stopped reading");
      data += w;
      n -= static_cast<size_t>(w);
    }
  }

  int fd_;
};

}  // namespace

// A tar of `local` as its base name, written to fd.
void write_tar(const std::string& local, int fd) {
  TarWriter tar(fd);
  // Its own name, also for "." or "dir/": the directory's.
  const std::string top = base_name(fs::absolute(local).lexically_normal().string());
  if (top.empty() || top == "/" || top == "." || top == "..")
    throw Error("upload: " + local + ": name a file or directory below /");
  tar.add(local, top);
  struct stat st;
  if (::lstat(local.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(local, fs::directory_options::none, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      tar.add(it->path().string(), top + "/" + it->path().lexically_relative(local).string());
    if (ec) throw Error("upload: " + local + ": " + ec.message());
  }
  tar.finish();
}

namespace {

// The process's umask, read without changing it (umask(2) only swaps, and
// other threads may create files meanwhile).
mode_t current_umask() {
  if (auto status = files::try_read("/proc/self/status")) {
    auto at = status->find("\nUmask:");
    if (at != std::string::npos)
      return static_cast<mode_t>(std::strtoul(status->c_str() + at + 7, nullptr, 8)) & 0777;
  }
  const mode_t mask = ::umask(022);
  ::umask(mask);
  return mask;
}

int tar_status(int status, const char* what) {
  if (status == 127)
    throw Error(std::string(what) + ": the sandbox has no tar, which it needs", 125);
  return status;
}

}  // namespace

int upload(const Paths& paths, const std::string& name, const std::string& local,
           const std::string& dest) {
  struct stat st;
  if (::lstat(local.c_str(), &st) != 0) throw_errno("upload: " + local);
  if (dest.empty() || dest[0] != '/')
    throw Error("upload: the destination must be an absolute path in the sandbox");
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd read_end(ends[0]), write_end(ends[1]);
  NoSigpipe quiet;
  std::string write_error;
  std::thread writer([&] {
    try {
      write_tar(local, write_end.get());
    } catch (const std::exception& e) {
      write_error = e.what();
    }
    write_end.reset();  // the end of the archive
  });
  ExecOptions options;
  options.argv = {"tar", "-x", "-f", "-", "-C", dest};
  options.stdin_fd = read_end.get();
  int status = 0;
  try {
    status = exec(paths, name, options);
  } catch (...) {
    read_end.reset();  // the writer stops at once
    writer.join();
    throw;
  }
  read_end.reset();
  writer.join();
  if (!write_error.empty()) throw Error(write_error);
  return tar_status(status, "upload");
}

int download(const Paths& paths, const std::string& name, const std::string& remote,
             const std::string& local_dir) {
  if (remote.empty() || remote[0] != '/')
    throw Error("download: the source must be an absolute path in the sandbox");
  const std::string leaf = base_name(remote);
  if (leaf.empty() || leaf == "/" || leaf == "." || leaf == "..")
    throw Error("download: '" + remote + "' names no file or directory");
  if (!files::is_directory(local_dir)) throw Error("download: " + local_dir + ": not a directory");
  const std::string final_path = local_dir + "/" + leaf;
  struct stat st;
  if (::lstat(final_path.c_str(), &st) == 0)
    throw Error("download: " + final_path + " exists; nothing was changed");
  const mode_t caller_umask = current_umask();
  // Unpacked first into a directory of our own next to it, then moved.
  std::string staging = local_dir + "/.openshell-download-XXXXXX";
  if (!::mkdtemp(staging.data())) throw_errno("download: create a directory in " + local_dir);
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd read_end(ends[0]), write_end(ends[1]);
  UniqueFd no_input(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  NoSigpipe quiet;
  int status = -1;
  std::string exec_error;
  int exec_code = 125;
  std::thread reader([&] {
    ExecOptions options;
    options.argv = {"tar", "-c", "-f", "-", "-C", parent_of(remote), leaf};
    options.stdin_fd = no_input.get();
    options.stdout_fd = write_end.get();
    try {
      status = exec(paths, name, options);
    } catch (const Error& e) {
      exec_error = e.what();
      exec_code = e.exit_code();
    } catch (const std::exception& e) {
      exec_error = e.what();
    }
    write_end.reset();
  });
  std::string unpack_error;
  try {
    image::UnpackOptions unpack;
    unpack.preserve_owners = false;
    unpack.whiteouts = false;
    unpack.from_sandbox = true;
    unpack.umask = caller_umask;
    // The sandbox decides how much it sends: it may not fill the caller's
    // disk. What the archive declares is counted before it is written.
    const uint64_t free = image::free_space(local_dir);
    const uint64_t bound = free / 10 * 9;
    uint64_t declared = 0;
    unpack.account = [&](uint64_t bytes) {
      declared += bytes;
      if (declared > bound)
        throw Error("download of " + remote + ": more than " + text::format_bytes(bound) +
                    " (90% of the " + text::format_bytes(free) + " free on " + local_dir +
                    "); make room there, or download less");
    };
    image::unpack_layer(read_end.get(), staging, unpack, "download of " + remote);
  } catch (const std::exception& e) {
    unpack_error = e.what();
  }
  read_end.reset();
  reader.join();
  auto clean = [&] {
    try {
      files::remove_tree(staging);
    } catch (const std::exception&) {
    }
  };
  if (!exec_error.empty()) {
    clean();
    throw Error(exec_error, exec_code);
  }
  if (status != 0) {
    clean();
    return tar_status(status, "download");
  }
  if (!unpack_error.empty()) {
    clean();
    throw Error(unpack_error);
  }
  // What the sandbox names must be a file or a directory (never a symbolic
  // link, say to /etc, that the caller would then write through).
  struct stat top {};
  if (::lstat((staging + "/" + leaf).c_str(), &top) != 0 ||
      !(S_ISREG(top.st_mode) || S_ISDIR(top.st_mode))) {
    const bool link = S_ISLNK(top.st_mode);
    clean();
    throw Error("download: " + remote +
                (link ? " is a symbolic link in the sandbox" : " is not a file or directory") +
                ": only a file or a directory can be downloaded; nothing was changed");
  }
  if (::rename((staging + "/" + leaf).c_str(), final_path.c_str()) != 0) {
    int err = errno;
    clean();
    throw_errno("download: move into " + final_path, err);
  }
  clean();
  return 0;
}

}  // namespace openshell::cli
