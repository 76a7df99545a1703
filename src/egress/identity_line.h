// The identity line a micro-VM's guest init writes first on each egress
// connection it relays (docs/vm.md): who in the guest opened the connection,
// as the guest saw it, since the supervisor cannot look into the guest's
// /proc. One JSON object on one line:
//
//   {"pid":1234,"exe":"/usr/bin/curl","untrusted":""}\n
//
// pid: the process in the guest (0 when unknown); exe: its executable as
// the guest sees it ("" when unknown); untrusted: why it must not be
// credited as exe (identity.h's rules), "" when it may.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "egress/identity.h"

namespace openshell::egress {

// The most bytes read for the line, its newline included: a line that has
// not ended by then is refused.
inline constexpr size_t kMaxIdentityLine = 4096;

// The line without its newline. nullopt, with *why set, for anything but
// exactly that object: not JSON, another key, a key missing or twice, a pid
// that is not a whole number up to 2^31-1, an exe that is neither "" nor
// absolute, a NUL in a string. A caller that gets nullopt credits no one.
std::optional<Caller> parse_identity_line(std::string_view line, std::string* why);

}  // namespace openshell::egress
