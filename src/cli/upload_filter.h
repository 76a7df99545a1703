// What `sandbox upload` of a directory leaves out: what .gitignore says, as
// OpenShell's --upload does (--no-git-ignore copies everything).
//
// In a git work tree, and with git installed, git itself decides: the
// files `git ls-files --cached --others --exclude-standard` lists (every
// ignore rule git knows: .gitignore at every level, .git/info/exclude,
// core.excludesFile). Directories that hold none of them are left out, as
// git does not track empty directories, and so is .git.
//
// Elsewhere, the .gitignore files in the directory and below, read here,
// with this much of git's syntax: blank lines and '#' comments; '!' to
// include again; a trailing '/' for directories only; a pattern with a
// '/' elsewhere is relative to its .gitignore's directory, one without
// matches a name at any depth below it; '*', '?' and [...] as in fnmatch
// ('*' stops at '/'). Not understood: '**' (it acts as '*'), and escapes
// with '\'. A deeper .gitignore's rule wins, and the last matching line in
// a file; a directory left out is left out whole (as in git). .git is
// always left out.
#pragma once

#include <functional>
#include <string>

namespace openshell::cli {

// Whether an entry (its path relative to the uploaded directory, "a/b.txt",
// and whether it is a directory) is copied. Directories: false leaves out
// everything below too.
using UploadFilter = std::function<bool(const std::string& relative, bool is_directory)>;

struct GitIgnore {
  UploadFilter filter;
  std::string how;  // "git" or ".gitignore files"
};

// The filter for the directory `local`. Throws Error when git, in a work
// tree, fails.
GitIgnore git_ignore_filter(const std::string& local);

}  // namespace openshell::cli
