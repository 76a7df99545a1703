// A root file system as one plain directory: for file systems where
// overlayfs cannot stack a sandbox's root, each sandbox gets its own copy.
#pragma once

#include <string>
#include <vector>

namespace openshell::image {

// Copies the layers (bottom first: overlayfs lower directories, whiteouts
// as character devices 0:0, opaque directories marked user.overlay.opaque)
// into dest, a new empty directory, as overlayfs would show them merged.
// Symbolic links are copied, never followed; owners are kept when running
// as root, else everything belongs to the caller. Returns the bytes of file
// content copied. Throws Error.
uint64_t flatten_layers(const std::vector<std::string>& layers_bottom_first,
                        const std::string& dest);

}  // namespace openshell::image
