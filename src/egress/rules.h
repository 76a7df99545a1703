// The network part of a policy, compiled for the egress proxy: which
// (binary, host, port) may connect, and to which addresses.
//
//  - Deny by default: a connection is allowed only by an endpoint of some
//    network policy whose binaries (if it names any) include the caller.
//  - Hosts: exact ("api.github.com", case-insensitive, a trailing dot
//    ignored) or a wildcard in the leading label ("*.example.com" matches
//    "a.example.com" but not "example.com" nor "a.b.example.com"; "api-*.x.com"
//    matches "api-1.x.com"). An IP literal as host matches only that literal.
//  - Binaries: absolute paths or globs (fnmatch, FNM_PATHNAME), compared with
//    the caller's executable after resolving symlinks in the policy's paths
//    inside the sandbox's root, so /usr/bin/python3 matches python3.11.
//  - Addresses (SSRF guard): after DNS resolution an address that is
//    loopback, link-local (169.254.0.0/16 and fe80::/10, so the cloud
//    metadata service too), private (10/8, 172.16/12, 192.168/16, fc00::/7),
//    CGNAT (100.64/10), unspecified (0.0.0.0, ::), multicast, broadcast, or
//    an IPv4-mapped form of these, is refused unless the endpoint's
//    allowed_ips (CIDRs) cover it; when allowed_ips is given, only covered
//    addresses are allowed at all.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/address.h"
#include "egress/http_rules.h"

namespace openshell::egress {

// Loopback, link-local, private, CGNAT, unspecified, multicast, broadcast...
// (see above); the reason ("private", "loopback", ...) or "" when public.
// IPv6 forms that carry an IPv4 address (::ffff:0:0/96, NAT64 64:ff9b::/96,
// 6to4 2002::/16) are judged by that IPv4 address; IPv6 outside 2000::/3
// (global unicast) is "reserved" unless a narrower reason applies.
std::string special_address_reason(const Address& address);

// "host:port", with brackets around an IPv6 literal.
std::string host_port(std::string_view host, uint16_t port);

// host pattern matching as described above.
bool host_matches(std::string_view pattern, std::string_view host);

// An endpoint judged at layer 7 (protocol = "rest" or "websocket"): each
// HTTP request a connection to it carries is judged by `rules`, inside TLS
// the proxy terminates with the sandbox's CA when the client speaks TLS.
struct Inspection {
  std::string policy;    // the network policy's name, for the audit and the 403
  std::string protocol;  // "rest" or "websocket"
  HttpRules rules;
  std::string ca_file;  // more trust for the upstream (a private server's CA), or ""
  // Where a credential's placeholder may be filled in besides the headers.
  bool credentials_in_query = false;
  bool credentials_in_body = false;
};

struct Decision {
  bool allowed = false;
  std::string rule;    // "github" (the network policy's name) when allowed
  std::string reason;  // why not, when refused: one short phrase
};

// One endpoint a connection matched, for the address check after DNS.
struct Match {
  std::string rule;
  std::vector<Cidr> allowed_ips;
  // Further endpoints (of this rule or others) that allow the same
  // connection: the address check tries them in turn, so an endpoint with
  // narrow allowed_ips never hides another that allows the address.
  struct Other {
    std::string rule;
    std::vector<Cidr> allowed_ips;
  };
  std::vector<Other> also;
  // Every endpoint that allows the connection judges its requests: empty
  // when one of them is layer 4 (its bytes are relayed unread), else the
  // layer-7 endpoints, in the policy's order.
  std::vector<std::shared_ptr<const Inspection>> inspect;
};

class NetworkRules {
 public:
  // One network policy as the rules take it; supervisor::network_rules()
  // builds these from a policy's [network_policies].
  struct Endpoint {
    std::string host;  // exact, or a wildcard in the leading label
    std::vector<uint16_t> ports;
    std::vector<Cidr> allowed_ips;  // empty: any address the SSRF guard lets through
    // Not empty: the endpoint allows nothing, and a connection it alone
    // would have matched is refused for this reason (an endpoint this
    // build cannot enforce fails closed).
    std::string refusal;
    // Layer 7: the endpoint's requests are judged (null: layer 4, and for
    // tls = "skip", whose bytes are relayed unread).
    std::shared_ptr<const Inspection> inspect;
  };
  struct Rule {
    std::string name;
    std::vector<Endpoint> endpoints;
    std::vector<std::string> binaries;  // absolute paths or globs; empty: any binary
  };

  // Resolves a binary path of the policy to what the caller's executable
  // would read (symlinks followed inside the sandbox's root). Given by the
  // caller; identity (no resolution) when empty.
  using PathResolver = std::function<std::string(const std::string& path)>;

  NetworkRules() = default;  // denies everything
  // Plain binary paths go through `resolve`; globs are kept as written.
  explicit NetworkRules(const std::vector<Rule>& rules, const PathResolver& resolve = {});

  // Before DNS: may `binary` (an absolute path, or "" when unknown) connect
  // to host:port? On success *match holds what the address check needs.
  // An unknown binary matches only rules that name no binaries. Globs in
  // the policy's binaries are not resolved, only plain paths are.
  Decision check(std::string_view binary, std::string_view host, uint16_t port, Match* match) const;
  // After DNS: may this address be dialled for that match?
  Decision check_address(const Match& match, const Address& address) const;

  // Whether any endpoint names this host (for the DNS stub: names of allowed
  // hosts resolve, nothing else does).
  bool knows_host(std::string_view host) const;
  // Whether some endpoint naming this host (any port, any binary) would let
  // a connection use the address: what the DNS stub may answer with.
  bool address_allowed_for_host(std::string_view host, const Address& address) const;
  bool empty() const { return rules_.empty(); }
  // Whether some rule names binaries: only then can the caller's identity
  // change a decision, and only then does the proxy look for it.
  bool names_binaries() const { return names_binaries_; }

 private:
  struct Compiled {
    std::string name;
    std::vector<Endpoint> endpoints;
    std::vector<std::string> binaries;             // resolved; empty: any binary
    std::vector<std::string> binaries_as_written;  // for reasons
  };
  std::vector<Compiled> rules_;
  bool names_binaries_ = false;
};

}  // namespace openshell::egress
