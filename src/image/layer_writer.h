// Writing directories as one image layer: the unpacker (image/unpack.h) in
// reverse. The tar is PAX (libarchive), gzip-compressed (zlib), and the same
// tree always gives the same bytes: names sorted, numeric owners only, mtimes
// in whole seconds, no atime or ctime, a gzip header without a time.
//
// What the tree holds becomes what unpack_layer turns back into it:
//   - directories, regular files, symbolic links and FIFOs, with mode, owner
//     (numeric, through the id maps below) and mtime;
//   - files sharing an inode: the first by name, the others hard links to it;
//   - security.capability of a regular file, as a PAX extended attribute
//     (the one attribute the unpacker restores);
//   - an overlayfs whiteout (character device 0:0) becomes ".wh.NAME", an
//     opaque directory (user.overlay.opaque or trusted.overlay.opaque "y")
//     gets ".wh..wh..opq" right after its own entry.
// Symbolic links are written, never followed. Sockets are skipped (nothing
// can unpack one). Any other device node is refused, and so is a name
// starting with ".wh." (it would read as a whiteout).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace openshell::image {

// One line of a uid_map or gid_map: ids [host, host+count) on the host are
// [inside, inside+count) in the layer.
struct IdRange {
  uint32_t inside = 0;
  uint32_t host = 0;
  uint32_t count = 0;
};

// A directory whose contents go into the layer below `prefix` ("" for the
// layer's root; "sandbox" puts them at /sandbox, with an entry for
// "sandbox" itself carrying the directory's own metadata).
struct LayerSource {
  std::string dir;
  std::string prefix;
};

struct LayerWriteOptions {
  // Host ids -> ids in the layer (a rootless sandbox's files belong to
  // subordinate ids). Empty: ids as they are. An id no range covers becomes
  // 65534, the overflow id the sandbox itself saw for it.
  std::vector<IdRange> uid_map;
  std::vector<IdRange> gid_map;
  // Optional: uncompressed bytes written so far, every 256 KiB or so and
  // once at the end.
  std::function<void(uint64_t bytes)> progress;
};

struct LayerBlob {
  std::string diff_id;  // "sha256:..." of the uncompressed tar
  std::string digest;   // "sha256:..." of the gzip blob
  uint64_t size = 0;    // bytes of the gzip blob
  uint64_t tar_size = 0;
  uint64_t content_bytes = 0;  // the regular files' sizes, summed (as UnpackResult)
  uint64_t entries = 0;
};

// Writes the sources, in order, as one gzip-compressed layer to out_fd.
// `what` names the layer in messages. Throws Error: "WHAT: 'PATH': REASON"
// for a refused or unreadable entry.
LayerBlob write_layer(const std::vector<LayerSource>& sources, int out_fd,
                      const LayerWriteOptions& options, const std::string& what);

// The ids a map gives (see LayerWriteOptions).
uint32_t map_id(const std::vector<IdRange>& map, uint32_t host_id);

}  // namespace openshell::image
