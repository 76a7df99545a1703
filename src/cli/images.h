// Images for the other commands: sandbox create --from pulls what is missing.
#pragma once

#include <string>

namespace openshell::cli {

// Makes sure the image named by `from` is in the store, pulling it (with a
// progress display, plain HTTP with `insecure`) when it is not. "base" is
// never pulled: a missing base image is an error that says how to build it
// and names `option` (--from, --image) for choosing another. Throws Error.
// The store is this OPENSHELL_HOME's (openshell run's, and the local
// gateway's).
void ensure_image(const std::string& from, bool insecure, const std::string& option);
// The same in the store at images_dir (another local gateway's).
void ensure_image_in(const std::string& images_dir, const std::string& from, bool insecure,
                     const std::string& option);

// The image store of the chosen gateway (cli/gateway_registry.h): this
// OPENSHELL_HOME's, or another local gateway's. Throws Error for a remote
// gateway, whose store this machine cannot reach.
std::string chosen_images_dir();

}  // namespace openshell::cli
