#include "base/random.h"

#include <sys/random.h>

#include <cerrno>
#include <climits>
#include <vector>

#include "base/error.h"
#include "base/text.h"

namespace openshell {

// The kernel's generator (getrandom(2), which blocks only until it is
// seeded at boot), not OpenSSL's: a process's first RAND_bytes sets up
// OpenSSL's providers and DRBG, about a quarter of a new supervisor's CPU
// (it names its temporary files with these).
std::string random_hex(size_t bytes) {
  if (bytes > INT_MAX) throw Error("random_hex: too many bytes asked for");
  std::vector<unsigned char> buf(bytes);
  size_t got = 0;
  while (got < bytes) {
    ssize_t n = ::getrandom(buf.data() + got, bytes - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_errno("random bytes (getrandom)");
    }
    got += static_cast<size_t>(n);
  }
  return text::hex(buf.data(), buf.size());
}

}  // namespace openshell
