// overlayfs as a sandbox's root uses it: whether it can stack the root's
// layers on this host, and its mount(2) options for kernels before 6.8.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace openshell::namespaces {

// Whether overlayfs can stack `lowers` (top first) under a writable layer
// made in scratch_dir (an empty directory on the file system that holds the
// sandboxes' writable layers), as a sandbox's root would. Tried in a child
// in new mount (and, rootless, user) namespaces; scratch_dir is emptied
// afterwards. Returns "" when it can, else the reason.
// list_form_only (for tests): skip "lowerdir+" and try what kernels before
// 6.8 get.
std::string overlay_problem(const std::vector<std::string>& lowers, const std::string& scratch_dir,
                            bool list_form_only = false);

// The mount(2) options of an overlay in the list form (kernels before 6.8,
// whose fsconfig() takes no "lowerdir+" and strings of at most 256 bytes):
// "lowerdir=LOWERS,upperdir=UPPER,workdir=WORK,userxattr", with LOWERS as
// overlay_lowerdir_list() makes it and upper and work escaped the same
// way. Async-signal-safe; false when it does not fit in `size`.
bool overlay_list_options(char* out, size_t size, const char* lowers, const char* upper,
                          const char* work);

// The value of overlayfs's "lowerdir" option for these directories (top
// first): joined with ':', with ':', ',' and '\\' escaped by a backslash.
std::string overlay_lowerdir_list(const std::vector<std::string>& lowers);

}  // namespace openshell::namespaces
