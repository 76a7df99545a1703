#include "supervisor/http_rules.h"

#include <vector>

namespace openshell::supervisor {

namespace {

egress::HttpRules::Rule http_rule(const policy::HttpRule& source) {
  egress::HttpRules::Rule rule;
  rule.method = source.method;
  rule.path = source.path;
  for (const auto& matcher : source.query) {
    egress::HttpRules::QueryMatcher out;
    out.key = matcher.key;
    // A matcher holds either one glob or `any`; an empty glob with no
    // `any` is the glob "", which only an empty value matches.
    if (matcher.any.empty())
      out.globs.push_back(matcher.glob);
    else
      out.globs = matcher.any;
    rule.query.push_back(std::move(out));
  }
  return rule;
}

}  // namespace

egress::HttpRules::Spec http_rules_spec(const policy::Endpoint& endpoint) {
  egress::HttpRules::Spec spec;
  spec.audit = endpoint.enforcement == "audit";
  spec.access = endpoint.access;
  for (const auto& rule : endpoint.rules) spec.rules.push_back(http_rule(rule));
  for (const auto& rule : endpoint.deny_rules) spec.deny_rules.push_back(http_rule(rule));
  spec.allow_encoded_slash = endpoint.allow_encoded_slash;
  return spec;
}

egress::HttpRules http_rules(const policy::Endpoint& endpoint) {
  return egress::HttpRules(http_rules_spec(endpoint));
}

}  // namespace openshell::supervisor
