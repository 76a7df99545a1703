// What must hold for any request a sandbox sends through a layer-7
// endpoint, whatever its method, target and the endpoint's globs: judging
// never crashes; a malformed request is never allowed; a normalized path is
// canonical (begins with '/', no empty, "." or ".." segment, no control
// byte, escapes only of reserved bytes in upper-case hex, no %2F unless
// allowed) and normalizes to itself; a rule that allows a request denies it
// when it is a deny rule; audit mode allows exactly the well-formed
// requests, and flags exactly those enforce mode refuses; the bodies are
// JSON. Shared by the fuzz target and the unit test that replays its corpus.
//
// Input: one flags byte (bit 0 allow_encoded_slash, bit 1 a query matcher
// with `any` of two globs), then lines: method, target, path glob, method
// of the rule, query key, query glob(s).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "egress/http_rules.h"

namespace openshell::fuzz {

inline std::string normalized_path_violation(const std::string& path, bool allow_encoded_slash) {
  if (path.empty() || path[0] != '/') return "a normalized path does not begin with /";
  if (path.find("//") != std::string::npos) return "a normalized path holds //";
  for (std::string_view dots : {"/./", "/../"}) {
    if (path.find(dots) != std::string::npos) return "a normalized path holds a dot segment";
  }
  if (path.ends_with("/.") || path.ends_with("/.."))
    return "a normalized path ends in a dot segment";
  static constexpr std::string_view kUpperHex = "0123456789ABCDEF";
  for (size_t i = 0; i < path.size(); ++i) {
    auto c = static_cast<unsigned char>(path[i]);
    if (c <= 0x20 || c == 0x7f || c == '#' || c == '?')
      return "a normalized path holds a control byte, a space, # or ?";
    if (c != '%') continue;
    if (i + 2 >= path.size() || kUpperHex.find(path[i + 1]) == std::string_view::npos ||
        kUpperHex.find(path[i + 2]) == std::string_view::npos)
      return "a normalized path holds an escape that is not % and two upper-case hex digits";
    int byte = static_cast<int>(kUpperHex.find(path[i + 1]) * 16 + kUpperHex.find(path[i + 2]));
    bool unreserved = (byte >= 'A' && byte <= 'Z') || (byte >= 'a' && byte <= 'z') ||
                      (byte >= '0' && byte <= '9') || byte == '-' || byte == '.' || byte == '_' ||
                      byte == '~';
    if (unreserved) return "a normalized path keeps an escape of an unreserved character";
    if (byte < 0x20 || byte == 0x7f) return "a normalized path holds an encoded control byte";
    if (byte == '/' && !allow_encoded_slash) return "a normalized path holds %2F";
  }
  std::string again, reason;
  if (!egress::normalize_http_path(path, allow_encoded_slash, &again, &reason))
    return "a normalized path is refused when normalized again: " + reason;
  if (again != path) return "normalizing a normalized path changes it";
  return "";
}

// "" when every property holds; otherwise which one broke.
inline std::string http_rules_violation(std::string_view input) {
  if (input.empty()) return "";
  const bool allow_encoded_slash = (input[0] & 1) != 0;
  const bool two_globs = (input[0] & 2) != 0;
  std::vector<std::string> lines;
  std::string_view rest = input.substr(1);
  while (lines.size() < 6) {
    size_t end = rest.find('\n');
    lines.emplace_back(rest.substr(0, end));
    if (end == std::string_view::npos) break;
    rest = rest.substr(end + 1);
  }
  lines.resize(6);
  const std::string& method = lines[0];
  const std::string& target = lines[1];

  egress::HttpRules::Rule rule{lines[3], lines[2], {}};
  if (!lines[4].empty()) {
    egress::HttpRules::QueryMatcher matcher{lines[4], {lines[5]}};
    if (two_globs) matcher.globs.push_back(lines[5] + "*");
    rule.query.push_back(matcher);
  }
  egress::HttpRules::Spec allow_spec;
  allow_spec.allow_encoded_slash = allow_encoded_slash;
  allow_spec.rules.push_back(rule);
  egress::HttpRules::Spec deny_spec;
  deny_spec.allow_encoded_slash = allow_encoded_slash;
  deny_spec.access = "full";
  deny_spec.deny_rules.push_back(rule);
  egress::HttpRules::Spec audit_spec = allow_spec;
  audit_spec.audit = true;

  auto allowing = egress::HttpRules(allow_spec).judge(method, target);
  auto denying = egress::HttpRules(deny_spec).judge(method, target);
  auto auditing = egress::HttpRules(audit_spec).judge(method, target);

  for (const auto* verdict : {&allowing, &denying, &auditing}) {
    if (verdict->malformed != allowing.malformed)
      return "the same request is malformed for one endpoint and not another";
    if (verdict->malformed) {
      if (verdict->allowed) return "a malformed request is allowed";
      if (!verdict->path.empty()) return "a malformed request has a path";
      if (verdict->reason.empty()) return "a malformed request has no reason";
      continue;
    }
    if (verdict->path != allowing.path) return "one request normalizes to two paths";
  }
  if (!allowing.malformed) {
    std::string broken = normalized_path_violation(allowing.path, allow_encoded_slash);
    if (!broken.empty()) return broken;
  }
  if (allowing.allowed && denying.allowed) return "a rule that allows a request does not deny it";
  if (allowing.allowed && denying.rule != "deny_rules[0]") return "a deny names the wrong rule";
  if (!allowing.malformed) {
    if (!auditing.allowed) return "audit mode refuses a well-formed request";
    if (auditing.audit_only == allowing.allowed)
      return "audit mode flags what enforce mode allows, or not what it refuses";
    if (!allowing.allowed && allowing.reason.empty()) return "a denial has no reason";
  }
  try {
    auto body = nlohmann::json::parse(
        allowing.malformed ? egress::http_malformed_body(allowing, "h", 1, method)
                           : egress::http_denial_body(allowing, "s", "h", 1, method));
    if (!body.is_object() || !body.contains("error")) return "a body is not a JSON error object";
  } catch (const nlohmann::json::exception&) {
    return "a body is not JSON";
  }
  return "";
}

}  // namespace openshell::fuzz
