// A path of an image as its sandbox's processes will see it, from the host:
// for a micro-VM, whose root is the image's layers merged inside a guest
// that the host cannot look into, so that a network policy naming
// /usr/bin/python3 is compared with what the guest's kernel reports as the
// caller's executable (/usr/bin/python3.11).
#pragma once

#include <string>
#include <vector>

namespace openshell::image {

// Where `path` (absolute; a relative one is taken from the root) leads in
// the root that the layers (top first: overlayfs lower directories,
// whiteouts as character devices 0:0, opaque directories marked
// user.overlay.opaque) make merged, as flatten_layers makes it: each
// component is looked up in the topmost layer that has it, a directory
// merges the layers below it until one has something else there or it is
// opaque, a whiteout hides the name. Symbolic links are followed inside
// that root (an absolute target starts at its top, ".." stops there), their
// chains too; the result names no symlink, as the kernel's readlink of
// /proc/PID/exe names the file. A path that does not exist there (a
// whiteout, a missing component, a non-directory in the middle, or more
// than 40 links: a loop) resolves to itself, as written. One layer that is
// a plain directory is that directory's tree. Never follows a link out of
// the layers; reads only names, links and directories. Throws nothing.
std::string resolve_in_layers(const std::vector<std::string>& layer_roots_top_first,
                              const std::string& path);

}  // namespace openshell::image
