#include "supervisor/vm_disks.h"

#include <sys/stat.h>

#include <cerrno>
#include <vector>

#include "base/error.h"
#include "image/flatten.h"

namespace openshell::supervisor {

vm::disk::CachedDisk image_vm_disk(const image::Store& store, const image::ImageRecord& image) {
  std::vector<std::string> layers;
  for (const std::string& diff_id : image.diff_ids) {
    if (!store.has_layer(diff_id))
      throw Error("image " + image.name + ": the store lacks its layer " + diff_id);
    layers.push_back(store.layer_root(diff_id));
  }
  const std::string cache = store.dir() + "/vm-disks";
  if (mkdir(cache.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + cache);
  return vm::disk::image_disk(cache, image.id(), [&layers](const std::string& tree) {
    return image::flatten_layers(layers, tree);
  });
}

std::string sandbox_vm_layer(const std::string& sandbox_dir, uint64_t bytes) {
  std::string file = sandbox_dir + "/layer.ext4";
  vm::disk::writable_layer(file, bytes);
  return file;
}

}  // namespace openshell::supervisor
