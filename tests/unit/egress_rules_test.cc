#include <map>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "egress/proxy.h"
#include "egress/rules.h"
#include "policy/policy.h"
#include "supervisor/network_rules.h"

namespace openshell::egress {
namespace {

using ::testing::HasSubstr;

Address addr(const char* text) {
  auto address = Address::parse(text);
  EXPECT_TRUE(address.has_value()) << text;
  return address.value_or(Address{});
}

NetworkRules rules_from(const std::string& toml, const NetworkRules::PathResolver& resolve = {}) {
  return supervisor::network_rules(policy::parse("version = 1\n" + toml, "test.toml"), resolve);
}

// The design's example.
constexpr const char* kGithub = R"(
[network_policies.github]
endpoints = [ { host = "api.github.com", port = 443 },
              { host = "*.githubusercontent.com", ports = [443] } ]
binaries  = [ { path = "/usr/bin/git" }, { path = "/usr/bin/curl" } ]
)";

// ---- special_address_reason ------------------------------------------------

struct Case {
  const char* address;
  const char* reason;
};

void expect_reasons(std::initializer_list<Case> cases) {
  for (const auto& c : cases)
    EXPECT_EQ(special_address_reason(addr(c.address)), c.reason) << c.address;
}

TEST(AddressSpecial, IPv4RangesAndTheirEdges) {
  expect_reasons({
      {"0.0.0.0", "unspecified"},
      {"0.255.255.255", "unspecified"},
      {"1.0.0.0", ""},
      {"9.255.255.255", ""},
      {"10.0.0.0", "private"},
      {"10.255.255.255", "private"},
      {"11.0.0.0", ""},
      {"100.63.255.255", ""},
      {"100.64.0.0", "carrier-grade NAT"},
      {"100.127.255.255", "carrier-grade NAT"},
      {"100.128.0.0", ""},
      {"126.255.255.255", ""},
      {"127.0.0.0", "loopback"},
      {"127.0.0.1", "loopback"},
      {"127.255.255.255", "loopback"},
      {"128.0.0.0", ""},
      {"169.253.255.255", ""},
      {"169.254.0.0", "link-local (cloud metadata)"},
      {"169.254.169.254", "link-local (cloud metadata)"},
      {"169.254.255.255", "link-local (cloud metadata)"},
      {"169.255.0.0", ""},
      {"172.15.255.255", ""},
      {"172.16.0.0", "private"},
      {"172.31.255.255", "private"},
      {"172.32.0.0", ""},
      {"191.255.255.255", ""},
      {"192.0.0.0", "reserved"},
      {"192.0.0.255", "reserved"},
      {"192.0.1.0", ""},
      {"192.0.2.1", "reserved for documentation"},
      {"198.51.100.1", "reserved for documentation"},
      {"203.0.113.1", "reserved for documentation"},
      {"192.167.255.255", ""},
      {"192.168.0.0", "private"},
      {"192.168.255.255", "private"},
      {"192.169.0.0", ""},
      {"198.17.255.255", ""},
      {"198.18.0.0", "reserved for benchmarking"},
      {"198.19.255.255", "reserved for benchmarking"},
      {"198.20.0.0", ""},
      {"223.255.255.255", ""},
      {"224.0.0.0", "multicast"},
      {"239.255.255.255", "multicast"},
      {"240.0.0.0", "reserved"},
      {"255.255.255.254", "reserved"},
      {"255.255.255.255", "broadcast"},
  });
}

TEST(AddressSpecial, PublicIPv4) {
  expect_reasons({{"8.8.8.8", ""}, {"1.1.1.1", ""}, {"140.82.112.3", ""}, {"93.184.216.34", ""}});
}

TEST(AddressSpecial, IPv6Ranges) {
  expect_reasons({
      {"::", "unspecified"},
      {"::1", "loopback"},
      {"::2", "reserved"},
      {"::127.0.0.1", "reserved"},  // IPv4-compatible (deprecated)
      {"100::1", "reserved"},
      {"2001:db8::1", "reserved for documentation"},
      {"fbff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "reserved"},
      {"fc00::", "private"},
      {"fd00:ec2::254", "private"},
      {"fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "private"},
      {"fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "reserved"},
      {"fe80::", "link-local"},
      {"fe80::1", "link-local"},
      {"febf:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "link-local"},
      {"fec0::1", "private"},
      {"ff00::", "multicast"},
      {"ff02::1", "multicast"},
      {"64:ff9b:1::1", "private"},
      {"1fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", "reserved"},
      {"4000::", "reserved"},
  });
}

TEST(AddressSpecial, PublicIPv6) {
  expect_reasons({{"2001:4860:4860::8888", ""},
                  {"2606:4700:4700::1111", ""},
                  {"2000::", ""},
                  {"3fff:ffff:ffff:ffff:ffff:ffff:ffff:ffff", ""}});
}

TEST(AddressSpecial, IPv6CarryingIPv4IsJudgedByTheIPv4) {
  expect_reasons({
      {"::ffff:127.0.0.1", "loopback"},
      {"::ffff:169.254.169.254", "link-local (cloud metadata)"},
      {"::ffff:10.0.0.1", "private"},
      {"::ffff:0.0.0.0", "unspecified"},
      {"::ffff:8.8.8.8", ""},
      {"64:ff9b::7f00:1", "loopback"},
      {"64:ff9b::a9fe:a9fe", "link-local (cloud metadata)"},
      {"64:ff9b::c0a8:101", "private"},
      {"64:ff9b::808:808", ""},
      {"2002:7f00:1::", "loopback"},  // 6to4 of 127.0.0.1
      {"2002:a00:1::1", "private"},
      {"2002:808:808::1", ""},
  });
}

// ---- host_matches ----------------------------------------------------------

TEST(HostMatches, Exact) {
  EXPECT_TRUE(host_matches("api.github.com", "api.github.com"));
  EXPECT_FALSE(host_matches("api.github.com", "github.com"));
  EXPECT_FALSE(host_matches("api.github.com", "xapi.github.com"));
  EXPECT_FALSE(host_matches("api.github.com", "api.github.com.evil.com"));
  EXPECT_FALSE(host_matches("api.github.com", "api.github.co"));
  EXPECT_FALSE(host_matches("api.github.com", "api.github"));
  EXPECT_FALSE(host_matches("api.github", "api.github.com"));
  EXPECT_FALSE(host_matches("api.github.com", ""));
  EXPECT_FALSE(host_matches("", ""));
  EXPECT_TRUE(host_matches("localhost", "localhost"));
}

TEST(HostMatches, CaseAndTrailingDot) {
  EXPECT_TRUE(host_matches("API.GitHub.com", "api.github.COM"));
  EXPECT_TRUE(host_matches("api.github.com", "api.github.com."));
  EXPECT_TRUE(host_matches("*.example.com", "A.Example.Com."));
  EXPECT_FALSE(host_matches("api.github.com", "api.github.com.."));
  EXPECT_FALSE(host_matches("api.github.com", "api..github.com"));
  EXPECT_FALSE(host_matches("api.github.com", "."));
}

TEST(HostMatches, WildcardInFirstLabel) {
  EXPECT_TRUE(host_matches("*.example.com", "a.example.com"));
  EXPECT_TRUE(host_matches("*.example.com", "raw-objects-1.example.com"));
  EXPECT_FALSE(host_matches("*.example.com", "example.com"));
  EXPECT_FALSE(host_matches("*.example.com", ".example.com"));
  EXPECT_FALSE(host_matches("*.example.com", "a.b.example.com"));
  EXPECT_FALSE(host_matches("*.example.com", "a.example.org"));
  EXPECT_FALSE(host_matches("*.example.com", "a.example"));
  EXPECT_FALSE(host_matches("*.example.com", "a.example.com.evil.com"));
  EXPECT_FALSE(host_matches("*.example.com", "*.example.com"));  // a host holds no '*'
}

TEST(HostMatches, PartialWildcard) {
  EXPECT_TRUE(host_matches("api-*.x.com", "api-1.x.com"));
  EXPECT_TRUE(host_matches("api-*.x.com", "API-eu-west.x.com"));
  EXPECT_FALSE(host_matches("api-*.x.com", "api-.x.com"));  // '*' is one or more characters
  EXPECT_FALSE(host_matches("api-*.x.com", "api.x.com"));
  EXPECT_FALSE(host_matches("api-*.x.com", "xapi-1.x.com"));
  EXPECT_FALSE(host_matches("api-*.x.com", "api-1.y.x.com"));
  EXPECT_TRUE(host_matches("*-api.x.com", "eu-api.x.com"));
  EXPECT_FALSE(host_matches("*-api.x.com", "eu-api2.x.com"));
  EXPECT_TRUE(host_matches("a*b.x.com", "axb.x.com"));
  EXPECT_TRUE(host_matches("a*b.x.com", "abbb.x.com"));
  EXPECT_FALSE(host_matches("a*b.x.com", "ab.x.com"));
  EXPECT_TRUE(host_matches("*-*.x.com", "a-b.x.com"));
  EXPECT_FALSE(host_matches("*-*.x.com", "a-.x.com"));
}

TEST(HostMatches, StarPastTheFirstLabelNeverMatches) {
  EXPECT_FALSE(host_matches("a.*.com", "a.b.com"));
  EXPECT_FALSE(host_matches("*.*.com", "a.b.com"));
  EXPECT_FALSE(host_matches("api.*", "api.com"));
  EXPECT_FALSE(host_matches("a.*.com", "a.*.com"));
}

TEST(HostMatches, ManyStarsStayCheap) {
  std::string label(63, 'a');
  EXPECT_FALSE(host_matches("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b.x.com", label + ".x.com"));
  EXPECT_TRUE(host_matches("*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a.x.com", label + ".x.com"));
}

TEST(HostMatches, IPLiteralsMatchOnlyThemselves) {
  EXPECT_TRUE(host_matches("10.0.0.1", "10.0.0.1"));
  EXPECT_FALSE(host_matches("10.0.0.1", "10.0.0.2"));
  EXPECT_FALSE(host_matches("*.0.0.1", "10.0.0.1"));
  EXPECT_FALSE(host_matches("10.0.0.1", "10.0.0.1.example.com"));
  EXPECT_TRUE(host_matches("::1", "[::1]"));
  EXPECT_TRUE(host_matches("::1", "0:0::1"));
  EXPECT_FALSE(host_matches("::1", "::2"));
  EXPECT_FALSE(host_matches("10.0.0.1", "::ffff:10.0.0.1"));
}

// ---- NetworkRules::check ---------------------------------------------------

TEST(RulesCheck, DenyByDefault) {
  NetworkRules none;
  EXPECT_TRUE(none.empty());
  Decision d = none.check("/usr/bin/curl", "example.com", 443, nullptr);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "no rule allows example.com:443");

  NetworkRules defaults = supervisor::network_rules(policy::default_policy());
  EXPECT_TRUE(defaults.empty());
  EXPECT_FALSE(defaults.check("/usr/bin/curl", "api.github.com", 443, nullptr).allowed);
  EXPECT_FALSE(defaults.knows_host("api.github.com"));
}

TEST(RulesCheck, HostsAndPorts) {
  NetworkRules rules = rules_from(R"(
[network_policies.web]
endpoints = [ { host = "example.com", ports = [80, 8080] },
              { host = "*.cdn.example.com", port = 443 } ]
)");
  EXPECT_FALSE(rules.empty());
  Match match;
  Decision d = rules.check("/usr/bin/curl", "example.com", 80, &match);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.rule, "web");
  EXPECT_EQ(match.rule, "web");
  EXPECT_TRUE(rules.check("/usr/bin/curl", "EXAMPLE.com.", 8080, nullptr).allowed);
  EXPECT_TRUE(rules.check("/usr/bin/curl", "eu.cdn.example.com", 443, nullptr).allowed);

  d = rules.check("/usr/bin/curl", "example.com", 443, nullptr);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "no rule allows example.com:443");
  EXPECT_TRUE(d.rule.empty());
  EXPECT_FALSE(rules.check("/usr/bin/curl", "example.com", 0, nullptr).allowed);
  EXPECT_FALSE(rules.check("/usr/bin/curl", "eu.cdn.example.com", 80, nullptr).allowed);
  EXPECT_FALSE(rules.check("/usr/bin/curl", "cdn.example.com", 443, nullptr).allowed);
  EXPECT_FALSE(rules.check("/usr/bin/curl", "www.example.com", 80, nullptr).allowed);
  EXPECT_EQ(rules.check("/usr/bin/curl", "::1", 80, nullptr).reason, "no rule allows [::1]:80");
}

TEST(RulesCheck, DesignExampleBinaries) {
  NetworkRules rules = rules_from(kGithub);
  EXPECT_TRUE(rules.check("/usr/bin/git", "api.github.com", 443, nullptr).allowed);
  EXPECT_TRUE(rules.check("/usr/bin/curl", "raw.githubusercontent.com", 443, nullptr).allowed);
  EXPECT_FALSE(rules.check("/usr/bin/git", "githubusercontent.com", 443, nullptr).allowed);

  Decision d = rules.check("/usr/bin/wget", "api.github.com", 443, nullptr);
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason,
            "api.github.com:443 is allowed only for /usr/bin/git, /usr/bin/curl, not for "
            "/usr/bin/wget");
  EXPECT_FALSE(rules.check("/usr/bin/git2", "api.github.com", 443, nullptr).allowed);
  EXPECT_FALSE(rules.check("/usr/bin/gi", "api.github.com", 443, nullptr).allowed);
  EXPECT_FALSE(rules.check("/usr/local/bin/git", "api.github.com", 443, nullptr).allowed);
  // A binary allowed elsewhere still needs a rule for this host.
  EXPECT_EQ(rules.check("/usr/bin/git", "example.com", 443, nullptr).reason,
            "no rule allows example.com:443");
}

// A layer-7 endpoint allows the connection and hands its requests to its
// inspection; an endpoint at layer 4 for the same host and port makes the
// connection layer 4 (it allows every request anyway); tls = "skip" is
// layer 4 too, its bytes relayed unread.
TEST(RulesCheck, ALayer7EndpointMakesTheMatchInspected) {
  NetworkRules rules = rules_from(R"(
[network_policies.api]
endpoints = [ { host = "api.example.com", port = 443, protocol = "rest", access = "read-only" } ]
)");
  Match match;
  Decision d = rules.check("/usr/bin/curl", "api.example.com", 443, &match);
  ASSERT_TRUE(d.allowed);
  ASSERT_EQ(match.inspect.size(), 1u);
  EXPECT_EQ(match.inspect[0]->policy, "api");
  EXPECT_EQ(match.inspect[0]->protocol, "rest");
  EXPECT_TRUE(match.inspect[0]->rules.judge("GET", "/x").allowed);
  EXPECT_FALSE(match.inspect[0]->rules.judge("POST", "/x").allowed);
  EXPECT_EQ(rules.check("/usr/bin/curl", "api.example.com", 80, nullptr).reason,
            "no rule allows api.example.com:80");

  NetworkRules both = rules_from(R"(
[network_policies.api]
endpoints = [ { host = "api.example.com", port = 443, protocol = "rest", access = "read-only" } ]
[network_policies.plain]
endpoints = [ { host = "api.example.com", port = 443 } ]
)");
  Match plain;
  ASSERT_TRUE(both.check("/usr/bin/curl", "api.example.com", 443, &plain).allowed);
  EXPECT_TRUE(plain.inspect.empty()) << "a layer-4 endpoint for the same host and port";

  NetworkRules skip = rules_from(R"(
[network_policies.db]
endpoints = [ { host = "db.example.com", port = 5432, protocol = "rest", tls = "skip" } ]
)");
  Match opaque;
  ASSERT_TRUE(skip.check("/usr/bin/psql", "db.example.com", 5432, &opaque).allowed);
  EXPECT_TRUE(opaque.inspect.empty()) << "tls = \"skip\" relays the bytes unread";
}

TEST(RulesCheck, BinaryGlobs) {
  NetworkRules rules = rules_from(R"(
[network_policies.pypi]
endpoints = [ { host = "pypi.example", port = 443 } ]
binaries = [ { path = "/usr/bin/python3*" }, { path = "/opt/tools/*" } ]
)");
  EXPECT_TRUE(rules.check("/usr/bin/python3.11", "pypi.example", 443, nullptr).allowed);
  EXPECT_TRUE(rules.check("/usr/bin/python3", "pypi.example", 443, nullptr).allowed);
  EXPECT_FALSE(rules.check("/usr/bin/python2", "pypi.example", 443, nullptr).allowed);
  EXPECT_TRUE(rules.check("/opt/tools/pip", "pypi.example", 443, nullptr).allowed);
  // FNM_PATHNAME: '*' does not cross a '/'.
  EXPECT_FALSE(rules.check("/opt/tools/sub/pip", "pypi.example", 443, nullptr).allowed);
  EXPECT_FALSE(
      rules.check("/usr/bin/python3/../../../bin/sh", "pypi.example", 443, nullptr).allowed);
}

TEST(RulesCheck, UnknownCallerMatchesOnlyRulesWithoutBinaries) {
  NetworkRules rules = rules_from(R"(
[network_policies.anyone]
endpoints = [ { host = "open.example.com", port = 443 } ]

[network_policies.tools]
endpoints = [ { host = "tools.example.com", port = 443 } ]
binaries = [ { path = "/*" } ]
)");
  EXPECT_TRUE(rules.check("", "open.example.com", 443, nullptr).allowed);
  Decision d = rules.check("", "tools.example.com", 443, nullptr);
  EXPECT_FALSE(d.allowed);
  EXPECT_THAT(d.reason, HasSubstr("is allowed only for /*, not for"));
  EXPECT_THAT(d.reason, HasSubstr("unknown"));
  EXPECT_TRUE(rules.check("/git", "tools.example.com", 443, nullptr).allowed);

  // Even a pattern that would match the empty string (parse refuses it, a
  // Policy built in code need not) does not let an unknown caller through.
  policy::Policy built;
  built.network.push_back({"star", {{"star.example.com", {443}, {}, "", ""}}, {{"*"}}});
  NetworkRules star = supervisor::network_rules(built);
  EXPECT_TRUE(star.check("git", "star.example.com", 443, nullptr).allowed);
  EXPECT_FALSE(star.check("", "star.example.com", 443, nullptr).allowed);
}

TEST(RulesCheck, NamesBinariesOnlyWhenSomeRuleDoes) {
  // The proxy looks for the caller only when this is true.
  EXPECT_FALSE(NetworkRules().names_binaries());
  EXPECT_FALSE(rules_from(R"(
[network_policies.a]
endpoints = [ { host = "a.example.com", port = 443 } ]
[network_policies.b]
endpoints = [ { host = "b.example.com", port = 443 } ]
)")
                   .names_binaries());
  EXPECT_TRUE(rules_from(R"(
[network_policies.a]
endpoints = [ { host = "a.example.com", port = 443 } ]
[network_policies.b]
endpoints = [ { host = "b.example.com", port = 443 } ]
binaries = [ { path = "/usr/bin/curl" } ]
)")
                  .names_binaries());
}

TEST(RulesCheck, SymlinksResolvedThroughTheResolver) {
  std::map<std::string, std::string> links = {{"/usr/bin/python3", "/usr/bin/python3.11"},
                                              {"/usr/bin/gone", ""}};
  std::vector<std::string> asked;
  auto resolve = [&](const std::string& path) {
    asked.push_back(path);
    auto it = links.find(path);
    return it == links.end() ? path : it->second;
  };
  const std::string toml = R"(
[network_policies.pypi]
endpoints = [ { host = "pypi.example", port = 443 } ]
binaries = [ { path = "/usr/bin/python3" }, { path = "/usr/bin/gone" }, { path = "/opt/*/pip" } ]
)";
  NetworkRules rules = rules_from(toml, resolve);
  EXPECT_TRUE(rules.check("/usr/bin/python3.11", "pypi.example", 443, nullptr).allowed);
  // The caller's executable comes resolved, so the link's own path is not it.
  EXPECT_FALSE(rules.check("/usr/bin/python3", "pypi.example", 443, nullptr).allowed);
  // Nothing to resolve to: the path as written.
  EXPECT_TRUE(rules.check("/usr/bin/gone", "pypi.example", 443, nullptr).allowed);
  EXPECT_TRUE(rules.check("/opt/x/pip", "pypi.example", 443, nullptr).allowed);
  // Globs are not handed to the resolver.
  EXPECT_EQ(asked, (std::vector<std::string>{"/usr/bin/python3", "/usr/bin/gone"}));
  // The reason names the binaries as the policy wrote them.
  EXPECT_THAT(rules.check("/usr/bin/curl", "pypi.example", 443, nullptr).reason,
              HasSubstr("only for /usr/bin/python3, /usr/bin/gone, /opt/*/pip, not for "
                        "/usr/bin/curl"));

  NetworkRules unresolved = rules_from(toml);
  EXPECT_FALSE(unresolved.check("/usr/bin/python3.11", "pypi.example", 443, nullptr).allowed);
  EXPECT_TRUE(unresolved.check("/usr/bin/python3", "pypi.example", 443, nullptr).allowed);
}

TEST(RulesCheck, SeveralRules) {
  NetworkRules rules = rules_from(std::string(kGithub) + R"(
[network_policies.pypi]
endpoints = [ { host = "pypi.example", port = 443 } ]
)");
  Decision d = rules.check("/usr/bin/wget", "pypi.example", 443, nullptr);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.rule, "pypi");
  d = rules.check("/usr/bin/git", "api.github.com", 443, nullptr);
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.rule, "github");
  EXPECT_FALSE(rules.check("/usr/bin/wget", "api.github.com", 443, nullptr).allowed);
}

// ---- NetworkRules::check_address -------------------------------------------

TEST(RulesAddress, SSRFGuardWithoutAllowedIps) {
  NetworkRules rules = rules_from(kGithub);
  Match match;
  ASSERT_TRUE(rules.check("/usr/bin/git", "api.github.com", 443, &match).allowed);
  EXPECT_EQ(match.rule, "github");
  EXPECT_TRUE(match.allowed_ips.empty());

  Decision d = rules.check_address(match, addr("140.82.112.3"));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.rule, "github");
  EXPECT_TRUE(rules.check_address(match, addr("2606:50c0:8000::153")).allowed);

  d = rules.check_address(match, addr("127.0.0.1"));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "127.0.0.1 is loopback (SSRF guard)");
  EXPECT_EQ(rules.check_address(match, addr("169.254.169.254")).reason,
            "169.254.169.254 is link-local (cloud metadata) (SSRF guard)");
  EXPECT_EQ(rules.check_address(match, addr("10.0.0.5")).reason,
            "10.0.0.5 is private (SSRF guard)");
  EXPECT_EQ(rules.check_address(match, addr("::ffff:127.0.0.1")).reason,
            "::ffff:127.0.0.1 is loopback (SSRF guard)");
  EXPECT_FALSE(rules.check_address(match, addr("64:ff9b::7f00:1")).allowed);
  EXPECT_FALSE(rules.check_address(match, addr("::1")).allowed);
  EXPECT_FALSE(rules.check_address(match, addr("0.0.0.0")).allowed);
  EXPECT_FALSE(rules.check_address(match, addr("fd00::1")).allowed);
}

TEST(RulesAddress, AllowedIpsOverrideTheGuardAndNarrow) {
  NetworkRules rules = rules_from(R"(
[network_policies.internal]
endpoints = [ { host = "git.corp.example", port = 443, allowed_ips = ["10.0.0.0/8", "127.0.0.1"] } ]
)");
  Match match;
  ASSERT_TRUE(rules.check("/usr/bin/git", "git.corp.example", 443, &match).allowed);
  ASSERT_EQ(match.allowed_ips.size(), 2u);
  EXPECT_TRUE(rules.check_address(match, addr("10.1.2.3")).allowed);
  EXPECT_TRUE(rules.check_address(match, addr("::ffff:10.1.2.3")).allowed);
  EXPECT_TRUE(rules.check_address(match, addr("127.0.0.1")).allowed);
  EXPECT_FALSE(rules.check_address(match, addr("127.0.0.2")).allowed);
  Decision d = rules.check_address(match, addr("192.168.1.1"));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "192.168.1.1 is not in the endpoint's allowed_ips");
  // A public address outside allowed_ips is refused too.
  EXPECT_FALSE(rules.check_address(match, addr("140.82.112.3")).allowed);
}

TEST(RulesAddress, AllowedIpsNarrowPublicAddresses) {
  NetworkRules rules = rules_from(R"(
[network_policies.github]
endpoints = [ { host = "api.github.com", port = 443, allowed_ips = ["140.82.112.0/20"] } ]
)");
  Match match;
  ASSERT_TRUE(rules.check("/usr/bin/git", "api.github.com", 443, &match).allowed);
  EXPECT_TRUE(rules.check_address(match, addr("140.82.112.3")).allowed);
  EXPECT_TRUE(rules.check_address(match, addr("140.82.127.255")).allowed);
  EXPECT_FALSE(rules.check_address(match, addr("140.82.128.0")).allowed);
  EXPECT_FALSE(rules.check_address(match, addr("8.8.8.8")).allowed);
}

TEST(RulesAddress, OverlappingEndpointsWiden) {
  // The wildcard rule comes first and is narrow; the exact one still allows
  // public addresses for its host.
  NetworkRules rules = rules_from(R"(
[network_policies.a_internal]
endpoints = [ { host = "*.example.com", port = 443, allowed_ips = ["10.0.0.0/8"] } ]

[network_policies.b_public]
endpoints = [ { host = "api.example.com", port = 443 } ]
)");
  Match match;
  ASSERT_TRUE(rules.check("/usr/bin/curl", "api.example.com", 443, &match).allowed);
  EXPECT_EQ(match.rule, "a_internal");
  Decision d = rules.check_address(match, addr("93.184.216.34"));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.rule, "b_public");
  d = rules.check_address(match, addr("10.0.0.1"));
  EXPECT_TRUE(d.allowed);
  EXPECT_EQ(d.rule, "a_internal");
  d = rules.check_address(match, addr("192.168.0.1"));
  EXPECT_FALSE(d.allowed);
  EXPECT_EQ(d.reason, "192.168.0.1 is not in the endpoint's allowed_ips");

  // Only the narrow rule for other names.
  ASSERT_TRUE(rules.check("/usr/bin/curl", "www.example.com", 443, &match).allowed);
  EXPECT_TRUE(match.also.empty());
  EXPECT_FALSE(rules.check_address(match, addr("93.184.216.34")).allowed);
}

// policy::parse() refuses a bad allowed_ips entry; a policy built in code
// that holds one is still refused here, naming the entry.
TEST(RulesCompile, BadAllowedIpsNameTheEntry) {
  policy::Policy p;
  policy::NetworkPolicy x;
  x.name = "x";
  x.endpoints.push_back({"a.example.com", {443}, {}, "", ""});
  x.endpoints.push_back({"b.example.com", {443}, {"10.0.0.0/8", "10.0.0.0/33"}, "", ""});
  p.network.push_back(x);
  try {
    supervisor::network_rules(p);
    FAIL() << "network_rules() accepted allowed_ips 10.0.0.0/33";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("network_policies.x.endpoints[1].allowed_ips[1]: \"10.0.0.0/33\" is "
                          "not an IP address or CIDR"));
  }
  p.network[0].endpoints[1].allowed_ips = {"corp"};
  EXPECT_THROW(supervisor::network_rules(p), Error);
  p.network[0].endpoints[1].allowed_ips = {"10.0.0.0/8", "fd00::/8"};
  EXPECT_NO_THROW(supervisor::network_rules(p));
}

TEST(RulesKnowsHost, AnyEndpointHost) {
  NetworkRules rules = rules_from(std::string(kGithub) + R"(
[network_policies.pypi]
endpoints = [ { host = "pypi.example", port = 443 } ]
)");
  EXPECT_TRUE(rules.knows_host("api.github.com"));
  EXPECT_TRUE(rules.knows_host("API.GITHUB.COM."));
  EXPECT_TRUE(rules.knows_host("objects.githubusercontent.com"));
  EXPECT_TRUE(rules.knows_host("pypi.example"));
  EXPECT_FALSE(rules.knows_host("githubusercontent.com"));
  EXPECT_FALSE(rules.knows_host("example.com"));
  EXPECT_FALSE(rules.knows_host(""));
  EXPECT_FALSE(NetworkRules().knows_host("api.github.com"));
}

// ---- Plain HTTP through the proxy: one request, and nothing after it -------

// How many bytes of `stream` the body takes, fed in pieces of `step` bytes.
size_t body_bytes(BodyEnd body, std::string_view stream, size_t step) {
  size_t used = 0;
  for (size_t at = 0; at < stream.size() && !body.done() && !body.failed(); at += step)
    used += body.feed(stream.substr(at, step));
  EXPECT_TRUE(body.done()) << stream;
  return used;
}

TEST(ProxyBodyEnd, ContentLength) {
  for (size_t step : {1, 2, 7, 100}) {
    EXPECT_EQ(body_bytes(BodyEnd::length(5), "hello", step), 5u);
    EXPECT_EQ(body_bytes(BodyEnd::length(5), "helloGET http://other/ HTTP/1.1\r\n\r\n", step), 5u);
  }
  BodyEnd none = BodyEnd::none();
  EXPECT_TRUE(none.done());
  EXPECT_EQ(none.feed("GET http://other/ HTTP/1.1\r\n\r\n"), 0u);
  EXPECT_TRUE(BodyEnd::length(0).done());
}

TEST(ProxyBodyEnd, ChunkedEndsAfterTheLastChunkAndTrailers) {
  const std::string next = "GET http://other.example.test/ HTTP/1.1\r\n\r\n";
  for (std::string body :
       {std::string("5\r\nhello\r\n0\r\n\r\n"),
        std::string("5;name=value\r\nhello\r\n6 \r\n world\r\n0\r\n\r\n"),
        std::string("A\r\n0123456789\r\na\r\n0123456789\r\n0\r\nX-Sum: 1\r\nX-More: 2\r\n\r\n"),
        std::string("5\nhello\n0\n\n"),  // bare LF
        std::string("0\r\n\r\n")})
    for (size_t step : {1, 3, 1000})
      EXPECT_EQ(body_bytes(BodyEnd::chunked(), body + next, step), body.size()) << body << step;
}

TEST(ProxyBodyEnd, MalformedChunkedFails) {
  for (const char* stream : {"zz\r\nhello\r\n", "\r\n", "5\r\nhelloXX\r\n0\r\n\r\n",
                             "5 x\r\nhello\r\n", "10000000000000000\r\n"}) {
    BodyEnd body = BodyEnd::chunked();
    body.feed(stream);
    EXPECT_TRUE(body.failed()) << stream;
    EXPECT_EQ(body.feed("0\r\n\r\n"), 0u);
  }
  BodyEnd long_line = BodyEnd::chunked();
  long_line.feed("1;" + std::string(10000, 'x'));
  EXPECT_TRUE(long_line.failed());
}

TEST(ProxyOriginRequest, OriginFormHostFromTheUrlNoHopByHopFields) {
  OriginRequest r;
  ASSERT_EQ(origin_request("GET http://API.example.test:8766/a?b=1 HTTP/1.1\r\n"
                           "Host: other.example.test:8766\r\n"
                           "Proxy-Connection: Keep-Alive\r\n"
                           "Connection: keep-alive, X-Hop\r\n"
                           "Keep-Alive: timeout=5\r\n"
                           "X-Hop: 1\r\n"
                           "Proxy-Authorization: Basic eDp5\r\n"
                           "Accept: */*\r\n\r\n",
                           &r),
            "");
  EXPECT_EQ(r.host, "api.example.test");
  EXPECT_EQ(r.port, 8766);
  EXPECT_EQ(r.head,
            "GET /a?b=1 HTTP/1.1\r\nHost: API.example.test:8766\r\nAccept: */*\r\nConnection: "
            "close\r\n\r\n");
  EXPECT_FALSE(r.upgrade);
  EXPECT_TRUE(r.body.done());

  ASSERT_EQ(origin_request("GET http://example.test HTTP/1.0\r\n\r\n", &r), "");
  EXPECT_EQ(r.port, 80);
  EXPECT_EQ(r.head, "GET / HTTP/1.0\r\nHost: example.test\r\nConnection: close\r\n\r\n");
  ASSERT_EQ(origin_request("GET http://[2001:db8::1]:8080?q HTTP/1.1\r\n\r\n", &r), "");
  EXPECT_EQ(r.host, "2001:db8::1");
  EXPECT_EQ(r.head, "GET /?q HTTP/1.1\r\nHost: [2001:db8::1]:8080\r\nConnection: close\r\n\r\n");
}

TEST(ProxyOriginRequest, BodyFraming) {
  OriginRequest r;
  ASSERT_EQ(origin_request("POST http://a.test/ HTTP/1.1\r\nContent-Length: 5\r\n\r\n", &r), "");
  EXPECT_THAT(r.head, HasSubstr("\r\nContent-Length: 5\r\n"));
  EXPECT_EQ(r.body.feed("helloGET"), 5u);
  EXPECT_TRUE(r.body.done());
  ASSERT_EQ(origin_request("POST http://a.test/ HTTP/1.1\r\nContent-Length: 5, 5\r\n\r\n", &r), "");
  EXPECT_EQ(r.body.feed("helloGET"), 5u);
  ASSERT_EQ(origin_request(
                "POST http://a.test/ HTTP/1.1\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", &r),
            "");
  EXPECT_THAT(r.head, HasSubstr("\r\nTransfer-Encoding: gzip, Chunked\r\n"));
  EXPECT_EQ(r.body.feed("1\r\nx\r\n0\r\n\r\nGET"), 11u);
  EXPECT_TRUE(r.body.done());
}

TEST(ProxyOriginRequest, Refusals) {
  OriginRequest r;
  const std::string get = "GET http://a.test/ HTTP/1.1\r\n";
  EXPECT_THAT(origin_request(get + "Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", &r),
              HasSubstr("both Transfer-Encoding and Content-Length"));
  EXPECT_THAT(origin_request(get + "Content-Length: 5\r\nContent-Length: 6\r\n\r\n", &r),
              HasSubstr("Content-Length"));
  EXPECT_THAT(origin_request(get + "Content-Length: 5, 6\r\n\r\n", &r),
              HasSubstr("Content-Length"));
  EXPECT_THAT(origin_request(get + "Content-Length: -1\r\n\r\n", &r), HasSubstr("Content-Length"));
  EXPECT_THAT(origin_request(get + "Transfer-Encoding: chunked, gzip\r\n\r\n", &r),
              HasSubstr("does not end in chunked"));
  EXPECT_THAT(origin_request(get + "X-A: 1\r\n folded\r\n\r\n", &r), HasSubstr("folded"));
  EXPECT_THAT(origin_request(get + "Content-Length : 5\r\n\r\n", &r), HasSubstr("malformed"));
  EXPECT_THAT(origin_request(get + "no colon\r\n\r\n", &r), HasSubstr("malformed"));
  EXPECT_THAT(origin_request(get + "X-A: 1\nGET http://b.test/ HTTP/1.1\r\n\r\n", &r),
              HasSubstr("stray"));
  EXPECT_THAT(origin_request("GET https://a.test/ HTTP/1.1\r\n\r\n", &r),
              HasSubstr("only http://"));
  EXPECT_THAT(origin_request("GET /a HTTP/1.1\r\nHost: a.test\r\n\r\n", &r),
              HasSubstr("only http://"));
  EXPECT_THAT(origin_request("GET http://:80/ HTTP/1.1\r\n\r\n", &r), HasSubstr("bad URL"));
  EXPECT_THAT(origin_request("GET http://a.test:0/ HTTP/1.1\r\n\r\n", &r), HasSubstr("bad URL"));
  EXPECT_THAT(origin_request("GET http://a.test/ HTTP/2\r\n\r\n", &r), HasSubstr("not an HTTP/1"));
}

TEST(ProxyOriginRequest, UpgradeKeepsItsFields) {
  OriginRequest r;
  ASSERT_EQ(origin_request(
                "GET http://a.test:81/chat HTTP/1.1\r\nHost: a.test:81\r\nUpgrade: websocket\r\n"
                "Connection: keep-alive, Upgrade\r\nSec-WebSocket-Key: k\r\n\r\n",
                &r),
            "");
  EXPECT_TRUE(r.upgrade);
  EXPECT_EQ(
      r.head,
      "GET /chat HTTP/1.1\r\nHost: a.test:81\r\nUpgrade: websocket\r\nSec-WebSocket-Key: k\r\n"
      "Connection: Upgrade\r\n\r\n");
  // Upgrade without the Connection option is no upgrade, and is dropped.
  ASSERT_EQ(origin_request("GET http://a.test/ HTTP/1.1\r\nUpgrade: websocket\r\n\r\n", &r), "");
  EXPECT_FALSE(r.upgrade);
  EXPECT_EQ(r.head, "GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n");
}

TEST(ProxyResponse, StatusAndClosingHead) {
  EXPECT_EQ(response_status("HTTP/1.1 200 OK\r\n\r\n"), 200);
  EXPECT_EQ(response_status("HTTP/1.0 101 Switching Protocols\r\n\r\n"), 101);
  EXPECT_EQ(response_status("HTTP/1.1 204\r\n\r\n"), 204);
  EXPECT_EQ(response_status("HTTP/1.1 2000 OK\r\n\r\n"), 0);
  EXPECT_EQ(response_status("HTTP/1.1 099 Low\r\n\r\n"), 0);
  EXPECT_EQ(response_status("SSH-2.0-OpenSSH\r\n\r\n"), 0);
  EXPECT_EQ(closing_response_head(
                "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, X-Hop\r\n"
                "Keep-Alive: timeout=5,\r\n max=100\r\nX-Hop: 1\r\nX-End: 2\r\n\r\n"),
            "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-End: 2\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(closing_response_head("HTTP/1.0 200 OK\r\n\r\n"),
            "HTTP/1.0 200 OK\r\nConnection: close\r\n\r\n");
}

}  // namespace
}  // namespace openshell::egress
