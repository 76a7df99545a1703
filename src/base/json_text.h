// JSON text for anything that may hold bytes from an untrusted side: names a
// sandbox sends to its proxy or DNS stub, paths of its programs, messages
// that quote them. nlohmann's dump() throws on a string that is not UTF-8;
// these never do.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

namespace openshell {

// value as JSON text (compact, or pretty with indent >= 0). Bytes of a
// string that are not valid UTF-8 become U+FFFD; the rest is as dump().
std::string json_text(const nlohmann::json& value, int indent = -1);

// text cut to at most max bytes, ending in "...(N bytes)" when it was longer:
// a field of a log line that the other side chooses must not make the line
// itself long.
std::string clip(std::string_view text, size_t max);

}  // namespace openshell
