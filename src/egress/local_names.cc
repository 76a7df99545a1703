#include "egress/local_names.h"

#include "base/text.h"

namespace openshell::egress {

std::optional<std::vector<Address>> local_name_addresses(const std::string& name,
                                                         const std::string& hostname) {
  static const std::string kLocalhost = "localhost";
  const bool below_localhost =
      name.size() > kLocalhost.size() + 1 &&
      name.compare(name.size() - kLocalhost.size() - 1, std::string::npos, ".localhost") == 0;
  if (name == kLocalhost || below_localhost)
    return std::vector<Address>{*Address::parse("127.0.0.1"), *Address::parse("::1")};
  if (!hostname.empty() && name == text::lower(hostname))
    return std::vector<Address>{*Address::parse("127.0.0.1")};
  return std::nullopt;
}

}  // namespace openshell::egress
