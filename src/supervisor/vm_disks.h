// The disks of a micro-VM sandbox (vm/disk.h) from the image store: the
// image's disk, made once per image and kept in the store beside its layers,
// and the sandbox's writable layer in the sandbox's own directory.
#pragma once

#include <string>

#include "image/store.h"
#include "vm/disk.h"

namespace openshell::supervisor {

// STORE/vm-disks/<image id>.ext4 ("sha256-HEX.ext4"): the image's layers,
// flattened, as one ext4. Made when absent (and the store's vm-disks/ with
// it, mode 0700), found when present. Throws Error naming a layer the store
// lacks, and for vm::disk's failures; a failure leaves no disk.
vm::disk::CachedDisk image_vm_disk(const image::Store& store, const image::ImageRecord& image);

// SANDBOX_DIR/layer.ext4, made empty when absent (vm::disk::writable_layer).
std::string sandbox_vm_layer(const std::string& sandbox_dir,
                             uint64_t bytes = vm::disk::kDefaultLayerBytes);

}  // namespace openshell::supervisor
