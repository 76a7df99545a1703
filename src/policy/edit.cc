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

}  // namespace

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
