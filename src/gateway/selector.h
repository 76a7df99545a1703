// Label selectors for `sandbox list -l`: "team=x,tier=web" matches the
// sandboxes that have every term (comma means AND, as in Kubernetes and
// OpenShell); a term is KEY=VALUE (the label has that value) or KEY (the
// label is there, whatever its value).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace openshell::gateway {

struct SelectorTerm {
  std::string key;
  std::optional<std::string> value;  // none: the key alone
};

// "" -> no terms (everything matches). Throws Error naming the term at
// fault: an empty term ("a=1,,b") or an empty key ("=x").
std::vector<SelectorTerm> parse_selector(const std::string& selector);

bool matches(const std::vector<SelectorTerm>& terms,
             const std::map<std::string, std::string>& labels);

}  // namespace openshell::gateway
