#include "vm/disk.h"

#include <fcntl.h>
#include <ftw.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <string_view>
#include <vector>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/random.h"
#include "base/unique_fd.h"

extern char** environ;

namespace openshell::vm::disk {

namespace {

// The last non-empty line of a tool's output, for the one-line error.
std::string last_line(const std::string& text) {
  size_t end = text.find_last_not_of("\n ");
  if (end == std::string::npos) return "";
  size_t start = text.rfind('\n', end);
  start = start == std::string::npos ? 0 : start + 1;
  return text.substr(start, end - start + 1);
}

// Runs argv with stdin from /dev/null and stdout and stderr captured;
// returns the exit status (-1: not found) and fills *output.
int run_tool(const std::vector<std::string>& argv, std::string* output) {
  int pipe_fds[2];
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), 1);
  posix_spawn_file_actions_adddup2(&actions, write_end.get(), 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  // Also in /usr/sbin and /sbin, which an ordinary user's PATH may lack.
  std::string path_env = "PATH=/usr/sbin:/sbin:/usr/bin:/bin";
  std::vector<char*> env = {path_env.data(), nullptr};
  int rc = -1;
  for (const char* dir : {"/usr/sbin/", "/sbin/", "/usr/bin/", "/bin/"}) {
    std::string full = std::string(dir) + argv[0];
    if (access(full.c_str(), X_OK) != 0) continue;
    rc = posix_spawn(&pid, full.c_str(), &actions, nullptr, args.data(), env.data());
    break;
  }
  posix_spawn_file_actions_destroy(&actions);
  write_end.reset();
  if (rc == -1) return -1;
  if (rc != 0) throw_errno("run " + argv[0], rc);
  char buf[4096];
  for (;;) {
    ssize_t n = read(read_end.get(), buf, sizeof buf);
    if (n > 0) {
      if (output->size() < 65536) output->append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    break;
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw_errno("wait for " + argv[0]);
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

thread_local uint64_t walked_entries = 0;
thread_local uint64_t walked_bytes = 0;

int count_one(const char*, const struct stat* st, int, struct FTW*) {
  ++walked_entries;
  if (S_ISREG(st->st_mode)) walked_bytes += static_cast<uint64_t>(st->st_size);
  return 0;
}

// Every file, directory and link under dir (never following a link).
uint64_t count_entries(const std::string& dir) {
  walked_entries = 0;
  walked_bytes = 0;
  if (nftw(dir.c_str(), count_one, 16, FTW_PHYS | FTW_MOUNT) != 0) throw_errno("walk " + dir);
  return walked_entries;
}

bool key_ok(const std::string& key) {
  if (key.empty() || key.size() > 200 || key[0] == '.') return false;
  for (char c : key) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == ':' || c == '.' || c == '_' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

uint64_t size_for(uint64_t content_bytes, uint64_t entries) {
  // Each entry: an inode (256 bytes), a directory entry and, rounded up,
  // a 4 KiB block; the content itself half again for block tails and
  // extent trees; 64 MiB for the journal and the groups' tables.
  uint64_t bytes = content_bytes + content_bytes / 2 + entries * 4608 + 64 * kMiB;
  return (bytes + kMiB - 1) / kMiB * kMiB;
}

void make_ext4(const std::string& file, uint64_t bytes, const std::string& from_dir,
               const std::string& label) {
  if (bytes < 4 * kMiB) throw Error("disk " + file + ": size under 4 MiB");
  if (files::exists(file)) throw Error("disk " + file + ": already exists");
  std::string tmp = file + ".tmp." + random_hex(6);
  {
    UniqueFd fd(open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
    if (!fd) throw_errno("create " + tmp);
    if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
      int err = errno;
      unlink(tmp.c_str());
      throw_errno("size " + tmp, err);
    }
  }
  std::vector<std::string> argv = {
      "mkfs.ext4", "-q", "-F", "-L", label, "-E", "lazy_itable_init=0,lazy_journal_init=0"};
  if (!from_dir.empty()) {
    argv.push_back("-d");
    argv.push_back(from_dir);
  }
  argv.push_back(tmp);
  std::string output;
  int status;
  try {
    status = run_tool(argv, &output);
  } catch (...) {
    unlink(tmp.c_str());
    throw;
  }
  if (status != 0) {
    unlink(tmp.c_str());
    if (status == -1) throw Error("disk " + file + ": needs mkfs.ext4 (apt-get install e2fsprogs)");
    std::string why = last_line(output);
    throw Error("disk " + file + ": mkfs.ext4 failed (exit " + std::to_string(status) + ")" +
                (why.empty() ? "" : ": " + why));
  }
  if (rename(tmp.c_str(), file.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    throw_errno("rename " + tmp + " to " + file, err);
  }
}

CachedDisk image_disk(const std::string& cache_dir, const std::string& key, const Filler& fill) {
  if (!key_ok(key)) throw Error("disk: bad image key \"" + key + "\" (want [A-Za-z0-9:._-])");
  std::string name = key;
  for (char& c : name)
    if (c == ':') c = '-';
  std::string path = cache_dir + "/" + name + ".ext4";
  if (files::exists(path)) return {path, false};
  std::string tree = cache_dir + "/." + name + ".tree." + random_hex(6);
  if (mkdir(tree.c_str(), 0700) != 0) throw_errno("create " + tree);
  try {
    uint64_t content = fill(tree);
    make_ext4(path, size_for(content, count_entries(tree)), tree, "osh-image");
  } catch (...) {
    files::remove_tree(tree);
    throw;
  }
  files::remove_tree(tree);
  return {path, true};
}

void directory_disk(const std::string& file, const std::string& dir) {
  const uint64_t entries = count_entries(dir);
  const uint64_t bytes = walked_bytes;
  if (unlink(file.c_str()) != 0 && errno != ENOENT) throw_errno("remove " + file);
  make_ext4(file, size_for(bytes, entries), dir, "osh-root");
}

bool writable_layer(const std::string& file, uint64_t bytes) {
  if (files::exists(file)) return false;
  make_ext4(file, bytes, "", "osh-layer");
  return true;
}

}  // namespace openshell::vm::disk
