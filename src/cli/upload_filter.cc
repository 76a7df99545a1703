#include "cli/upload_filter.h"

#include <fcntl.h>
#include <fnmatch.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/unique_fd.h"

extern char** environ;

namespace openshell::cli {

namespace {

// git ARGS... in `dir`; its stdout, and whether it exited 0. nullopt when
// there is no git to run.
std::optional<std::pair<std::string, bool>> run_git(const std::string& dir,
                                                    const std::vector<std::string>& args) {
  std::vector<std::string> words = {"git", "-C", dir,
                                    // Nothing in the repository's config runs a program.
                                    "-c", "core.fsmonitor=false"};
  words.insert(words.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& w : words) argv.push_back(w.data());
  argv.push_back(nullptr);
  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd read_end(ends[0]), write_end(ends[1]);
  posix_spawn_file_actions_t actions;
  ::posix_spawn_file_actions_init(&actions);
  ::posix_spawn_file_actions_adddup2(&actions, write_end.get(), STDOUT_FILENO);
  ::posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
  pid_t child;
  const int err = ::posix_spawnp(&child, "git", &actions, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&actions);
  if (err == ENOENT) return std::nullopt;
  if (err) throw_errno("upload: run git", err);
  write_end.reset();
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(read_end.get(), buf, sizeof buf)) != 0) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  int status = 0;
  while (::waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  return std::make_pair(out, WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// git's answer: the files it would commit, and every directory above them.
GitIgnore from_git(const std::string& listing) {
  auto files = std::make_shared<std::set<std::string>>();
  auto dirs = std::make_shared<std::set<std::string>>();
  size_t start = 0;
  while (start < listing.size()) {
    size_t end = listing.find('\0', start);
    if (end == std::string::npos) end = listing.size();
    std::string path = listing.substr(start, end - start);
    start = end + 1;
    if (path.empty()) continue;
    for (size_t slash = path.find('/'); slash != std::string::npos;
         slash = path.find('/', slash + 1))
      dirs->insert(path.substr(0, slash));
    files->insert(std::move(path));
  }
  return {[files, dirs](const std::string& rel, bool is_dir) {
            if (files->count(rel) || (is_dir && dirs->count(rel))) return true;
            // Below a submodule (git lists it as one entry): all of it.
            for (size_t slash = rel.find('/'); slash != std::string::npos;
                 slash = rel.find('/', slash + 1))
              if (files->count(rel.substr(0, slash))) return true;
            return false;
          },
          "git"};
}

struct Pattern {
  std::string glob;
  bool negated = false, directory_only = false, anchored = false;
};

std::vector<Pattern> parse_gitignore(const std::string& text) {
  std::vector<Pattern> patterns;
  for (std::string line : text::split(text, '\n')) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    while (!line.empty() && line.back() == ' ') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    Pattern p;
    if (line[0] == '!') {
      p.negated = true;
      line.erase(0, 1);
    }
    if (!line.empty() && line.back() == '/') {
      p.directory_only = true;
      line.pop_back();
    }
    if (!line.empty() && line[0] == '/') {
      p.anchored = true;
      line.erase(0, 1);
    }
    if (line.find('/') != std::string::npos) p.anchored = true;
    if (line.empty()) continue;
    p.glob = line;
    patterns.push_back(std::move(p));
  }
  return patterns;
}

// The .gitignore files from `root` down, each read once.
class GitIgnoreFiles {
 public:
  explicit GitIgnoreFiles(std::string root) : root_(std::move(root)) {}

  bool keep(const std::string& rel, bool is_dir) {
    const std::string name = rel.substr(rel.rfind('/') + 1);
    if (name == ".git") return false;
    // Each directory above the entry, the uploaded one first: a later
    // (deeper) match wins over an earlier one.
    std::optional<bool> ignored;
    std::string dir;  // relative to root; "" for root itself
    for (;;) {
      const std::string below = dir.empty() ? rel : rel.substr(dir.size() + 1);
      for (const auto& p : patterns_of(dir)) {
        if (p.directory_only && !is_dir) continue;
        const bool match = p.anchored ? ::fnmatch(p.glob.c_str(), below.c_str(), FNM_PATHNAME) == 0
                                      : ::fnmatch(p.glob.c_str(), name.c_str(), 0) == 0;
        if (match) ignored = !p.negated;
      }
      const size_t next = rel.find('/', dir.empty() ? 0 : dir.size() + 1);
      if (next == std::string::npos) break;
      dir = rel.substr(0, next);
    }
    return !ignored.value_or(false);
  }

 private:
  const std::vector<Pattern>& patterns_of(const std::string& dir) {
    auto it = cache_.find(dir);
    if (it != cache_.end()) return it->second;
    const std::string file = root_ + (dir.empty() ? "" : "/" + dir) + "/.gitignore";
    return cache_[dir] = parse_gitignore(files::try_read(file).value_or(""));
  }

  std::string root_;
  std::map<std::string, std::vector<Pattern>> cache_;
};

}  // namespace

GitIgnore git_ignore_filter(const std::string& local) {
  auto inside = run_git(local, {"rev-parse", "--is-inside-work-tree"});
  if (inside && inside->second && text::trim(inside->first) == "true") {
    auto listing = run_git(local, {"ls-files", "-z", "--cached", "--others", "--exclude-standard"});
    if (!listing || !listing->second)
      throw Error("upload: " + local + ": git ls-files failed (--no-git-ignore copies everything)");
    return from_git(listing->first);
  }
  auto files = std::make_shared<GitIgnoreFiles>(local);
  return {[files](const std::string& rel, bool is_dir) { return files->keep(rel, is_dir); },
          ".gitignore files"};
}

}  // namespace openshell::cli
