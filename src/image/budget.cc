#include "image/budget.h"

#include <sys/statvfs.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "base/error.h"
#include "base/text.h"

namespace openshell::image {

namespace {

constexpr const char* kHow =
    "set a larger bound with --max-unpacked-size SIZE or OPENSHELL_MAX_UNPACKED=SIZE";

}  // namespace

uint64_t free_space(const std::string& path) {
  struct statvfs st;
  if (::statvfs(path.c_str(), &st) != 0) return 0;
  return static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
}

UnpackBudget::UnpackBudget(std::string image, const std::string& store_dir, uint64_t limit)
    : image_(std::move(image)), store_dir_(store_dir) {
  if (limit > 0) {
    limit_ = limit;
    source_ = "--max-unpacked-size";
    return;
  }
  if (const char* env = std::getenv("OPENSHELL_MAX_UNPACKED"); env && *env) {
    auto bytes = text::parse_size(env);
    if (!bytes || *bytes == 0)
      throw Error(std::string("OPENSHELL_MAX_UNPACKED=") + env + ": not a size (like 512M or 20G)");
    limit_ = *bytes;
    source_ = "OPENSHELL_MAX_UNPACKED";
    return;
  }
  const uint64_t free = free_space(store_dir);
  limit_ = std::min(kDefaultMaxUnpacked, free / 10 * 9);
  source_ = limit_ == kDefaultMaxUnpacked ? "the default bound"
                                          : "the default bound: 90% of the " +
                                                text::format_bytes(free) + " free on " + store_dir;
}

void UnpackBudget::add_entry(uint64_t bytes) {
  const uint64_t total = used_.fetch_add(bytes) + bytes;
  if (total > limit_)
    throw Error(image_ + ": unpacks to more than " + text::format_bytes(limit_) + " (" + source_ +
                "); " + kHow);
  if (entries_.fetch_add(1) + 1 > kMaxUnpackedEntries)
    throw Error(image_ + ": holds more than " + std::to_string(kMaxUnpackedEntries) + " files");
}

void UnpackBudget::check_free_space(uint64_t bytes) const {
  const uint64_t free = free_space(store_dir_);
  if (bytes > free)
    throw Error(image_ + ": its layers take " + text::format_bytes(bytes) + ", more than the " +
                text::format_bytes(free) + " free on " + store_dir_);
}

}  // namespace openshell::image
