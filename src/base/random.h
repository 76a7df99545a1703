// Random bytes for names and nonces that must not be guessed.
#pragma once

#include <cstddef>
#include <string>

namespace openshell {

// Cryptographically random bytes, hex-encoded (the kernel's getrandom): 2*bytes
// characters. Throws Error.
std::string random_hex(size_t bytes);

}  // namespace openshell
