#include "egress/rules.h"

#include <fnmatch.h>

#include <algorithm>
#include <utility>

#include "base/text.h"

namespace openshell::egress {

namespace {

struct SpecialRange {
  Cidr cidr;
  const char* reason;
};

std::vector<SpecialRange> ranges(std::initializer_list<std::pair<const char*, const char*>> list) {
  std::vector<SpecialRange> out;
  for (auto [text, reason] : list) out.push_back({*Cidr::parse(text), reason});
  return out;
}

// Checked in order: the narrower range first where they nest.
const std::vector<SpecialRange>& special_v4() {
  static const std::vector<SpecialRange> table = ranges({
      {"0.0.0.0/8", "unspecified"},  // Linux connects 0.0.0.0 to the local host
      {"10.0.0.0/8", "private"},
      {"100.64.0.0/10", "carrier-grade NAT"},
      {"127.0.0.0/8", "loopback"},
      {"169.254.0.0/16", "link-local (cloud metadata)"},
      {"172.16.0.0/12", "private"},
      {"192.0.0.0/24", "reserved"},  // IETF protocol assignments
      {"192.0.2.0/24", "reserved for documentation"},
      {"192.168.0.0/16", "private"},
      {"198.18.0.0/15", "reserved for benchmarking"},
      {"198.51.100.0/24", "reserved for documentation"},
      {"203.0.113.0/24", "reserved for documentation"},
      {"224.0.0.0/4", "multicast"},
      {"255.255.255.255/32", "broadcast"},
      {"240.0.0.0/4", "reserved"},
  });
  return table;
}

// IPv6 forms that carry an IPv4 address (mapped, NAT64, 6to4) are judged by
// that address before this table is consulted; what is outside both this
// table and 2000::/3 is reserved.
const std::vector<SpecialRange>& special_v6() {
  static const std::vector<SpecialRange> table = ranges({
      {"::/128", "unspecified"},
      {"::1/128", "loopback"},
      {"::/96", "reserved"},          // IPv4-compatible, deprecated
      {"64:ff9b:1::/48", "private"},  // local-use NAT64
      {"100::/64", "reserved"},       // discard-only
      {"2001:db8::/32", "reserved for documentation"},
      {"fc00::/7", "private"},
      {"fe80::/10", "link-local"},
      {"fec0::/10", "private"},  // site-local, deprecated
      {"ff00::/8", "multicast"},
  });
  return table;
}

const Cidr& nat64_prefix() {
  static const Cidr cidr = *Cidr::parse("64:ff9b::/96");
  return cidr;
}

const Cidr& six_to_four_prefix() {
  static const Cidr cidr = *Cidr::parse("2002::/16");
  return cidr;
}

const Cidr& global_unicast() {
  static const Cidr cidr = *Cidr::parse("2000::/3");
  return cidr;
}

std::string lower_without_trailing_dot(std::string_view text) {
  if (!text.empty() && text.back() == '.') text.remove_suffix(1);
  return text::lower(text);
}

// A label against a pattern label in which each '*' stands for one or more
// characters. Dynamic programming, so a pattern full of stars stays cheap.
bool label_matches(std::string_view pattern, std::string_view label) {
  // row[j]: whether the pattern so far matches label[0, j).
  std::vector<char> row(label.size() + 1, 0), next(label.size() + 1, 0);
  row[0] = 1;
  for (char p : pattern) {
    next[0] = 0;
    for (size_t j = 1; j <= label.size(); ++j) {
      if (p == '*')
        next[j] = row[j - 1] || next[j - 1];  // the star starts here or goes on
      else
        next[j] = row[j - 1] && label[j - 1] == p;
    }
    std::swap(row, next);
  }
  return row[label.size()];
}

Decision check_one(const std::string& rule, const std::vector<Cidr>& allowed_ips,
                   const Address& address) {
  Decision decision;
  if (!allowed_ips.empty()) {
    for (const Cidr& cidr : allowed_ips) {
      if (cidr.contains(address)) {
        decision.allowed = true;
        decision.rule = rule;
        return decision;
      }
    }
    decision.reason = address.to_string() + " is not in the endpoint's allowed_ips";
    return decision;
  }
  std::string why = special_address_reason(address);
  if (!why.empty()) {
    decision.reason = address.to_string() + " is " + why + " (SSRF guard)";
    return decision;
  }
  decision.allowed = true;
  decision.rule = rule;
  return decision;
}

}  // namespace

std::string host_port(std::string_view host, uint16_t port) {
  std::string out(host);
  if (out.find(':') != std::string::npos && out.front() != '[') out = "[" + out + "]";
  return out + ":" + std::to_string(port);
}

std::string special_address_reason(const Address& address) {
  if (address.family == AF_INET) {
    for (const auto& range : special_v4())
      if (range.cidr.contains(address)) return range.reason;
    return "";
  }
  if (address.is_v4_mapped() || nat64_prefix().contains(address))
    return special_address_reason(Address::v4(address.bytes + 12));
  if (six_to_four_prefix().contains(address))
    return special_address_reason(Address::v4(address.bytes + 2));
  for (const auto& range : special_v6())
    if (range.cidr.contains(address)) return range.reason;
  // Only 2000::/3 is allocated for global unicast.
  return global_unicast().contains(address) ? "" : "reserved";
}

bool host_matches(std::string_view pattern_text, std::string_view host_text) {
  std::string pattern = lower_without_trailing_dot(pattern_text);
  std::string host = lower_without_trailing_dot(host_text);
  if (pattern.empty() || host.empty()) return false;
  // An IP literal matches only the same address, never a wildcard.
  auto host_address = Address::parse(host);
  auto pattern_address = Address::parse(pattern);
  if (host_address || pattern_address)
    return host_address && pattern_address && *host_address == *pattern_address;
  if (host.find('*') != std::string::npos) return false;
  auto pattern_labels = text::split(pattern, '.');
  auto host_labels = text::split(host, '.');
  if (pattern_labels.size() != host_labels.size()) return false;
  for (size_t i = 0; i < host_labels.size(); ++i) {
    if (pattern_labels[i].empty() || host_labels[i].empty()) return false;
    if (i == 0) {
      if (!label_matches(pattern_labels[0], host_labels[0])) return false;
    } else if (pattern_labels[i] != host_labels[i]) {
      return false;  // a '*' past the first label matches nothing
    }
  }
  return true;
}

NetworkRules::NetworkRules(const std::vector<Rule>& rules, const PathResolver& resolve) {
  for (const Rule& rule : rules) {
    Compiled compiled{rule.name, rule.endpoints, {}, rule.binaries};
    for (const auto& path : rule.binaries) {
      // A glob names no one file to resolve; it is compared as written.
      bool glob = path.find_first_of("*?[") != std::string::npos;
      std::string resolved = glob || !resolve ? path : resolve(path);
      compiled.binaries.push_back(resolved.empty() ? path : resolved);
    }
    names_binaries_ = names_binaries_ || !compiled.binaries.empty();
    rules_.push_back(std::move(compiled));
  }
}

Decision NetworkRules::check(std::string_view binary, std::string_view host, uint16_t port,
                             Match* match) const {
  Decision decision;
  Match found;
  std::vector<std::string> only_for;  // binaries of rules that allow host:port, but not the caller
  std::string refused;                // an endpoint for the caller that fails closed: why
  bool layer4 = false;                // an endpoint that allows it relays its bytes unread
  const std::string caller(binary);
  for (const Compiled& rule : rules_) {
    bool caller_ok = rule.binaries.empty();
    for (const auto& pattern : rule.binaries)
      caller_ok = caller_ok || (!caller.empty() &&
                                ::fnmatch(pattern.c_str(), caller.c_str(), FNM_PATHNAME) == 0);
    for (const Endpoint& endpoint : rule.endpoints) {
      if (std::find(endpoint.ports.begin(), endpoint.ports.end(), port) == endpoint.ports.end())
        continue;
      if (!host_matches(endpoint.host, host)) continue;
      if (!caller_ok) {
        for (const auto& path : rule.binaries_as_written)
          if (std::find(only_for.begin(), only_for.end(), path) == only_for.end())
            only_for.push_back(path);
        continue;
      }
      if (!endpoint.refusal.empty()) {
        if (refused.empty()) refused = endpoint.refusal;
        continue;
      }
      if (!decision.allowed) {
        decision.allowed = true;
        decision.rule = rule.name;
        found.rule = rule.name;
        found.allowed_ips = endpoint.allowed_ips;
      } else {
        found.also.push_back({rule.name, endpoint.allowed_ips});
      }
      if (!endpoint.inspect) layer4 = true;
      else found.inspect.push_back(endpoint.inspect);
    }
  }
  if (decision.allowed) {
    if (layer4) found.inspect.clear();
    if (match) *match = std::move(found);
    return decision;
  }
  if (!refused.empty()) {
    decision.reason = host_port(host, port) + ": " + refused;
  } else if (only_for.empty()) {
    decision.reason = "no rule allows " + host_port(host, port);
  } else {
    decision.reason = host_port(host, port) + " is allowed only for " + text::join(only_for, ", ") +
                      ", not for " +
                      (caller.empty() ? "a program whose executable is unknown" : caller);
  }
  return decision;
}

Decision NetworkRules::check_address(const Match& match, const Address& address) const {
  Decision first = check_one(match.rule, match.allowed_ips, address);
  if (first.allowed) return first;
  for (const auto& other : match.also) {
    Decision decision = check_one(other.rule, other.allowed_ips, address);
    if (decision.allowed) return decision;
  }
  return first;
}

bool NetworkRules::knows_host(std::string_view host) const {
  for (const Compiled& rule : rules_)
    for (const Endpoint& endpoint : rule.endpoints)
      if (host_matches(endpoint.host, host)) return true;
  return false;
}

bool NetworkRules::address_allowed_for_host(std::string_view host, const Address& address) const {
  for (const Compiled& rule : rules_)
    for (const Endpoint& endpoint : rule.endpoints) {
      if (!host_matches(endpoint.host, host)) continue;
      Match match{rule.name, endpoint.allowed_ips, {}};
      if (check_address(match, address).allowed) return true;
    }
  return false;
}

}  // namespace openshell::egress
