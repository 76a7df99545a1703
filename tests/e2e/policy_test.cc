// The policy commands as a user meets them: `policy update` that keeps rules
// in one order, sets allowed_ips and never adds an endpoint twice; the SSRF
// guard's warnings; `policy get --full`; a static change refused on a
// running sandbox unless it is for the next start; OpenShell's YAML read;
// HTTP rules added and removed by `policy update`.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness.h"

namespace e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

size_t count_of(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

class PolicyCli : public GatewayTest {
 protected:
  PolicyCli() : GatewayTest("polhome", false) {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    static int counter = 0;
    dir_ =
        make_dir(mode(), "polfiles-" + mode_name(mode()) + "-" + std::to_string(++counter), 0755);
    hosts_ = write_file(dir_ + "/hosts", "127.0.0.1 localhost\n");
  }
  Result os(const std::vector<std::string>& args, Options o = {}) override {
    o.env.push_back("OPENSHELL_HOSTS_FILE=" + hosts_);
    return GatewayTest::os(args, std::move(o));
  }
  std::string file(const std::string& name, const std::string& body) {
    return write_file(dir_ + "/" + name, body);
  }
  std::string port() const { return std::to_string(server_.port()); }

  std::string dir_, hosts_;
  TestServer server_;
};
E2E_ALL_MODES(PolicyCli);

TEST_P(PolicyCli, UpdateKeepsRulesSortedSetsAllowedIpsAndNeverAddsTwice) {
  GatewayGuard gateway(mode(), home_);
  std::string two = file("two.toml",
                         "version = 1\n"
                         "[network_policies.zeta]\n"
                         "endpoints = [ { host = \"z.example.com\", port = 443 } ]\n"
                         "[network_policies.alpha]\n"
                         "endpoints = [ { host = \"a.example.com\", port = 443 } ]\n");
  ASSERT_EQ(os({"sandbox", "create", "--name", "upd", "--from", rootfs(), "--policy", two}).status,
            0);
  const std::string endpoint = "localhost:" + port();
  const std::vector<std::string> fetch = {"sandbox", "exec", "upd", "--",
                                          "wget",    "-q",   "-O-", "http://" + endpoint + "/"};

  // Added without allowed_ips: stored, with a warning that says the fix.
  Result added = os({"policy", "update", "upd", "--add-endpoint", endpoint});
  EXPECT_EQ(added.status, 0) << added.err;
  EXPECT_THAT(added.out, HasSubstr("upd: added " + endpoint + " to rule cli\n"));
  EXPECT_THAT(added.err, HasSubstr("openshell: warning: " + endpoint +
                                   " can never connect: the SSRF guard refuses 127.0.0.1 "
                                   "(loopback); to allow it: openshell policy update upd "
                                   "--add-endpoint " +
                                   endpoint + " --allowed-ip 127.0.0.1/32\n"));
  Result refused = os(fetch);
  EXPECT_NE(refused.status, 0);
  EXPECT_NE(refused.status, 125);

  // The rules in one order, by name, in the text and as documented.
  Result get = os({"policy", "get", "upd"});
  size_t alpha = get.out.find("[network_policies.alpha]");
  size_t cli = get.out.find("[network_policies.cli]");
  size_t zeta = get.out.find("[network_policies.zeta]");
  ASSERT_NE(alpha, std::string::npos) << get.out;
  ASSERT_NE(cli, std::string::npos) << get.out;
  ASSERT_NE(zeta, std::string::npos) << get.out;
  EXPECT_LT(alpha, cli);
  EXPECT_LT(cli, zeta);

  // The same again: nothing new, no new revision.
  Result again = os({"policy", "update", "upd", "--add-endpoint", endpoint});
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.out,
            "upd: " + endpoint + " is already in rule cli, unchanged; policy revision 2 stays\n");
  Result list = os({"policy", "list", "upd", "-o", "json"});
  EXPECT_EQ(count_of(list.out, "\"revision\""), 2u) << list.out;

  // --allowed-ip sets allowed_ips on that endpoint, which then connects.
  Result opened =
      os({"policy", "update", "upd", "--add-endpoint", endpoint, "--allowed-ip", "127.0.0.1/32"});
  EXPECT_EQ(opened.status, 0) << opened.err;
  EXPECT_THAT(opened.out, HasSubstr("upd: set the allowed_ips of " + endpoint + " in rule cli\n"));
  EXPECT_THAT(opened.err, Not(HasSubstr("warning")));
  Result now = os({"policy", "get", "upd"});
  EXPECT_EQ(count_of(now.out, "host = \"localhost\""), 1u) << now.out;
  EXPECT_THAT(now.out, HasSubstr("{ host = \"localhost\", port = " + port() +
                                 ", allowed_ips = [\"127.0.0.1/32\"] }"));
  Result fetched = os(fetch);
  EXPECT_EQ(fetched.status, 0) << fetched.err;
  EXPECT_EQ(fetched.out, "hello from the test server\n");

  // A bad CIDR: one line, nothing stored.
  Result bad =
      os({"policy", "update", "upd", "--add-endpoint", endpoint, "--allowed-ip", "10.0.0.0/33"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_EQ(bad.err,
            "openshell: --allowed-ip 10.0.0.0/33: \"10.0.0.0/33\" is not an IP address or CIDR: "
            "the prefix length must be a number from 0 to 32\n");
  Result without = os({"policy", "update", "upd", "--allowed-ip", "127.0.0.1"});
  EXPECT_EQ(without.status, 125);
  EXPECT_EQ(without.err,
            "openshell: policy update: --allowed-ip goes with --add-endpoint or --add-allow\n");

  // `set` warns too, and its fix names the rule; following it works.
  std::string local = file("local.toml",
                           "version = 1\n[network_policies.local]\n"
                           "endpoints = [ { host = \"localhost\", port = " +
                               port() + " } ]\n");
  Result set = os({"policy", "set", "upd", "--policy", local});
  EXPECT_EQ(set.status, 0) << set.err;
  const std::string fix = "openshell policy update upd --rule local --add-endpoint " + endpoint +
                          " --allowed-ip 127.0.0.1/32";
  EXPECT_THAT(set.err, HasSubstr("; to allow it: " + fix + "\n"));
  EXPECT_NE(os(fetch).status, 0);
  Result fixed = os({"policy", "update", "upd", "--rule", "local", "--add-endpoint", endpoint,
                     "--allowed-ip", "127.0.0.1/32"});
  EXPECT_EQ(fixed.status, 0) << fixed.err;
  EXPECT_EQ(fixed.err, "");
  Result works = os(fetch);
  EXPECT_EQ(works.status, 0) << works.err;
  EXPECT_EQ(works.out, "hello from the test server\n");
}

TEST_P(PolicyCli, ValidateWarnsOfEndpointsTheSsrfGuardRefuses) {
  std::string guarded =
      file("guarded.toml",
           "version = 1\n[network_policies.local]\n"
           "endpoints = [ { host = \"localhost\", port = 9000 },\n"
           "  { host = \"169.254.169.254\", port = 80 },\n"
           "  { host = \"10.0.0.7\", port = 80, allowed_ips = [\"10.0.0.7\"] } ]\n");
  Result v = os({"policy", "validate", guarded});
  EXPECT_EQ(v.status, 0) << v.err;
  EXPECT_EQ(v.out, guarded + ": valid (1 network policies, 3 endpoints)\n");
  EXPECT_EQ(v.err,
            "openshell: warning: localhost:9000 can never connect: the SSRF guard refuses "
            "127.0.0.1 (loopback); to allow it: add allowed_ips = [\"127.0.0.1/32\"] to "
            "network_policies.local.endpoints[0]\n"
            "openshell: warning: 169.254.169.254:80 can never connect: the SSRF guard refuses "
            "169.254.169.254 (link-local (cloud metadata)); to allow it: add allowed_ips = "
            "[\"169.254.169.254/32\"] to network_policies.local.endpoints[1]\n");
  std::string open = file("open.toml",
                          "version = 1\n[network_policies.local]\nendpoints = [ { host = "
                          "\"localhost\", port = 9000, allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  Result quiet = os({"policy", "validate", open});
  EXPECT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_EQ(quiet.err, "");
}

TEST_P(PolicyCli, OpenShellsYamlPoliciesAreRead) {
  GatewayGuard gateway(mode(), home_);
  std::string yaml = file("agent.yaml",
                          "# as OpenShell writes it\nversion: 1\n"
                          "network_policies:\n  local:\n    endpoints:\n"
                          "      - host: localhost\n        port: " +
                              port() + "\n        allowed_ips: [127.0.0.1/32]\n");
  Result v = os({"policy", "validate", yaml});
  EXPECT_EQ(v.status, 0) << v.err;
  EXPECT_EQ(v.out, yaml + ": valid (1 network policies, 1 endpoints)\n");
  Result created = os({"sandbox", "create", "--name", "yml", "--from", rootfs(), "--policy", yaml});
  ASSERT_EQ(created.status, 0) << created.err;
  Result fetched =
      os({"sandbox", "exec", "yml", "--", "wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(fetched.status, 0) << fetched.err;
  EXPECT_EQ(fetched.out, "hello from the test server\n");
  // Kept as given; an update writes the next revision as TOML.
  EXPECT_THAT(os({"policy", "get", "yml"}).out, HasSubstr("# as OpenShell writes it\n"));
  ASSERT_EQ(os({"policy", "update", "yml", "--add-endpoint", "pypi.example:443"}).status, 0);
  Result updated = os({"policy", "get", "yml"});
  EXPECT_THAT(updated.out, HasSubstr("[network_policies.local]\nendpoints = [\n  { host = "
                                     "\"localhost\", port = " +
                                     port() + ", allowed_ips = [\"127.0.0.1/32\"] },\n]\n"));
  // OpenShell's HTTP rules need a protocol: refused with its line.
  std::string rules = file("rules.yaml",
                           "version: 1\nnetwork_policies:\n  x:\n    endpoints:\n"
                           "      - { host: a.example.com, port: 443, rules: [] }\n");
  Result refused = os({"policy", "validate", rules});
  EXPECT_EQ(refused.status, 125);
  EXPECT_EQ(refused.err, "openshell: " + rules +
                             ":5: network_policies.x.endpoints[0].rules: needs protocol = "
                             "\"rest\" or \"websocket\" on this endpoint (without it the "
                             "endpoint is layer 4: its requests are not read)\n");
}

TEST_P(PolicyCli, UpdateAddsAndRemovesHttpRules) {
  GatewayGuard gateway(mode(), home_);
  std::string l4 = file("l4.toml",
                        "version = 1\n[network_policies.github]\n"
                        "endpoints = [ { host = \"api.github.com\", port = 443 } ]\n");
  ASSERT_EQ(os({"sandbox", "create", "--name", "l7", "--from", rootfs(), "--policy", l4}).status,
            0);
  Result allowed = os({"policy", "update", "l7", "--add-allow", "api.github.com:443:GET:/repos/**",
                       "--add-deny", "api.github.com:443:delete:/**"});
  EXPECT_EQ(allowed.status, 0) << allowed.err;
  EXPECT_THAT(allowed.out, HasSubstr("l7: api.github.com:443 in rule github is now inspected "
                                     "(protocol = \"rest\");"));
  EXPECT_THAT(allowed.out, HasSubstr("allowed GET /repos/** on api.github.com:443 in rule github; "
                                     "denied DELETE /** on api.github.com:443 in rule github\n"));
  Result get = os({"policy", "get", "l7"});
  // Too long for one line: a rule a line.
  EXPECT_THAT(get.out, HasSubstr("  { host = \"api.github.com\", port = 443, protocol = \"rest\", "
                                 "rules = [\n"
                                 "      { allow = { method = \"GET\", path = \"/repos/**\" } },\n"
                                 "    ], deny_rules = [\n"
                                 "      { deny = { method = \"DELETE\", path = \"/**\" } },\n"
                                 "    ] },\n"))
      << get.out;

  Result removed = os({"policy", "update", "l7", "--remove-rule", "api.github.com:443:DELETE:/**"});
  EXPECT_EQ(removed.status, 0) << removed.err;
  EXPECT_THAT(os({"policy", "get", "l7"}).out, Not(HasSubstr("deny_rules")));

  // A bad spec: one line, status 125, no new revision.
  Result bad = os({"policy", "update", "l7", "--add-allow", "api.github.com:443:GET"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_EQ(bad.err,
            "openshell: --add-allow api.github.com:443:GET: expected HOST:PORT:METHOD:PATH_GLOB "
            "(like api.github.com:443:GET:/repos/**)\n");
  Result list = os({"policy", "list", "l7", "-o", "json"});
  EXPECT_EQ(count_of(list.out, "\"revision\""), 3u) << list.out;
}

TEST_P(PolicyCli, StaticChangesOfARunningSandboxWaitForTheNextStart) {
  GatewayGuard gateway(mode(), home_);
  // Network only: the default filesystem part holds.
  std::string net = file("net.toml",
                         "version = 1\n[network_policies.gh]\n"
                         "endpoints = [ { host = \"api.github.com\", port = 443 } ]\n");
  ASSERT_EQ(os({"sandbox", "create", "--name", "st", "--from", rootfs(), "--policy", net}).status,
            0);
  Result plain = os({"policy", "get", "st"});
  EXPECT_THAT(plain.out, Not(HasSubstr("[filesystem_policy]")));
  Result full = os({"policy", "get", "st", "--full"});
  EXPECT_EQ(full.status, 0) << full.err;
  EXPECT_THAT(full.out,
              HasSubstr("# st, policy revision 1, in full as the sandbox runs with it\n"));
  EXPECT_THAT(full.out, HasSubstr("[filesystem_policy]\ninclude_workdir = true\n"));
  EXPECT_THAT(full.out, HasSubstr("\"/tmp\""));
  EXPECT_THAT(full.out, HasSubstr("[network_policies.gh]"));
  Result full_json = os({"policy", "get", "st", "--full", "-o", "json"});
  EXPECT_THAT(full_json.out, HasSubstr("\"full\": true"));

  // The default filesystem part without /tmp.
  std::string no_tmp =
      file("no-tmp.toml",
           "version = 1\n[filesystem_policy]\n"
           "read_only = [\"/usr\", \"/lib\", \"/lib64\", \"/bin\", \"/sbin\", \"/etc\", \"/opt\", "
           "\"/proc\", \"/dev\", \"/sys\", \"/tmp\"]\n"
           "read_write = [\"/sandbox\", \"/dev/null\", \"/dev/shm\", \"/dev/pts\"]\n"
           "[network_policies.gh]\nendpoints = [ { host = \"api.github.com\", port = 443 } ]\n");
  const std::vector<std::string> touch = {"sandbox", "exec", "st", "--", "touch", "/tmp/x"};
  ASSERT_EQ(os(touch).status, 0);
  Result refused = os({"policy", "set", "st", "--policy", no_tmp});
  EXPECT_EQ(refused.status, 125);
  EXPECT_EQ(refused.err,
            "openshell: sandbox 'st' is running, and its filesystem_policy would change, which "
            "applies only at its next start: give --at-next-start (at_next_start in the API) to "
            "store the revision for then; its network part applies at once\n");
  Result list = os({"policy", "list", "st", "-o", "json"});
  EXPECT_EQ(count_of(list.out, "\"revision\""), 1u) << list.out;

  Result later = os({"policy", "set", "st", "--policy", no_tmp, "--at-next-start"});
  EXPECT_EQ(later.status, 0) << later.err;
  EXPECT_EQ(later.out,
            "st: policy revision 2: its network part applied to new connections; its "
            "filesystem_policy applies when the sandbox next starts\n");
  // Still the running sandbox's old confinement...
  EXPECT_EQ(os(touch).status, 0);
  // ...and a network change on top of the new revision applies at once.
  Result update = os({"policy", "update", "st", "--add-endpoint", "pypi.example:443"});
  EXPECT_EQ(update.status, 0) << update.err;
  EXPECT_THAT(update.out, HasSubstr("st: policy revision 3 applied to new connections"));

  // The next start runs with it.
  ASSERT_EQ(os({"sandbox", "stop", "st"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "st"}).status, 0);
  Result denied = os(touch);
  EXPECT_EQ(denied.status, 1) << denied.out << denied.err;
  EXPECT_THAT(denied.err, HasSubstr("Permission denied"));
  // A stopped sandbox takes a static change without the flag.
  ASSERT_EQ(os({"sandbox", "stop", "st"}).status, 0);
  Result stopped = os({"policy", "set", "st", "--policy", net});
  EXPECT_EQ(stopped.status, 0) << stopped.err;
  EXPECT_EQ(stopped.out, "st: policy revision 4 saved; it applies when the sandbox next starts\n");
}

}  // namespace
}  // namespace e2e
