// The sandbox init's own small program (runtime/init_program.cc), which this
// binary carries: as a sealed memfd, for Container::start to exec in place
// of this whole binary (ContainerSpec::init_image_fd).
#pragma once

#include "base/unique_fd.h"

namespace openshell::runtime {

// A new memfd holding the init's program, sealed against any write, resize
// or further seal (so neither the sandbox, through /proc/1/exe, nor anyone
// else can change what a later sandbox runs). Invalid (-1) where the kernel
// gives none or forbids running one (vm.memfd_noexec=2): the caller then
// runs this binary as the init, as before.
UniqueFd make_init_image();

// Whether fd is such an image: a memfd sealed as make_init_image seals it,
// of the size this binary carries. For an fd a parent passed down.
bool is_init_image(int fd);

// The environment variable that hands a supervisor its gateway's image (the
// fd's number): one image, in memory once, for every sandbox of a gateway.
inline constexpr const char* kInitImageFdVariable = "OPENSHELL_INIT_IMAGE_FD";

}  // namespace openshell::runtime
