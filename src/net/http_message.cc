// The API's message text: the JSON error body and parsed request targets.
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/text.h"
#include "net/http_internal.h"

namespace openshell::net::detail {

// json_text: a message may quote what a client sent (a target, a name), and
// bytes of it that are not UTF-8 become U+FFFD instead of an exception.
std::string error_body(std::string_view code, std::string_view message) {
  return json_text({{"error", {{"code", code}, {"message", message}}}});
}

bool parse_target(std::string_view target, Request& request) {
  if (target.empty() || target[0] != '/') return false;
  size_t question = target.find('?');
  std::string_view path = target.substr(0, question);
  auto decoded = text::percent_decode(path);
  if (!decoded) return false;
  request.path = std::move(*decoded);
  for (size_t start = 1; start <= path.size();) {
    size_t end = path.find('/', start);
    if (end == std::string_view::npos) end = path.size();
    if (end > start) {
      auto segment = text::percent_decode(path.substr(start, end - start));
      if (!segment) return false;
      request.segments.push_back(std::move(*segment));
    }
    start = end + 1;
  }
  if (question == std::string_view::npos) return true;
  std::string_view query = target.substr(question + 1);
  while (!query.empty()) {
    size_t amp = query.find('&');
    std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (pair.empty()) continue;
    size_t equals = pair.find('=');
    auto name = text::percent_decode(pair.substr(0, equals));
    auto value = text::percent_decode(equals == std::string_view::npos ? std::string_view()
                                                                       : pair.substr(equals + 1));
    if (!name || !value) return false;
    request.query[std::move(*name)] = std::move(*value);
  }
  return true;
}

}  // namespace openshell::net::detail
