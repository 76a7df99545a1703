#include "base/random.h"

#include <climits>
#include <vector>

#include <openssl/err.h>
#include <openssl/rand.h>

#include "base/error.h"
#include "base/text.h"

namespace openshell {

std::string random_hex(size_t bytes) {
  if (bytes > INT_MAX) throw Error("random_hex: too many bytes asked for");
  std::vector<unsigned char> buf(bytes);
  if (bytes > 0 && RAND_bytes(buf.data(), static_cast<int>(bytes)) != 1) {
    char reason[256] = "unknown OpenSSL error";
    if (unsigned long code = ERR_get_error()) ERR_error_string_n(code, reason, sizeof reason);
    ERR_clear_error();
    throw Error(std::string("random bytes: ") + reason);
  }
  return text::hex(buf.data(), buf.size());
}

}  // namespace openshell
