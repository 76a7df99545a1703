#include "base/child_failure.h"

#include <cstring>

namespace openshell {

std::string ChildFailure::message() const {
  std::string out = what;
  if (detail[0]) {
    if (!out.empty() && out.back() != '/') out += ' ';
    out += detail;
  }
  if (err) out += std::string(": ") + std::strerror(err);
  return out;
}

}  // namespace openshell
