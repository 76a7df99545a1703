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
                       "      - { host: a.example.com, port: 443, rules: [] }\n"),
            "agent.yaml:5: network_policies.x.endpoints[0].rules: unknown field (expected one "
            "of: host, port, ports, allowed_ips, protocol, access)");
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
