// Extracting one image layer (OCI image spec "layer", Docker's layer.tar)
// into a directory that overlayfs can use as a lower layer.
//
// A layer is a tar archive (ustar, pax or GNU), plain or compressed with gzip
// or zstd; the compression is recognised from the first bytes, never from a
// media type. Two digests come out of one pass: the blob digest (the bytes as
// read) and the diff_id (the whole uncompressed stream, including whatever
// follows the end-of-archive blocks).
//
// The archive is untrusted, and what it may do is bounded:
//   - Nothing outside dest is created, modified or followed. Entry names are
//     relative and without "..". Parents are resolved below dest without
//     following any symlink, so a symlink in the archive ("evil" -> "/etc",
//     "up" -> "..") can be created but never used as a way out; an entry under
//     it is refused. Files are created O_EXCL|O_NOFOLLOW below a resolved
//     parent; a hard link's target must be a non-directory this layer made.
//   - Device nodes and sockets are refused. FIFOs are created.
//   - Extended attributes from the archive are ignored, except
//     security.capability when running as root (trusted.* and user.overlay.*
//     would steer overlayfs).
//   - Files out of a sandbox (UnpackOptions::from_sandbox) are held to
//     narrower rules still: see there.
// Whiteouts become what overlayfs reads (our mounts use "userxattr"):
// ".wh.NAME" becomes NAME as a character device 0:0, and ".wh..wh..opq" in D
// sets user.overlay.opaque="y" on D. No ".wh." name is ever created.
// A later entry replaces an earlier one of the same name; a directory entry
// over a directory only updates its metadata. Directories keep owner rwx
// while the layer is written and get their own mode, owner and mtime at the
// end, deepest first.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <functional>
#include <string>

namespace openshell::image {

struct UnpackOptions {
  // true: entries belong to the archive's numeric uid/gid; false: to the
  // caller.
  bool preserve_owners = ::geteuid() == 0;
  // true: ".wh." names are overlayfs whiteouts (an image layer); false: a
  // plain archive, whose ".wh." names are files like any other.
  bool whiteouts = true;
  // true: the archive holds files out of a sandbox (sandbox download), which
  // are more hostile than an image layer, and the rules are narrower:
  //   - entries belong to the caller (preserve_owners is ignored);
  //   - modes lose set-uid, set-gid and sticky bits, and `umask` applies;
  //   - no extended attribute is written (security.capability included);
  //   - FIFOs are refused like device nodes and sockets;
  //   - a symbolic link must point inside the archive's top-level entry: a
  //     relative target whose ".." components (leading ones only) do not
  //     climb out of it; a top-level symbolic link is refused;
  //   - ".wh." names are plain names (whiteouts is ignored).
  bool from_sandbox = false;
  mode_t umask = 022;  // with from_sandbox: the caller's
  // Optional: called before each entry is written with what it adds to the
  // unpacked size (its declared size for a regular file, sparse or not, plus
  // kEntryCost for any entry: hard links and directories take an inode too).
  // An exception thrown here stops the extraction and comes out of
  // unpack_layer; the bytes are not written.
  std::function<void(uint64_t bytes)> account;
  // Optional: compressed bytes read so far, called every 256 KiB or so and
  // once at the end. An exception thrown here stops the extraction and comes
  // out of unpack_layer.
  std::function<void(uint64_t bytes_read)> progress;
};

// What an entry costs in UnpackOptions::account beyond its data.
inline constexpr uint64_t kEntryCost = 512;

struct UnpackResult {
  std::string diff_id;            // "sha256:..." of the uncompressed tar stream
  std::string compressed_digest;  // "sha256:..." of the bytes read from fd
  uint64_t compressed_size = 0;
  uint64_t content_bytes = 0;  // the regular files' sizes, summed
  uint64_t entries = 0;        // archive entries, whiteouts included
};

// Reads a layer from fd (to its end) into dest, an existing empty directory.
// `what` names the layer in messages ("layer sha256:ab12…"). Throws Error:
// "WHAT: entry 'PATH': REASON" for a refused entry, "WHAT: REASON" for a
// corrupt or truncated stream, "WHAT: ...: STRERROR" when the system fails.
// On error dest may hold part of the layer; the caller removes it.
UnpackResult unpack_layer(int fd, const std::string& dest, const UnpackOptions& options,
                          const std::string& what);

}  // namespace openshell::image
