// Directories through file descriptors: an entry reader that allocates
// nothing, a lister on top of it, and one rm -rf that never follows a
// symbolic link and never leaves the file system it starts on.
#pragma once

#include <dirent.h>

#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/unique_fd.h"

namespace openshell::files {

// The entries of an open directory but "." and "..", read from its start
// with getdents64. It owns no fd and allocates nothing, so a child between
// clone and exec may use it.
class EntryReader {
 public:
  explicit EntryReader(int dir_fd);
  EntryReader(const EntryReader&) = delete;
  EntryReader& operator=(const EntryReader&) = delete;

  // The next entry; nullptr at the end, or on an error (then error() is its errno).
  const dirent64* next();
  int error() const { return error_; }

 private:
  int fd_;
  long size_ = 0, pos_ = 0;
  int error_ = 0;
  alignas(8) char buf_[8192];
};

// visit(name, type) for each entry of a directory but "." and ".." (type: a
// DT_* value, DT_UNKNOWN where the file system does not say); visit returns
// false to stop. Returns 0, or the errno of opening or reading it. The
// directory opened from path is closed however this ends, a throw from
// visit included.
using EntryVisitor = std::function<bool(const char* name, unsigned char type)>;
int for_each_entry(int dir_fd, const EntryVisitor& visit);
int for_each_entry(const std::string& path, const EntryVisitor& visit);

// The names in directory path, sorted; none when it does not exist. Throws
// Error("read PATH: reason").
std::vector<std::string> list_directory(const std::string& path);

// rm -rf of the entry `name` of the directory open as parent_fd (O_PATH
// will do): a file or link is unlinked, a directory emptied and removed.
// Never follows a symbolic link; never enters another mount (EXDEV, or
// EBUSY from the kernel for an empty mount point), the entry itself included; gives directories
// owner rwx where their modes stand in the way (overlayfs leaves work/work mode 000). An entry that
// is absent is fine. Returns 0 or an errno. Allocates nothing and throws nothing (a child between
// clone and exec may call it); holds at most 18 fds, whatever the depth.
int remove_tree_at(int parent_fd, const char* name) noexcept;

// What remove_tree_at works on for path: its parent directory (O_PATH;
// invalid when the parent does not exist, so neither does path) and its
// last component. Throws Error("remove PATH: ...") for a path with no last
// component to remove ("", "/", ".", "..") or a parent it cannot open.
struct RemovalTarget {
  UniqueFd parent;
  std::string name;
  static RemovalTarget open(const std::string& path);
};

// Error("remove PATH: reason") for remove_tree_at's errno ("is or holds a
// mount point; unmount it first" for EXDEV and EBUSY).
Error removal_error(const std::string& path, int err);

// rm -rf path, as remove_tree_at. Throws removal_error.
void remove_tree(const std::string& path);

}  // namespace openshell::files
