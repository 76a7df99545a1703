// Images for the other commands: sandbox create --from pulls what is missing.
#pragma once

#include <string>

namespace openshell::cli {

// Makes sure the image named by `from` is in the store, pulling it (with a
// progress display, plain HTTP with `insecure`) when it is not. "base" is
// never pulled: a missing base image is an error that says how to build it
// and names `option` (--from, --image) for choosing another. Throws Error.
void ensure_image(const std::string& from, bool insecure, const std::string& option);

}  // namespace openshell::cli
