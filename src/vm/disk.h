// The micro-VM sandbox's disks: ext4 images made with e2fsprogs' mkfs.ext4
// (`mkfs.ext4 -d DIR`, no loop device, no mount, no root needed).
//
//   the image disk     the image's layers flattened into one tree, made once
//                      per image and kept in a cache directory; the guest
//                      mounts it read-only as the overlay's lower layer
//   the writable layer one per sandbox, empty at first; the guest mounts it
//                      read-write and keeps the overlay's upper and work
//                      directories on it, so it survives stop and start
#pragma once

#include <cstdint>
#include <functional>
#include <string>

namespace openshell::vm::disk {

inline constexpr uint64_t kMiB = 1024 * 1024;
// A writable layer's default size; the file is sparse.
inline constexpr uint64_t kDefaultLayerBytes = 1024 * kMiB;

// The size of a disk for a tree holding content_bytes of files and
// entries inodes: room for the content, its metadata and 64 MiB more,
// rounded up to a MiB.
uint64_t size_for(uint64_t content_bytes, uint64_t entries);

// Makes an ext4 file system of `bytes` in the new file `file` (mode 0600),
// filled from `from_dir` when not empty (owners, modes, links, devices as
// they are there). The file appears whole or not at all: mkfs.ext4 writes
// a temp file beside it that is renamed into place, and removed on any
// failure. Throws Error with mkfs.ext4's last line of complaint, or naming
// a missing mkfs.ext4 ("apt-get install e2fsprogs").
void make_ext4(const std::string& file, uint64_t bytes, const std::string& from_dir,
               const std::string& label);

// Fills `dir` (new and empty) with the image's tree; returns the bytes of
// file content it wrote.
using Filler = std::function<uint64_t(const std::string& dir)>;

struct CachedDisk {
  std::string path;
  bool made = false;  // false: the cache already held it
};

// The image disk for `key` (an image's digest, "sha256:HEX") in cache_dir:
// cache_dir/KEY.ext4 (":" written as "-"). When absent, fill() makes the
// tree in a temp directory of cache_dir, the disk is made from it and the
// tree removed, whatever happens. Throws Error for a key with characters
// other than [A-Za-z0-9:._-], and for the failures of make_ext4.
CachedDisk image_disk(const std::string& cache_dir, const std::string& key, const Filler& fill);

// The sandbox's writable layer at `file`: made empty (ext4 of `bytes`,
// label "osh-layer") when absent, kept as it is when present, so what the
// sandbox wrote survives a stop and a start. Returns true when it made it.
// A disk of the directory `dir` as it is now, in `file` (made again when
// present: a sandbox from a directory sees the directory's changes at its
// next start, as a container sandbox's overlay does).
void directory_disk(const std::string& file, const std::string& dir);

bool writable_layer(const std::string& file, uint64_t bytes = kDefaultLayerBytes);

}  // namespace openshell::vm::disk
