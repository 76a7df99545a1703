#include "cli/copy.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include <archive.h>
#include <archive_entry.h>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
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

// The archive's reader went away: a consequence of its own failure, which
// it reports.
struct SandboxStoppedReading : Error {
  using Error::Error;
};

// A tar stream in GNU's format (what busybox's and GNU's tar read: long
// names and link targets as GNU records), written by libarchive.
class TarWriter {
 public:
  explicit TarWriter(int fd) : archive_(::archive_write_new()), entry_(::archive_entry_new()) {
    if (!archive_ || !entry_) throw Error("upload: out of memory");
    if (::archive_write_set_format_gnutar(archive_) != ARCHIVE_OK ||
        ::archive_write_add_filter_none(archive_) != ARCHIVE_OK ||
        ::archive_write_set_bytes_in_last_block(archive_, 1) != ARCHIVE_OK ||
        ::archive_write_open_fd(archive_, fd) != ARCHIVE_OK)
      fail();
  }
  TarWriter(const TarWriter&) = delete;
  TarWriter& operator=(const TarWriter&) = delete;
  ~TarWriter() {
    // An archive left unfinished (a read failed) must not end as if whole:
    // no padding, no end blocks, so tar in the sandbox sees it cut short.
    if (!finished_) ::archive_write_fail(archive_);
    ::archive_entry_free(entry_);
    ::archive_write_free(archive_);
  }

  // One file system object, as `name`: its mode without setuid and setgid,
  // owned by 0 (tar in the sandbox, unprivileged, makes it its user's).
  void add(const std::string& host_path, const std::string& name) {
    struct stat st;
    if (::lstat(host_path.c_str(), &st) != 0) throw_errno("upload: " + host_path);
    ::archive_entry_clear(entry_);
    ::archive_entry_set_pathname(entry_, name.c_str());
    ::archive_entry_set_perm(entry_, st.st_mode & 0777);
    ::archive_entry_set_mtime(entry_, st.st_mtim.tv_sec < 0 ? 0 : st.st_mtim.tv_sec, 0);
    ::archive_entry_set_uid(entry_, 0);
    ::archive_entry_set_gid(entry_, 0);
    UniqueFd fd;
    if (S_ISREG(st.st_mode)) {
      // Opened before its header: what cannot be read is not announced.
      fd.reset(::open(host_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
      if (!fd) throw_errno("upload: " + host_path);
      ::archive_entry_set_filetype(entry_, AE_IFREG);
      ::archive_entry_set_size(entry_, st.st_size);
    } else if (S_ISDIR(st.st_mode)) {
      ::archive_entry_set_filetype(entry_, AE_IFDIR);
    } else if (S_ISLNK(st.st_mode)) {
      char buf[4096];
      ssize_t n = ::readlink(host_path.c_str(), buf, sizeof buf - 1);
      if (n < 0) throw_errno("upload: readlink " + host_path);
      buf[n] = '\0';
      ::archive_entry_set_filetype(entry_, AE_IFLNK);
      ::archive_entry_set_symlink(entry_, buf);
    } else {
      throw Error("upload: " + host_path + ": not a file, directory or symbolic link");
    }
    if (::archive_write_header(archive_, entry_) != ARCHIVE_OK) fail();
    if (!fd) return;
    char buf[65536];
    uint64_t left = static_cast<uint64_t>(st.st_size);
    while (left > 0) {
      ssize_t n = ::read(fd.get(), buf, static_cast<size_t>(std::min<uint64_t>(left, sizeof buf)));
      if (n < 0) throw_errno("upload: " + host_path);
      if (n == 0) throw Error("upload: " + host_path + ": it shrank while being read");
      if (::archive_write_data(archive_, buf, static_cast<size_t>(n)) != n) fail();
      left -= static_cast<uint64_t>(n);
    }
  }

  // The end of the archive (its two zero blocks).
  void finish() {
    if (::archive_write_close(archive_) != ARCHIVE_OK) fail();
    finished_ = true;
  }

 private:
  [[noreturn]] void fail() {
    const int err = ::archive_errno(archive_);
    if (err == EPIPE) throw SandboxStoppedReading("upload: the sandbox stopped reading");
    const char* why = ::archive_error_string(archive_);
    throw Error(std::string("upload: write the archive: ") + (why ? why : "unknown error"));
  }

  archive* archive_;
  archive_entry* entry_;
  bool finished_ = false;
};

}  // namespace

// A tar of `local` as its base name, written to fd.
UploadStats write_tar(const std::string& local, int fd, const UploadFilter& keep) {
  TarWriter tar(fd);
  UploadStats stats;
  auto count = [&](const std::string& path, const std::string& name) {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return;
    if (S_ISDIR(st.st_mode))
      ++stats.directories;
    else if (S_ISLNK(st.st_mode))
      ++stats.links;
    else
      ++stats.files, stats.bytes += static_cast<uint64_t>(st.st_size);
    stats.names.push_back(name);
  };
  // Its own name, also for "." or "dir/": the directory's.
  const std::string top = base_name(fs::absolute(local).lexically_normal().string());
  if (top.empty() || top == "/" || top == "." || top == "..")
    throw Error("upload: " + local + ": name a file or directory below /");
  tar.add(local, top);
  count(local, top);
  struct stat st;
  if (::lstat(local.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(local, fs::directory_options::none, ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
      const std::string rel = it->path().lexically_relative(local).string();
      if (keep) {
        std::error_code type_ec;
        const bool is_dir = it->symlink_status(type_ec).type() == fs::file_type::directory;
        if (!keep(rel, is_dir)) {
          ++stats.ignored;
          if (is_dir) it.disable_recursion_pending();
          continue;
        }
      }
      tar.add(it->path().string(), top + "/" + rel);
      count(it->path().string(), top + "/" + rel);
    }
    if (ec) throw Error("upload: " + local + ": " + ec.message());
  }
  tar.finish();
  return stats;
}

namespace {

std::string counted(uint64_t n, const char* one, const char* many) {
  return std::to_string(n) + " " + (n == 1 ? one : many);
}

}  // namespace

std::string upload_summary(const UploadStats& stats, const std::string& dest,
                           const std::string& filter_how) {
  std::string what = counted(stats.files, "file", "files");
  if (stats.directories) what += ", " + counted(stats.directories, "directory", "directories");
  if (stats.links) what += ", " + counted(stats.links, "symbolic link", "symbolic links");
  std::string line = "copied " + what + " (" + text::format_bytes(stats.bytes) + ") into " + dest;
  if (stats.ignored)
    line += "; " + std::to_string(stats.ignored) + " left out by " + filter_how +
            " (--no-git-ignore copies them)";
  return line;
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

// Everything written to fd (a memfd) so far, up to 64 KiB.
std::string read_back(int fd) {
  std::string text(65536, '\0');
  ssize_t n = ::pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  return text;
}

int tar_status(int status, const char* what) {
  if (status == 127)
    throw Error(std::string(what) + ": the sandbox has no tar, which it needs", 125);
  return status;
}

}  // namespace

namespace {

void print_upload(const UploadStats& stats, const std::string& dest, const std::string& how,
                  const UploadOptions& options) {
  std::string text;
  if (options.verbose)
    for (const auto& n : stats.names) text += n + "\n";
  text += upload_summary(stats, dest, how) + "\n";
  std::fflush(stdout);
  files::write_all(options.summary_fd, text);
}

}  // namespace

int upload(const GatewayClient& client, const std::string& name, const std::string& local,
           const std::string& dest, const UploadOptions& upload_options) {
  struct stat st;
  if (::lstat(local.c_str(), &st) != 0) throw_errno("upload: " + local);
  if (dest.empty() || dest[0] != '/')
    throw Error("upload: the destination must be an absolute path in the sandbox");
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd read_end(ends[0]), write_end(ends[1]);
  // tar's complaints are kept: a refusal becomes one line of ours.
  UniqueFd tar_errors(static_cast<int>(::syscall(SYS_memfd_create, "tar-errors", MFD_CLOEXEC)));
  if (!tar_errors) throw_errno("upload: memfd_create");
  NoSigpipe quiet;
  std::string write_error;       // the archive could not be made (a file here)
  bool stopped_reading = false;  // the sandbox's tar quit first
  GitIgnore ignore;
  if (upload_options.git_ignore && S_ISDIR(st.st_mode)) ignore = git_ignore_filter(local);
  UploadStats stats;
  std::thread writer([&] {
    try {
      stats = write_tar(local, write_end.get(), ignore.filter);
    } catch (const SandboxStoppedReading&) {
      stopped_reading = true;
    } catch (const std::exception& e) {
      write_error = e.what();
    }
    write_end.reset();  // the end of the archive
  });
  ExecOptions options;
  options.argv = {"tar", "-x", "-f", "-", "-C", dest};
  options.copy = true;
  options.stdin_fd = read_end.get();
  options.stderr_fd = tar_errors.get();
  int status = 0;
  try {
    status = exec(client, name, options);
  } catch (...) {
    read_end.reset();  // the writer stops at once
    writer.join();
    throw;
  }
  read_end.reset();
  writer.join();
  const std::string errors = read_back(tar_errors.get());
  // What went wrong here comes first: tar then failed on a cut archive.
  if (!write_error.empty()) throw Error(write_error);
  if (status == 0 || status == 127) {
    files::write_all(STDERR_FILENO, errors);  // warnings, or a shell's "not found"
    if (stopped_reading && status == 0) throw Error("upload: the sandbox stopped reading");
    if (status == 0) print_upload(stats, dest, ignore.how, upload_options);
    return tar_status(status, "upload");
  }
  // The sandbox refused (and so stopped reading): its first complaint says why.
  throw Error(upload_failure(errors, dest, status));
}

std::string tar_failure(const std::string& tar_errors, const std::string& prefix,
                        const std::string& dir, int status) {
  std::string line;
  for (const auto& l : text::split(tar_errors, '\n'))
    if (!text::trim(l).empty()) {
      line = std::string(text::trim(l));
      break;
    }
  if (line.empty())
    return prefix + dir + ": tar in the sandbox ended with status " + std::to_string(status);
  if (line.rfind("tar: ", 0) == 0) line.erase(0, 5);
  const auto colon = line.rfind(": ");
  if (colon == std::string::npos) return prefix + dir + ": " + line;
  const std::string reason = line.substr(colon + 2);
  // The path: quoted just before the reason (busybox: "can't open 'x': ..."
  // - "can't" has a quote too), before the first colon (GNU: "x: Cannot
  // mkdir: ..."), else the last word (busybox: "can't make dir x: ...").
  std::string path;
  const auto open_quote =
      colon >= 2 && line[colon - 1] == '\'' ? line.rfind('\'', colon - 2) : std::string::npos;
  if (open_quote != std::string::npos)
    path = line.substr(open_quote + 1, colon - 1 - open_quote - 1);
  else if (const auto first = line.find(": "); first != colon)
    path = line.substr(0, first);
  else if (const auto space = line.rfind(' ', colon); space != std::string::npos)
    path = line.substr(space + 1, colon - space - 1);
  else
    path = line.substr(0, colon);
  while (path.rfind("./", 0) == 0) path.erase(0, 2);
  std::string where = dir;
  if (!path.empty() && path[0] == '/')
    where = path;
  else if (!path.empty())
    where = (dir == "/" ? "" : dir) + "/" + path;
  return prefix + where + ": " + reason;
}

std::string upload_failure(const std::string& tar_errors, const std::string& dest, int status) {
  return tar_failure(tar_errors, "upload to ", dest, status);
}

int download(const GatewayClient& client, const std::string& name, const std::string& remote,
             const std::string& local) {
  if (remote.empty() || remote[0] != '/')
    throw Error("download: the source must be an absolute path in the sandbox");
  const std::string leaf = base_name(remote);
  if (leaf.empty() || leaf == "/" || leaf == "." || leaf == "..")
    throw Error("download: '" + remote + "' names no file or directory");
  // Into an existing directory, under its own name; or, as docker cp does,
  // as `local` itself when that does not exist yet but its parent does.
  std::string local_dir = local;
  std::string final_path;
  struct stat st;
  if (::stat(local.c_str(), &st) == 0) {
    if (!S_ISDIR(st.st_mode))
      throw Error("download: " + local + " exists and is not a directory; nothing was changed");
    final_path = local + "/" + leaf;
  } else if (errno == ENOENT && ::lstat(local.c_str(), &st) != 0) {
    local_dir = parent_of(local);
    if (!files::is_directory(local_dir))
      throw Error("download: " + local_dir + ": no such directory (the destination's parent " +
                  "must exist)");
    final_path = local;
  } else {
    throw_errno("download: " + local);
  }
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
  UniqueFd tar_errors(static_cast<int>(::syscall(SYS_memfd_create, "tar-errors", MFD_CLOEXEC)));
  if (!tar_errors) throw_errno("download: memfd_create");
  NoSigpipe quiet;
  int status = -1;
  std::string exec_error;
  int exec_code = 125;
  std::thread reader([&] {
    ExecOptions options;
    // After "--", a name such as "-x" is not an option of tar's.
    options.argv = {"tar", "-c", "-f", "-", "-C", parent_of(remote), "--", leaf};
    options.copy = true;
    options.stdin_fd = no_input.get();
    options.stdout_fd = write_end.get();
    options.stderr_fd = tar_errors.get();
    try {
      status = exec(client, name, options);
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
  const std::string errors = read_back(tar_errors.get());
  if (status != 0) {
    clean();
    if (status == 127) files::write_all(STDERR_FILENO, errors);  // a shell's "not found"
    tar_status(status, "download");
    // The sandbox refused: its first complaint says why.
    throw Error(tar_failure(errors, "download of ", parent_of(remote), status));
  }
  files::write_all(STDERR_FILENO, errors);  // warnings
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

// The one libarchive-internal function that its tar writers call, defined
// here, in the object that uses the writer (so that the linker meets it
// first), so that the static link does not pull in libarchive's table of
// every writer (xar's brings libxml2 and ICU). It reports an entry whose
// file type the format cannot hold; upload never asks for one (TarWriter
// refuses anything but files, directories and symbolic links first). If
// another part of openshell ever links that table, the link fails on this
// duplicate definition: loudly, not silently.
extern "C" void __archive_write_entry_filetype_unsupported(struct archive* a,
                                                           struct archive_entry* entry,
                                                           const char* format) {
  const char* path = archive_entry_pathname(entry);
  archive_set_error(a, EINVAL, "%s: %s cannot hold this type of file", path ? path : "(no name)",
                    format ? format : "the archive's format");
}
