#include "image/build_cache.h"

#include <sys/stat.h>

#include <cerrno>

#include "base/error.h"
#include "base/files.h"
#include "image/digest.h"
#include "image/store.h"

namespace openshell::image {

std::string step_key(std::string_view parent, std::string_view text, std::string_view extra) {
  Sha256 sha;
  for (std::string_view part : {parent, text, extra}) {
    sha.update(std::to_string(part.size()) + ":");
    sha.update(part);
  }
  return sha.digest();
}

std::string cache_dir(const Store& store) { return store.dir() + "/build-cache"; }

std::optional<std::string> cache_lookup(const Store& store, const std::string& key) {
  auto text = files::try_read(cache_dir(store) + "/" + digest_hex(key, "cache key") + ".json");
  if (!text) return std::nullopt;
  return *text;
}

void cache_store(const Store& store, const std::string& key, const std::string& state_json) {
  const std::string dir = cache_dir(store);
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + dir);
  files::write_atomically(dir + "/" + digest_hex(key, "cache key") + ".json", state_json);
}

}  // namespace openshell::image
