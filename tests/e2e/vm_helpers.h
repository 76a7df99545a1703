// Small helpers of the VM tests (vmm, vmm_devices, vm_sandbox): the small
// guests and crafted kernels built in tests/vm/guests (OSH_VM_GUESTS, which
// meson passes), copied where the tests' users can read them.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "harness.h"

#ifndef OSH_VM_GUESTS
#error "OSH_VM_GUESTS must name the folder of the built guests"
#endif

namespace e2e::vm_helpers {

// The built guest `file` (e.g. "spin.bin"), copied to scratch()/`prefix` +
// `file` and made 0644: a rootless mode's user or the gateway's may not
// reach the build folder. The copy goes with scratch() at the end.
inline std::string readable_guest(const std::string& prefix, const std::string& file) {
  const std::string to = scratch() + "/" + prefix + file;
  std::filesystem::copy_file(std::string(OSH_VM_GUESTS) + "/" + file, to,
                             std::filesystem::copy_options::overwrite_existing);
  ::chmod(to.c_str(), 0644);
  return to;
}

}  // namespace e2e::vm_helpers
