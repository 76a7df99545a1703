#include "policy/edit.h"

#include <algorithm>
#include <cctype>
#include <utility>

#include "base/error.h"
#include "base/text.h"

namespace openshell::policy {

namespace {

bool same_host(const std::string& a, const std::string& b) { return text::iequals(a, b); }

std::string written(const EndpointRef& e) {
  bool v6 = e.host.find(':') != std::string::npos;
  return (v6 ? "[" + e.host + "]" : e.host) + ":" + std::to_string(e.port);
}

std::vector<std::string> sorted(std::vector<std::string> items) {
  std::sort(items.begin(), items.end());
  items.erase(std::unique(items.begin(), items.end()), items.end());
  return items;
}

std::string rule_text(const std::string& method, const std::string& path) {
  return method + " " + path;
}

bool same_rule(const HttpRule& rule, const RuleRef& ref) {
  return rule.method == ref.method && rule.path == ref.path;
}

// The rules an access preset stands for (docs/policy.md, "access").
std::vector<HttpRule> preset_rules(const std::string& access) {
  std::vector<std::string> methods = {"GET", "HEAD", "OPTIONS"};
  if (access == "read-write") methods.insert(methods.end(), {"POST", "PUT", "PATCH"});
  if (access == "full") methods = {"*"};
  std::vector<HttpRule> rules;
  for (auto& method : methods) rules.push_back({method, "/**", {}});
  return rules;
}

struct Found {
  std::string rule;  // the network policy's name
  Endpoint* endpoint;
};

// The endpoints of HOST:PORT in every network policy for which `wanted`
// holds, each made to serve that port alone: one that serves other ports
// too leaves this port to a copy of itself, so that a change for
// HOST:PORT changes nothing else.
template <typename Wanted>
std::vector<Found> isolate(Policy* p, const EndpointRef& e, Wanted wanted) {
  auto at = [&](const Endpoint& endpoint) {
    return same_host(endpoint.host, e.host) &&
           std::find(endpoint.ports.begin(), endpoint.ports.end(), e.port) !=
               endpoint.ports.end() &&
           wanted(endpoint);
  };
  for (auto& rule : p->network) {
    for (size_t i = 0, n = rule.endpoints.size(); i < n; ++i) {
      Endpoint& endpoint = rule.endpoints[i];
      if (!at(endpoint) || endpoint.ports.size() == 1) continue;
      Endpoint split = endpoint;
      split.ports = {e.port};
      std::erase(endpoint.ports, e.port);
      rule.endpoints.push_back(std::move(split));
    }
  }
  std::vector<Found> found;
  for (auto& rule : p->network)
    for (auto& endpoint : rule.endpoints)
      if (at(endpoint)) found.push_back({rule.name, &endpoint});
  return found;
}

// Makes an endpoint one whose requests are read, for a rule to be added.
void inspect(const std::string& flag, const RuleRef& ref, const Found& at, UpdateResult* result) {
  Endpoint& endpoint = *at.endpoint;
  const std::string where = written(ref.endpoint) + " in rule " + at.rule;
  if (endpoint.tls == "skip")
    throw Error(flag + " " + written(ref.endpoint) + ":" + rule_text(ref.method, ref.path) + ": " +
                where +
                " has tls = \"skip\": its bytes are relayed unread, so no HTTP rule "
                "can apply (drop tls with policy set)");
  if (endpoint.protocol.empty()) {
    endpoint.protocol = "rest";
    result->notes.push_back(where + " is now inspected (protocol = \"rest\")");
  }
}

}  // namespace

RuleRef parse_rule_ref(const std::string& flag, const std::string& text) {
  const std::string what = flag + " " + text + ": ";
  const std::string form =
      "expected HOST:PORT:METHOD:PATH_GLOB (like api.github.com:443:GET:/repos/**)";
  RuleRef ref;
  size_t at = 0;
  if (text.starts_with("[")) {
    size_t close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw Error(what + "an IPv6 host in brackets must be followed by :PORT (" + form + ")");
    ref.endpoint.host = text.substr(1, close - 1);
    at = close + 2;
  } else {
    size_t colon = text.find(':');
    if (colon == std::string::npos || colon == 0) throw Error(what + form);
    ref.endpoint.host = text.substr(0, colon);
    at = colon + 1;
  }
  size_t port_end = text.find(':', at);
  size_t method_end = port_end == std::string::npos ? port_end : text.find(':', port_end + 1);
  if (method_end == std::string::npos) throw Error(what + form);
  if (auto why = check_host_pattern(ref.endpoint.host); !why.empty())
    throw Error(what + "the host " + why);
  auto port = text::parse_uint(text.substr(at, port_end - at), 65535);
  if (!port || *port == 0) throw Error(what + "the port must be 1-65535");
  ref.endpoint.port = static_cast<uint16_t>(*port);
  ref.method = text.substr(port_end + 1, method_end - port_end - 1);
  if (auto why = check_http_method(ref.method); !why.empty())
    throw Error(what + "the method " + why);
  ref.method = text::upper(ref.method);
  ref.path = text.substr(method_end + 1);
  if (auto why = check_path_glob(ref.path); !why.empty())
    throw Error(what + "the path glob " + why);
  return ref;
}

UpdateResult apply_update(Policy* policy, const Update& update) {
  for (const auto& ip : update.allowed_ips)
    if (auto why = check_allowed_ip(ip); !why.empty()) throw Error("--allowed-ip: " + why);
  Policy p = *policy;
  UpdateResult result;
  for (const auto& e : update.remove) {
    bool found = false;
    for (auto& rule : p.network)
      for (auto it = rule.endpoints.begin(); it != rule.endpoints.end();) {
        auto& ports = it->ports;
        auto port = std::find(ports.begin(), ports.end(), e.port);
        if (same_host(it->host, e.host) && port != ports.end()) {
          found = true;
          ports.erase(port);
        }
        it = ports.empty() ? rule.endpoints.erase(it) : it + 1;
      }
    if (!found)
      throw Error("--remove-endpoint " + written(e) + ": the policy has no such endpoint");
    std::erase_if(p.network, [](const NetworkPolicy& rule) { return rule.endpoints.empty(); });
    result.notes.push_back("removed " + written(e));
    result.changed = true;
  }
  if (!update.add.empty() || !update.binaries.empty()) {
    auto target = std::find_if(p.network.begin(), p.network.end(),
                               [&](const NetworkPolicy& rule) { return rule.name == update.rule; });
    if (target == p.network.end()) {
      p.network.push_back({update.rule, {}, {}});
      target = p.network.end() - 1;
    }
    const std::string in_rule = " rule " + update.rule;
    for (const auto& e : update.add) {
      auto existing = std::find_if(
          target->endpoints.begin(), target->endpoints.end(), [&](const Endpoint& endpoint) {
            return same_host(endpoint.host, e.host) &&
                   std::find(endpoint.ports.begin(), endpoint.ports.end(), e.port) !=
                       endpoint.ports.end();
          });
      if (existing == target->endpoints.end()) {
        target->endpoints.push_back({e.host, {e.port}, update.allowed_ips, "", ""});
        result.notes.push_back("added " + written(e) + " to" + in_rule);
        result.changed = true;
      } else if (update.allowed_ips.empty() ||
                 sorted(existing->allowed_ips) == sorted(update.allowed_ips)) {
        result.notes.push_back(written(e) + " is already in" + in_rule + ", unchanged");
      } else if (existing->ports.size() == 1) {
        existing->allowed_ips = update.allowed_ips;
        result.notes.push_back("set the allowed_ips of " + written(e) + " in" + in_rule);
        result.changed = true;
      } else {
        // The endpoint serves other ports too: this port gets its own.
        Endpoint split = *existing;
        existing->ports.erase(std::find(existing->ports.begin(), existing->ports.end(), e.port));
        split.ports = {e.port};
        split.allowed_ips = update.allowed_ips;
        target->endpoints.push_back(std::move(split));
        result.notes.push_back("set the allowed_ips of " + written(e) + " in" + in_rule);
        result.changed = true;
      }
    }
    for (const auto& path : update.binaries) {
      bool there = std::any_of(target->binaries.begin(), target->binaries.end(),
                               [&](const Binary& b) { return b.path == path; });
      if (there) {
        result.notes.push_back(path + " is already in" + in_rule + "'s binaries, unchanged");
        continue;
      }
      target->binaries.push_back({path});
      result.notes.push_back("added " + path + " to" + in_rule + "'s binaries");
      result.changed = true;
    }
    // A rule made for additions that were all there already is not kept.
    if (target->endpoints.empty()) {
      if (!target->binaries.empty())
        throw Error("--binary: rule " + update.rule + " has no endpoints (give --add-endpoint)");
      p.network.erase(target);
    }
  }
  for (const RuleRef& ref : update.remove_rules) {
    auto has = [&](const Endpoint& endpoint) {
      auto same = [&](const HttpRule& rule) { return same_rule(rule, ref); };
      return std::any_of(endpoint.rules.begin(), endpoint.rules.end(), same) ||
             std::any_of(endpoint.deny_rules.begin(), endpoint.deny_rules.end(), same);
    };
    auto found = isolate(&p, ref.endpoint, has);
    if (found.empty())
      throw Error("--remove-rule " + written(ref.endpoint) + ":" + rule_text(ref.method, ref.path) +
                  ": no endpoint " + written(ref.endpoint) + " has the rule " +
                  rule_text(ref.method, ref.path));
    for (const Found& at : found) {
      Endpoint& endpoint = *at.endpoint;
      bool had_rules = !endpoint.rules.empty();
      std::erase_if(endpoint.rules, [&](const HttpRule& rule) { return same_rule(rule, ref); });
      std::erase_if(endpoint.deny_rules,
                    [&](const HttpRule& rule) { return same_rule(rule, ref); });
      const std::string where = written(ref.endpoint) + " in rule " + at.rule;
      result.notes.push_back("removed " + rule_text(ref.method, ref.path) + " from " + where);
      // An endpoint without allow rules or access allows every request.
      if (had_rules && endpoint.rules.empty() && endpoint.access.empty())
        result.notes.push_back(where +
                               " has no allow rules left: every request no deny rule "
                               "matches passes");
      result.changed = true;
    }
  }
  for (const RuleRef& ref : update.add_allow) {
    const std::string flag = "--add-allow";
    auto found = isolate(&p, ref.endpoint, [](const Endpoint&) { return true; });
    if (found.empty()) {
      auto target = std::find_if(p.network.begin(), p.network.end(),
                                 [&](const NetworkPolicy& r) { return r.name == update.rule; });
      if (target == p.network.end()) {
        p.network.push_back({update.rule, {}, {}});
        target = p.network.end() - 1;
      }
      Endpoint endpoint{ref.endpoint.host, {ref.endpoint.port}, update.allowed_ips};
      endpoint.protocol = "rest";
      endpoint.rules.push_back({ref.method, ref.path, {}});
      target->endpoints.push_back(std::move(endpoint));
      result.notes.push_back("added " + written(ref.endpoint) + " to rule " + update.rule +
                             ", inspected (protocol = \"rest\"), allowing " +
                             rule_text(ref.method, ref.path));
      result.changed = true;
      continue;
    }
    for (const Found& at : found) {
      Endpoint& endpoint = *at.endpoint;
      const std::string where = written(ref.endpoint) + " in rule " + at.rule;
      inspect(flag, ref, at, &result);
      if (endpoint.access == "full") {
        result.notes.push_back(where +
                               " allows every request already (access = \"full\"), "
                               "unchanged");
        continue;
      }
      if (!endpoint.access.empty()) {
        endpoint.rules = preset_rules(endpoint.access);
        result.notes.push_back("replaced access = \"" + endpoint.access + "\" of " + where +
                               " with the rules it stands for");
        endpoint.access.clear();
        result.changed = true;
      }
      if (std::any_of(endpoint.rules.begin(), endpoint.rules.end(),
                      [&](const HttpRule& rule) { return same_rule(rule, ref); })) {
        result.notes.push_back(where + " allows " + rule_text(ref.method, ref.path) +
                               " already, unchanged");
        continue;
      }
      if (endpoint.rules.empty())
        result.notes.push_back(where + " now allows only the requests its rules allow");
      endpoint.rules.push_back({ref.method, ref.path, {}});
      result.notes.push_back("allowed " + rule_text(ref.method, ref.path) + " on " + where);
      result.changed = true;
    }
  }
  for (const RuleRef& ref : update.add_deny) {
    auto found = isolate(&p, ref.endpoint, [](const Endpoint&) { return true; });
    // A new endpoint would allow every other request to HOST:PORT.
    if (found.empty())
      throw Error("--add-deny " + written(ref.endpoint) + ":" + rule_text(ref.method, ref.path) +
                  ": the policy has no endpoint " + written(ref.endpoint) +
                  " (a deny rule goes on one: add it with --add-endpoint or --add-allow)");
    for (const Found& at : found) {
      Endpoint& endpoint = *at.endpoint;
      const std::string where = written(ref.endpoint) + " in rule " + at.rule;
      bool was_layer4 = endpoint.protocol.empty();
      inspect("--add-deny", ref, at, &result);
      result.changed = result.changed || was_layer4;
      if (std::any_of(endpoint.deny_rules.begin(), endpoint.deny_rules.end(),
                      [&](const HttpRule& rule) { return same_rule(rule, ref); })) {
        result.notes.push_back(where + " denies " + rule_text(ref.method, ref.path) +
                               " already, unchanged");
        continue;
      }
      endpoint.deny_rules.push_back({ref.method, ref.path, {}});
      result.notes.push_back("denied " + rule_text(ref.method, ref.path) + " on " + where);
      result.changed = true;
    }
  }
  std::sort(p.network.begin(), p.network.end(),
            [](const NetworkPolicy& a, const NetworkPolicy& b) { return a.name < b.name; });
  *policy = std::move(p);
  return result;
}

std::vector<std::string> static_differences(const Policy& a, const Policy& b) {
  std::vector<std::string> parts;
  if (a.has_filesystem_policy != b.has_filesystem_policy || a.filesystem != b.filesystem)
    parts.push_back("filesystem_policy");
  if (a.landlock != b.landlock) parts.push_back("landlock");
  if (a.process != b.process) parts.push_back("process");
  return parts;
}

bool looks_like_yaml(std::string_view text) {
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    std::string_view line = text.substr(at, end == std::string_view::npos ? text.npos : end - at);
    at = end == std::string_view::npos ? text.size() : end + 1;
    while (!line.empty() && (line.front() == ' ' || line.front() == '\t')) line.remove_prefix(1);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\t' || line.back() == '\r'))
      line.remove_suffix(1);
    if (line.empty() || line.front() == '#') continue;
    if (line == "---" || line.starts_with("--- ")) return true;
    // A mapping key: a bare word, then ':' at the end or before a space.
    size_t colon = line.find(':');
    if (colon == 0 || colon == std::string_view::npos) return false;
    for (char c : line.substr(0, colon))
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-')) return false;
    return colon + 1 == line.size() || line[colon + 1] == ' ';
  }
  return false;
}

}  // namespace openshell::policy
