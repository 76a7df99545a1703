// A bound on what one pull or import writes into the store. A layer is a
// compressed archive, and gzip packs a GiB of zeros into a MiB: without a
// bound, a small hostile image fills the disk. What counts is what the
// archives declare, before it is written: each regular file at its full
// size (a sparse one too), and every entry (hard links, directories, ...)
// at kEntryCost more; an import's staged archive files count as well.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

namespace openshell::image {

// The default bound is the smaller of this and 90% of the free space of
// the store's file system at the start.
inline constexpr uint64_t kDefaultMaxUnpacked = uint64_t{32} << 30;
// And at most this many entries, whatever their size.
inline constexpr uint64_t kMaxUnpackedEntries = 4'000'000;

class UnpackBudget {
 public:
  // `image` names it in messages. limit: bytes, from --max-unpacked-size;
  // 0: OPENSHELL_MAX_UNPACKED when set (a size: "512M", "20G"), else the
  // default. Throws Error for an OPENSHELL_MAX_UNPACKED that is not a size.
  UnpackBudget(std::string image, const std::string& store_dir, uint64_t limit);
  UnpackBudget(const UnpackBudget&) = delete;
  UnpackBudget& operator=(const UnpackBudget&) = delete;

  // One entry of `bytes` more (thread-safe). Throws Error, one line naming
  // the image, the bound and how to change it, once the total passes it.
  void add_entry(uint64_t bytes);
  // Throws Error when `bytes` (the compressed layers about to be fetched or
  // read) do not fit in the store's free space.
  void check_free_space(uint64_t bytes) const;

  uint64_t limit() const { return limit_; }
  uint64_t used() const { return used_; }

 private:
  std::string image_;
  std::string store_dir_;
  std::string source_;  // where the bound comes from, for messages
  uint64_t limit_ = 0;
  std::atomic<uint64_t> used_{0};
  std::atomic<uint64_t> entries_{0};
};

// Free bytes for an ordinary user on the file system of path; 0 when
// statvfs fails.
uint64_t free_space(const std::string& path);

}  // namespace openshell::image
