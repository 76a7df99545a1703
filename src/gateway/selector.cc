#include "gateway/selector.h"

#include "base/error.h"
#include "base/text.h"

namespace openshell::gateway {

std::vector<SelectorTerm> parse_selector(const std::string& selector) {
  std::vector<SelectorTerm> terms;
  if (selector.empty()) return terms;
  for (const auto& part : text::split(selector, ',')) {
    SelectorTerm term;
    const auto eq = part.find('=');
    term.key = part.substr(0, eq);
    if (eq != std::string::npos) term.value = part.substr(eq + 1);
    if (term.key.empty())
      throw Error("selector '" + selector + "': " +
                  (part.empty() ? std::string("an empty term") : "'" + part + "' has no key") +
                  " (expected KEY=VALUE or KEY, comma-separated)");
    terms.push_back(std::move(term));
  }
  return terms;
}

bool matches(const std::vector<SelectorTerm>& terms,
             const std::map<std::string, std::string>& labels) {
  for (const auto& term : terms) {
    auto it = labels.find(term.key);
    if (it == labels.end() || (term.value && it->second != *term.value)) return false;
  }
  return true;
}

}  // namespace openshell::gateway
