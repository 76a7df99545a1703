// Reading a file of an untrusted root file system (an image's layer, a
// sandbox's copy of its root) from the host, as the root would show it to
// its own processes and no further: its symbolic links resolve inside it,
// so that "etc -> /etc" or "etc/passwd -> /dev/zero" in a hostile image
// never reach the host's files, and a read is bounded.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace openshell::files {

// The most read_in_root reads of one file: /etc/passwd and /etc/group of a
// real system are far smaller.
inline constexpr size_t kMaxRootFile = 4 << 20;

// Reads `path` (relative to root; a leading "/" is the root's own) inside
// the directory `root`, with openat2's RESOLVE_IN_ROOT and
// RESOLVE_NO_MAGICLINKS: absolute symlinks and ".." stop at root. Only a
// regular file is read (a FIFO does not block it). nullopt when
// it does not exist there. Throws Error naming ROOT/PATH: "not a regular
// file", "larger than 4 MiB", or the system's error.
std::optional<std::string> read_in_root(const std::string& root, const std::string& path,
                                        size_t max = kMaxRootFile);

// What `path` is in the layer `root` on its own, without following its last
// component: kAbsent, kWhiteout (a character device 0:0: it hides lower
// layers' path), kSymlink (with link_target given: its target, read into
// *link_target), or kPresent (anything else, a symlink loop among its
// parents included).
enum class LayerEntry { kAbsent, kWhiteout, kSymlink, kPresent };
LayerEntry layer_entry(const std::string& root, const std::string& path,
                       std::string* link_target = nullptr);

// Where a symlink in directory `dir` (relative to a root) pointing at
// `target` leads, relative to that root, as the root's own processes see
// it: an absolute target starts at the root, and ".." stops there. Lexical:
// what it names is looked up inside a root again.
std::string join_in_root(const std::string& dir, const std::string& target);

}  // namespace openshell::files
