#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "policy/edit.h"
#include "policy/policy.h"
#include "spec/container_spec.h"
#include "supervisor/ssrf_warnings.h"

namespace openshell::policy {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

Policy two_rules() {
  return parse(R"(version = 1
[network_policies.zeta]
endpoints = [ { host = "z.example.com", port = 443 } ]
[network_policies.alpha]
endpoints = [ { host = "a.example.com", ports = [80, 443] } ]
)",
               "p.toml");
}

std::vector<std::string> names(const Policy& p) {
  std::vector<std::string> out;
  for (const auto& rule : p.network) out.push_back(rule.name);
  return out;
}

TEST(PolicyUpdate, RulesEndSortedByNameAndNewEndpointsLast) {
  Policy p = two_rules();
  Update u;
  u.add = {{"localhost", 9000}};
  UpdateResult r = apply_update(&p, u);
  EXPECT_TRUE(r.changed);
  EXPECT_THAT(r.notes, ElementsAre("added localhost:9000 to rule cli"));
  EXPECT_THAT(names(p), ElementsAre("alpha", "cli", "zeta"));
  // The text written out keeps that order, so it reads as it parses.
  std::string text = to_toml(p);
  EXPECT_LT(text.find("[network_policies.alpha]"), text.find("[network_policies.cli]"));
  EXPECT_LT(text.find("[network_policies.cli]"), text.find("[network_policies.zeta]"));
  EXPECT_EQ(parse(text, "again"), p);

  Update more;
  more.rule = "alpha";
  more.add = {{"b.example.com", 443}};
  apply_update(&p, more);
  ASSERT_EQ(p.network[0].endpoints.size(), 2u);
  EXPECT_EQ(p.network[0].endpoints[0].host, "a.example.com");
  EXPECT_EQ(p.network[0].endpoints[1].host, "b.example.com");
}

TEST(PolicyUpdate, AnEndpointAlreadyThereIsNotAddedAgain) {
  Policy p = two_rules();
  Update u;
  u.rule = "alpha";
  u.add = {{"A.EXAMPLE.COM", 443}};
  Policy before = p;
  UpdateResult r = apply_update(&p, u);
  EXPECT_FALSE(r.changed);
  EXPECT_THAT(r.notes, ElementsAre("A.EXAMPLE.COM:443 is already in rule alpha, unchanged"));
  EXPECT_EQ(p, before);
  // Twice in a row: the second changes nothing.
  Update cli;
  cli.add = {{"localhost", 9000}};
  EXPECT_TRUE(apply_update(&p, cli).changed);
  Policy once = p;
  EXPECT_FALSE(apply_update(&p, cli).changed);
  EXPECT_EQ(p, once);
}

TEST(PolicyUpdate, AllowedIpsAreSetOnTheAddedOrExistingEndpoint) {
  Policy p = two_rules();
  Update u;
  u.add = {{"localhost", 9000}};
  u.allowed_ips = {"127.0.0.1/32"};
  apply_update(&p, u);
  ASSERT_EQ(p.network[1].name, "cli");
  EXPECT_THAT(p.network[1].endpoints[0].allowed_ips, ElementsAre("127.0.0.1/32"));
  // The same again: unchanged; another CIDR: replaced, not a second endpoint.
  EXPECT_FALSE(apply_update(&p, u).changed);
  u.allowed_ips = {"127.0.0.0/8"};
  UpdateResult r = apply_update(&p, u);
  EXPECT_TRUE(r.changed);
  EXPECT_THAT(r.notes, ElementsAre("set the allowed_ips of localhost:9000 in rule cli"));
  ASSERT_EQ(p.network[1].endpoints.size(), 1u);
  EXPECT_THAT(p.network[1].endpoints[0].allowed_ips, ElementsAre("127.0.0.0/8"));
  // An endpoint with several ports: the port gets its own endpoint.
  Update alpha;
  alpha.rule = "alpha";
  alpha.add = {{"a.example.com", 80}};
  alpha.allowed_ips = {"10.0.0.0/8"};
  apply_update(&p, alpha);
  ASSERT_EQ(p.network[0].endpoints.size(), 2u);
  EXPECT_THAT(p.network[0].endpoints[0].ports, ElementsAre(443));
  EXPECT_THAT(p.network[0].endpoints[0].allowed_ips, IsEmpty());
  EXPECT_THAT(p.network[0].endpoints[1].ports, ElementsAre(80));
  EXPECT_THAT(p.network[0].endpoints[1].allowed_ips, ElementsAre("10.0.0.0/8"));
}

TEST(PolicyUpdate, ErrorsChangeNothing) {
  Policy p = two_rules();
  Policy before = p;
  Update u;
  u.remove = {{"nowhere.example.com", 1}};
  u.add = {{"localhost", 9000}};
  EXPECT_THROW(
      {
        try {
          apply_update(&p, u);
        } catch (const Error& e) {
          EXPECT_STREQ(e.what(),
                       "--remove-endpoint nowhere.example.com:1: the policy has no such "
                       "endpoint");
          throw;
        }
      },
      Error);
  EXPECT_EQ(p, before);
  Update bad;
  bad.add = {{"localhost", 9000}};
  bad.allowed_ips = {"nonsense"};
  EXPECT_THROW(apply_update(&p, bad), Error);
  EXPECT_EQ(p, before);
}

TEST(PolicyUpdate, RemovalTakesThePortAndEmptyRulesGo) {
  Policy p = two_rules();
  Update u;
  u.remove = {{"a.example.com", 80}, {"z.example.com", 443}};
  EXPECT_TRUE(apply_update(&p, u).changed);
  EXPECT_THAT(names(p), ElementsAre("alpha"));
  EXPECT_THAT(p.network[0].endpoints[0].ports, ElementsAre(443));
}

TEST(PolicyUpdate, BinariesAreNotAddedTwice) {
  Policy p = two_rules();
  Update u;
  u.rule = "alpha";
  u.add = {{"a.example.com", 443}};
  u.binaries = {"/usr/bin/git"};
  EXPECT_TRUE(apply_update(&p, u).changed);
  EXPECT_FALSE(apply_update(&p, u).changed);
  ASSERT_EQ(p.network[0].binaries.size(), 1u);
}

std::string rule_ref_error(const std::string& flag, const std::string& text) {
  try {
    parse_rule_ref(flag, text);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parse_rule_ref accepted " << text;
  return "";
}

std::string update_error(Policy* p, const Update& u) {
  try {
    apply_update(p, u);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "apply_update accepted";
  return "";
}

TEST(PolicyRuleRef, ReadsHostPortMethodAndPath) {
  RuleRef r = parse_rule_ref("--add-allow", "api.github.com:443:get:/repos/**");
  EXPECT_EQ(r.endpoint.host, "api.github.com");
  EXPECT_EQ(r.endpoint.port, 443);
  EXPECT_EQ(r.method, "GET");
  EXPECT_EQ(r.path, "/repos/**");
  RuleRef v6 = parse_rule_ref("--add-deny", "[2001:db8::1]:8443:*:/a:b/*");
  EXPECT_EQ(v6.endpoint.host, "2001:db8::1");
  EXPECT_EQ(v6.endpoint.port, 8443);
  EXPECT_EQ(v6.method, "*");
  EXPECT_EQ(v6.path, "/a:b/*") << "the path may hold ':'";
}

TEST(PolicyRuleRef, BadSpecsGetOneClearLine) {
  const std::string form =
      "expected HOST:PORT:METHOD:PATH_GLOB (like api.github.com:443:GET:/repos/**)";
  EXPECT_EQ(rule_ref_error("--add-allow", "api.github.com:443"),
            "--add-allow api.github.com:443: " + form);
  EXPECT_EQ(rule_ref_error("--add-allow", "api.github.com:443:GET"),
            "--add-allow api.github.com:443:GET: " + form);
  EXPECT_EQ(rule_ref_error("--add-deny", ":443:GET:/"), "--add-deny :443:GET:/: " + form);
  EXPECT_EQ(rule_ref_error("--add-allow", "a.com:0:GET:/"),
            "--add-allow a.com:0:GET:/: the port must be 1-65535");
  EXPECT_EQ(rule_ref_error("--add-allow", "a.com:http:GET:/"),
            "--add-allow a.com:http:GET:/: the port must be 1-65535");
  EXPECT_EQ(rule_ref_error("--remove-rule", "a.com:443:GET:repos"),
            "--remove-rule a.com:443:GET:repos: the path glob must start with '/' (like "
            "\"/repos/**\")");
  EXPECT_EQ(rule_ref_error("--add-allow", "a.com:443:G(T:/"),
            "--add-allow a.com:443:G(T:/: the method \"G(T\" is not an HTTP method (like GET or "
            "POST)");
  EXPECT_EQ(rule_ref_error("--add-allow", "a.com:443::/"),
            "--add-allow a.com:443::/: the method must not be empty (\"*\" is any method)");
  EXPECT_EQ(rule_ref_error("--add-allow", "a/b:443:GET:/"),
            "--add-allow a/b:443:GET:/: the host has an invalid character '/'");
  EXPECT_EQ(rule_ref_error("--add-allow", "[2001:db8::1:443:GET:/"),
            "--add-allow [2001:db8::1:443:GET:/: an IPv6 host in brackets must be followed by "
            ":PORT (" +
                form + ")");
}

Policy layer4() {
  return parse(R"(version = 1
[network_policies.github]
endpoints = [ { host = "api.github.com", ports = [443, 80] } ]
)",
               "p.toml");
}

TEST(PolicyUpdateRules, AddAllowInspectsAnEndpointOfThatPortOnly) {
  Policy p = layer4();
  Update u;
  u.add_allow = {parse_rule_ref("--add-allow", "API.github.com:443:GET:/repos/**")};
  UpdateResult r = apply_update(&p, u);
  EXPECT_TRUE(r.changed);
  EXPECT_THAT(
      r.notes,
      ElementsAre("API.github.com:443 in rule github is now inspected (protocol = \"rest\")",
                  "API.github.com:443 in rule github now allows only the requests its "
                  "rules allow",
                  "allowed GET /repos/** on API.github.com:443 in rule github"));
  ASSERT_EQ(p.network.size(), 1u);
  ASSERT_EQ(p.network[0].endpoints.size(), 2u);
  const Endpoint& port80 = p.network[0].endpoints[0];
  EXPECT_THAT(port80.ports, ElementsAre(80));
  EXPECT_EQ(port80.protocol, "") << "port 80 stays layer 4";
  EXPECT_THAT(port80.rules, IsEmpty());
  const Endpoint& port443 = p.network[0].endpoints[1];
  EXPECT_THAT(port443.ports, ElementsAre(443));
  EXPECT_EQ(port443.protocol, "rest");
  ASSERT_EQ(port443.rules.size(), 1u);
  EXPECT_EQ(port443.rules[0], (HttpRule{"GET", "/repos/**", {}}));
  // The result is a policy parse() accepts, and the same rule again changes nothing.
  EXPECT_EQ(parse(to_toml(p), "again.toml"), p);
  UpdateResult again = apply_update(&p, u);
  EXPECT_FALSE(again.changed);
  EXPECT_THAT(again.notes,
              ElementsAre("API.github.com:443 in rule github allows GET /repos/** already, "
                          "unchanged"));
}

TEST(PolicyUpdateRules, AddAllowWithoutAnEndpointAddsOneToTheRule) {
  Policy p = layer4();
  Update u;
  u.add_allow = {parse_rule_ref("--add-allow", "[2001:db8::1]:8443:POST:/v1/**")};
  u.allowed_ips = {"2001:db8::1/128"};
  UpdateResult r = apply_update(&p, u);
  EXPECT_TRUE(r.changed);
  EXPECT_THAT(r.notes, ElementsAre("added [2001:db8::1]:8443 to rule cli, inspected (protocol = "
                                   "\"rest\"), allowing POST /v1/**"));
  ASSERT_EQ(p.network.size(), 2u);
  EXPECT_EQ(p.network[0].name, "cli");
  const Endpoint& e = p.network[0].endpoints.at(0);
  EXPECT_EQ(e.host, "2001:db8::1");
  EXPECT_THAT(e.ports, ElementsAre(8443));
  EXPECT_THAT(e.allowed_ips, ElementsAre("2001:db8::1/128"));
  EXPECT_EQ(e.protocol, "rest");
  EXPECT_EQ(e.rules.at(0), (HttpRule{"POST", "/v1/**", {}}));
  EXPECT_EQ(parse(to_toml(p), "again.toml"), p);
}

TEST(PolicyUpdateRules, AddAllowTurnsAnAccessPresetIntoItsRules) {
  Policy p = parse(R"(version = 1
[network_policies.github]
endpoints = [ { host = "api.github.com", port = 443, protocol = "rest", access = "read-only" } ]
)",
                   "p.toml");
  Update u;
  u.add_allow = {parse_rule_ref("--add-allow", "api.github.com:443:POST:/repos/*/issues")};
  UpdateResult r = apply_update(&p, u);
  EXPECT_TRUE(r.changed);
  const Endpoint& e = p.network[0].endpoints[0];
  EXPECT_EQ(e.access, "");
  EXPECT_THAT(e.rules,
              ElementsAre(HttpRule{"GET", "/**", {}}, HttpRule{"HEAD", "/**", {}},
                          HttpRule{"OPTIONS", "/**", {}}, HttpRule{"POST", "/repos/*/issues", {}}));
  EXPECT_EQ(r.notes[0],
            "replaced access = \"read-only\" of api.github.com:443 in rule github with the rules "
            "it stands for");
  EXPECT_EQ(parse(to_toml(p), "again.toml"), p);

  Policy full = parse(R"(version = 1
[network_policies.github]
endpoints = [ { host = "api.github.com", port = 443, protocol = "rest", access = "full" } ]
)",
                      "p.toml");
  Policy before = full;
  EXPECT_FALSE(apply_update(&full, u).changed);
  EXPECT_EQ(full, before);
}

TEST(PolicyUpdateRules, AddDenyNeedsAnEndpointAndKeepsTheRestAllowed) {
  Policy p = layer4();
  Policy before = p;
  Update nowhere;
  nowhere.add_deny = {parse_rule_ref("--add-deny", "other.example.com:443:DELETE:/**")};
  EXPECT_EQ(update_error(&p, nowhere),
            "--add-deny other.example.com:443:DELETE /**: the policy has no endpoint "
            "other.example.com:443 (a deny rule goes on one: add it with --add-endpoint or "
            "--add-allow)");
  EXPECT_EQ(p, before);

  Update u;
  u.add_deny = {parse_rule_ref("--add-deny", "api.github.com:443:DELETE:/**")};
  UpdateResult r = apply_update(&p, u);
  EXPECT_TRUE(r.changed);
  const Endpoint& e = p.network[0].endpoints.at(1);
  EXPECT_EQ(e.protocol, "rest");
  EXPECT_THAT(e.rules, IsEmpty()) << "no allow rules: every other request passes";
  EXPECT_THAT(e.deny_rules, ElementsAre(HttpRule{"DELETE", "/**", {}}));
  EXPECT_FALSE(apply_update(&p, u).changed);
  EXPECT_EQ(parse(to_toml(p), "again.toml"), p);

  // An endpoint added in the same update takes the deny rule.
  Policy fresh = layer4();
  Update both;
  both.add = {{"new.example.com", 443}};
  both.add_deny = {parse_rule_ref("--add-deny", "new.example.com:443:POST:/**")};
  EXPECT_TRUE(apply_update(&fresh, both).changed);
  EXPECT_EQ(fresh.network[0].name, "cli");
  EXPECT_THAT(fresh.network[0].endpoints.at(0).deny_rules,
              ElementsAre(HttpRule{"POST", "/**", {}}));
}

TEST(PolicyUpdateRules, TlsSkipEndpointsTakeNoRules) {
  Policy p = parse(R"(version = 1
[network_policies.raw]
endpoints = [ { host = "db.example.com", port = 5432, tls = "skip" } ]
)",
                   "p.toml");
  Policy before = p;
  Update u;
  u.add_allow = {parse_rule_ref("--add-allow", "db.example.com:5432:GET:/")};
  EXPECT_EQ(update_error(&p, u),
            "--add-allow db.example.com:5432:GET /: db.example.com:5432 in rule raw has tls = "
            "\"skip\": its bytes are relayed unread, so no HTTP rule can apply (drop tls with "
            "policy set)");
  EXPECT_EQ(p, before);
}

TEST(PolicyUpdateRules, RemoveRuleTakesAllowAndDenyRulesOfThatMethodAndPath) {
  Policy p = parse(R"(version = 1
[network_policies.github]
endpoints = [ { host = "api.github.com", port = 443, protocol = "rest", rules = [ { allow = { method = "GET", path = "/repos/**", query = { per_page = "1*" } } }, { allow = { method = "GET", path = "/user" } } ], deny_rules = [ { deny = { method = "GET", path = "/repos/**" } } ] } ]
)",
                   "p.toml");
  Update u;
  u.remove_rules = {parse_rule_ref("--remove-rule", "api.github.com:443:get:/repos/**")};
  UpdateResult r = apply_update(&p, u);
  EXPECT_TRUE(r.changed);
  EXPECT_THAT(r.notes, ElementsAre("removed GET /repos/** from api.github.com:443 in rule github"));
  const Endpoint& e = p.network[0].endpoints[0];
  EXPECT_THAT(e.rules, ElementsAre(HttpRule{"GET", "/user", {}}));
  EXPECT_THAT(e.deny_rules, IsEmpty());

  Policy before = p;
  EXPECT_EQ(update_error(&p, u),
            "--remove-rule api.github.com:443:GET /repos/**: no endpoint api.github.com:443 has "
            "the rule GET /repos/**");
  EXPECT_EQ(p, before);

  Update last;
  last.remove_rules = {parse_rule_ref("--remove-rule", "api.github.com:443:GET:/user")};
  r = apply_update(&p, last);
  EXPECT_THAT(r.notes, ElementsAre("removed GET /user from api.github.com:443 in rule github",
                                   "api.github.com:443 in rule github has no allow rules left: "
                                   "every request no deny rule matches passes"));
  EXPECT_EQ(p.network[0].endpoints[0].protocol, "rest") << "still inspected";
}

TEST(PolicyStatic, DifferencesNameTheStaticParts) {
  Policy a = default_policy();
  Policy b = a;
  EXPECT_THAT(static_differences(a, b), IsEmpty());
  b.network.push_back({"x", {{"example.com", {443}, {}, "", ""}}, {}});
  EXPECT_THAT(static_differences(a, b), IsEmpty());
  b.filesystem.read_write.push_back("/data");
  b.landlock = LandlockCompatibility::kHardRequirement;
  b.process.run_as_user = "1001";
  EXPECT_THAT(static_differences(a, b), ElementsAre("filesystem_policy", "landlock", "process"));
}

TEST(PolicyStatic, ALeftOutFilesystemPartIsTheDefaultOnce) {
  // A network-only policy over the default: as a sandbox runs them, the
  // same filesystem part.
  SandboxSpec none;
  SandboxSpec net;
  net.policy =
      "version = 1\n[network_policies.x]\nendpoints = [ { host = \"a.example.com\", "
      "port = 443 } ]\n";
  EXPECT_THAT(static_differences(spec::effective_policy(none, spec::Placement{}),
                                 spec::effective_policy(net, spec::Placement{})),
              IsEmpty());
}

TEST(PolicyYaml, Recognised) {
  EXPECT_TRUE(looks_like_yaml("version: 1\n"));
  EXPECT_TRUE(looks_like_yaml("# OpenShell\n\nnetwork_policies:\n  x:\n"));
  EXPECT_TRUE(looks_like_yaml("---\nversion: 1\n"));
  EXPECT_FALSE(looks_like_yaml("version = 1\n"));
  EXPECT_FALSE(looks_like_yaml("[network_policies.x]\n"));
  EXPECT_FALSE(looks_like_yaml("version = \"a:b\"\n"));
}

TEST(PolicyYaml, OpenShellsYamlReadsAsTheSameTomlDoes) {
  Policy yaml = parse(R"(version: 1
filesystem_policy:
  include_workdir: true
  read_only: [/usr, /lib, /etc, /proc]
  read_write: [/sandbox, /tmp, /dev/null]
landlock:
  compatibility: best_effort
process:
  run_as_user: sandbox
  run_as_group: sandbox
network_policies:
  github:
    endpoints:
      - { host: api.github.com, port: 443 }
      - host: "*.githubusercontent.com"
        ports: [443]
    binaries:
      - { path: /usr/bin/git }
      - path: /usr/bin/curl
)",
                      "agent.yaml");
  Policy toml = parse(R"(version = 1
[filesystem_policy]
include_workdir = true
read_only = ["/usr", "/lib", "/etc", "/proc"]
read_write = ["/sandbox", "/tmp", "/dev/null"]
[landlock]
compatibility = "best_effort"
[process]
run_as_user = "sandbox"
run_as_group = "sandbox"
[network_policies.github]
endpoints = [ { host = "api.github.com", port = 443 }, { host = "*.githubusercontent.com", ports = [443] } ]
binaries = [ { path = "/usr/bin/git" }, { path = "/usr/bin/curl" } ]
)",
                      "agent.toml");
  EXPECT_EQ(yaml, toml);
}

std::string yaml_error(const std::string& text) {
  try {
    parse(text, "agent.yaml");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parsed:\n" << text;
  return "";
}

TEST(PolicyYaml, ErrorsNameTheLineAndField) {
  EXPECT_EQ(yaml_error("version: 1\nnetwork_policies:\n  x:\n    endpoints:\n"
                       "      - { host: a.example.com, port: 443, rule: [] }\n"),
            "agent.yaml:5: network_policies.x.endpoints[0].rule: unknown field (expected one "
            "of: host, port, ports, allowed_ips, protocol, tls, enforcement, access, rules, "
            "deny_rules, allow_encoded_slash, ca_file, credentials_in)");
  EXPECT_EQ(
      yaml_error("version: 1\nprocess:\n  run_as_user: root\n"),
      "agent.yaml:3: process.run_as_user: must not be root (unless process.allow_root = true)");
  EXPECT_EQ(yaml_error("version: 1\nnetwork_policies:\n  x: [\n"),
            "agent.yaml:4: did not find expected node content");
  EXPECT_EQ(yaml_error("version: 1\nlandlock:\n"), "agent.yaml:2: a value is missing (null)");
  // A quoted number is a string, as in YAML: not a port.
  EXPECT_EQ(yaml_error("version: 1\nnetwork_policies:\n  x:\n    endpoints:\n"
                       "      - { host: a.example.com, port: \"443\" }\n"),
            "agent.yaml:5: network_policies.x.endpoints[0].port: must be a port number");
  EXPECT_EQ(yaml_error("version: 1\n---\nversion: 1\n"),
            "agent.yaml: more than one YAML document (one policy a file)");
}

TEST(PolicyYaml, AliasesCannotBlowUp) {
  std::string bomb = "a: &a [1,1,1,1,1,1,1,1,1,1]\n";
  for (char c = 'b'; c <= 'h'; ++c) {
    std::string prev(1, static_cast<char>(c - 1));
    bomb += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) bomb += (i ? ",*" : "*") + prev;
    bomb += "]\n";
  }
  EXPECT_EQ(yaml_error(bomb), "agent.yaml:1: the YAML document is too large");
}

}  // namespace
}  // namespace openshell::policy

namespace openshell::supervisor {
namespace {

using ::testing::IsEmpty;
using ::testing::SizeIs;

policy::Policy net(const std::string& body) {
  return policy::parse("version = 1\n" + body, "p.toml");
}

TEST(SsrfWarnings, LoopbackAndPrivateLiteralsWithoutAllowedIps) {
  auto refused = ssrf_refused_endpoints(
      net("[network_policies.local]\nendpoints = [ { host = \"localhost\", port = 9000 },\n"
          "  { host = \"10.1.2.3\", port = 80 }, { host = \"::1\", port = 81 },\n"
          "  { host = \"169.254.169.254\", port = 80 }, { host = \"example.com\", port = 443 },\n"
          "  { host = \"93.184.215.14\", port = 443 } ]\n"));
  ASSERT_THAT(refused, SizeIs(4));
  EXPECT_EQ(refused[0].rule, "local");
  EXPECT_EQ(refused[0].field, "network_policies.local.endpoints[0]");
  EXPECT_EQ(refused[0].address, "127.0.0.1");
  EXPECT_EQ(refused[0].cidr, "127.0.0.1/32");
  EXPECT_EQ(describe(refused[0]),
            "localhost:9000 can never connect: the SSRF guard refuses 127.0.0.1 (loopback)");
  EXPECT_EQ(describe(refused[1]),
            "10.1.2.3:80 can never connect: the SSRF guard refuses 10.1.2.3 (private)");
  EXPECT_EQ(refused[2].cidr, "::1/128");
  EXPECT_EQ(describe(refused[2]),
            "[::1]:81 can never connect: the SSRF guard refuses ::1 (loopback)");
  EXPECT_EQ(refused[3].field, "network_policies.local.endpoints[3]");
}

TEST(SsrfWarnings, AllowedIpsThatCoverTheAddressSilenceIt) {
  EXPECT_THAT(ssrf_refused_endpoints(
                  net("[network_policies.local]\nendpoints = [ { host = \"localhost\", port = "
                      "9000, allowed_ips = [\"127.0.0.1/32\"] } ]\n")),
              IsEmpty());
  // Another endpoint for the same host and port admits it: no warning.
  EXPECT_THAT(ssrf_refused_endpoints(
                  net("[network_policies.a]\nendpoints = [ { host = \"localhost\", port = 9000 } "
                      "]\n[network_policies.b]\nendpoints = [ { host = \"localhost\", port = "
                      "9000, allowed_ips = [\"::1\"] } ]\n")),
              IsEmpty());
  // allowed_ips that miss the address: never connects either.
  auto missed = ssrf_refused_endpoints(
      net("[network_policies.local]\nendpoints = [ { host = \"10.0.0.5\", port = 80, "
          "allowed_ips = [\"192.168.0.0/16\"] } ]\n"));
  ASSERT_THAT(missed, SizeIs(1));
  EXPECT_EQ(describe(missed[0]),
            "10.0.0.5:80 can never connect: 10.0.0.5 is not in its allowed_ips");
}

}  // namespace
}  // namespace openshell::supervisor
