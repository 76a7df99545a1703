// Egress: a sandbox reaches only what its policy allows, through its proxy,
// as root and rootless. Every server here is on 127.0.0.1, and the resolver
// is pointed at a test DNS server on 127.0.0.1: no traffic leaves the host.
#include <unistd.h>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

class Network : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    hosts_ = write_file(scratch() + "/hosts-" + mode_name(mode()),
                        "127.0.0.1 localhost api.test.openshell other.test.openshell "
                        "a.b.test.openshell test.openshell metadata.test.openshell\n");
  }
  Options env() {
    Options o;
    o.env = {"OPENSHELL_HOSTS_FILE=" + hosts_,
             "OPENSHELL_DNS_SERVERS=127.0.0.1:" + std::to_string(dns_.port())};
    return o;
  }
  std::string policy(const std::string& body) {
    static int counter = 0;
    return write_file(scratch() + "/net-" + mode_name(mode()) + "-" + std::to_string(++counter) + ".toml",
                      "version = 1\n" + body);
  }
  std::string port() const { return std::to_string(server_.port()); }
  std::string local_rule(const std::string& host = "localhost", const std::string& extra = "") {
    return "[network_policies.local]\nendpoints = [ { host = \"" + host + "\", port = " + port() +
           ", allowed_ips = [\"127.0.0.1/32\"] } ]\n" + extra;
  }
  Result run(const std::string& policy_file, const std::vector<std::string>& command,
             const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"--policy", policy_file};
    args.insert(args.end(), more.begin(), more.end());
    return sandbox(mode(), args, command, env());
  }

  TestServer server_;
  TestDnsServer dns_;
  std::string hosts_;
};
E2E_ALL_MODES(Network);

TEST_P(Network, AllowedHostWorksThroughTheProxy) {
  Result r = run(policy(local_rule()), {"wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "hello from the test server\n");
  Result c = run(policy(local_rule()), {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(c.status, 0) << c.out << c.err;
  EXPECT_THAT(c.out, HasSubstr("proxy: HTTP/1.1 200 Connection established"));
  EXPECT_THAT(c.out, HasSubstr("echo: ping through the proxy"));
}

TEST_P(Network, DeniedHostGets403) {
  std::string p = policy(local_rule());
  Result r = run(p, {"wget", "-q", "-O-", "http://other.test.openshell:" + port() + "/"});
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("403"));
  Result c = run(p, {"osh-probe", "proxy-connect", "localhost", "1", "status"});
  EXPECT_THAT(c.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden"));
  EXPECT_THAT(c.out, HasSubstr("no rule allows localhost:1"));
  EXPECT_EQ(server_.connections(), 0) << "a refused connection reached the server";
}

TEST_P(Network, DefaultIsDeny) {
  // A policy with a network part that allows nothing here.
  Result r = run(policy("[network_policies.elsewhere]\nendpoints = [ { host = \"example.com\", port = 443 } ]\n"),
                 {"osh-probe", "proxy-connect", "localhost", port(), "status"});
  EXPECT_THAT(r.out, HasSubstr("403 Forbidden"));
  EXPECT_EQ(server_.connections(), 0);
}

TEST_P(Network, DirectAndIpLiteralBypassFailsAtOnce) {
  std::string p = policy(local_rule());
  // Straight to the server: the sandbox's loopback is not the host's.
  Result direct = run(p, {"osh-probe", "connect", "127.0.0.1", port()});
  EXPECT_THAT(direct.out, HasSubstr("denied: ECONNREFUSED"));
  EXPECT_THAT(direct.err, testing::MatchesRegex("connect took [0-9] ms\n"));
  // Any other address: no route at all, refused at once.
  Result outside = run(p, {"osh-probe", "connect", "93.184.216.34", "80"});
  EXPECT_THAT(outside.out, HasSubstr("denied: ENETUNREACH"));
  // Through the proxy by IP literal: not what the policy names.
  Result literal = run(p, {"osh-probe", "proxy-connect", "127.0.0.1", port(), "status"});
  EXPECT_THAT(literal.out, HasSubstr("403 Forbidden"));
  EXPECT_EQ(server_.connections(), 0);
}

TEST_P(Network, SsrfTargetsAreDenied) {
  // The rule names the host but gives no allowed_ips: loopback, private,
  // link-local (cloud metadata) and 0.0.0.0 addresses are refused.
  std::string p = policy("[network_policies.open]\nendpoints = [ { host = \"localhost\", port = " + port() +
                         " }, { host = \"169.254.169.254\", port = 80 }, { host = \"0.0.0.0\", port = " + port() +
                         " }, { host = \"10.1.2.3\", port = 80 } ]\n");
  for (const auto& [host, p2, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"localhost", port(), "loopback"},
           {"169.254.169.254", "80", "link-local"},
           {"0.0.0.0", port(), "unspecified"},
           {"10.1.2.3", "80", "private"}}) {
    Result r = run(p, {"osh-probe", "proxy-connect", host, p2, "status"});
    EXPECT_THAT(r.out, HasSubstr("403 Forbidden")) << host;
    EXPECT_THAT(r.out, HasSubstr(why)) << host;
  }
  EXPECT_EQ(server_.connections(), 0);
}

TEST_P(Network, BinaryIdentityAllowsAndDenies) {
  // Only the probe may connect; busybox's wget may not. /usr/bin/wget is a
  // symlink to busybox: naming it allows busybox, the file it leads to.
  std::string probe_only = policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/osh-probe\" } ]\n"));
  Result ok = run(probe_only, {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(ok.status, 0) << ok.out;
  Result no = run(probe_only, {"wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_NE(no.status, 0);
  EXPECT_THAT(no.err, HasSubstr("403"));
  std::string wget_only = policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/wget\" } ]\n"));
  Result symlinked = run(wget_only, {"wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(symlinked.status, 0) << symlinked.err;
  EXPECT_EQ(symlinked.out, "hello from the test server\n");
  Result glob = run(policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/osh-*\" } ]\n")),
                    {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(glob.status, 0) << glob.out;
}

TEST_P(Network, WildcardHosts) {
  std::string p = policy(local_rule("*.test.openshell"));
  EXPECT_EQ(run(p, {"wget", "-q", "-O-", "http://api.test.openshell:" + port() + "/"}).status, 0);
  EXPECT_EQ(run(p, {"wget", "-q", "-O-", "http://other.test.openshell:" + port() + "/"}).status, 0);
  // Neither the bare domain nor a deeper name.
  EXPECT_NE(run(p, {"wget", "-q", "-O-", "http://test.openshell:" + port() + "/"}).status, 0);
  EXPECT_NE(run(p, {"wget", "-q", "-O-", "http://a.b.test.openshell:" + port() + "/"}).status, 0);
}

TEST_P(Network, WebSocketUpgradeAndLongConnections) {
  std::string p = policy(local_rule());
  Result up = run(p, {"osh-probe", "proxy-connect", "localhost", port(), "upgrade"});
  EXPECT_EQ(up.status, 0) << up.out;
  EXPECT_THAT(up.out, HasSubstr("upgrade: HTTP/1.1 101 Switching Protocols"));
  EXPECT_THAT(up.out, HasSubstr("echo: ping through the proxy"));
  Result idle = run(p, {"osh-probe", "proxy-connect", "localhost", port(), "idle"});
  EXPECT_EQ(idle.status, 0) << idle.out;
}

TEST_P(Network, DnsResolvesOnlyAllowedNames) {
  std::string p = policy(local_rule("*.test.openshell"));
  Result allowed = run(p, {"nslookup", "api.test.openshell"});
  EXPECT_EQ(allowed.status, 0) << allowed.out << allowed.err;
  EXPECT_THAT(allowed.out, HasSubstr("127.0.0.1"));
  int before = dns_.queries();
  Result other = run(p, {"nslookup", "example.com"});
  EXPECT_NE(other.status, 0);
  EXPECT_THAT(other.out + other.err, HasSubstr("NXDOMAIN"));
  EXPECT_EQ(dns_.queries(), before) << "a name no rule allows was asked upstream";
  // An allowed name that the hosts file does not have goes upstream.
  Result upstream = run(policy(local_rule("*.example.org")), {"nslookup", "www.example.org"});
  EXPECT_GT(dns_.queries(), before) << upstream.out << upstream.err;
}

TEST_P(Network, EveryDecisionIsAudited) {
  std::string log = scratch() + "/network-" + mode_name(mode()) + ".log";
  ::unlink(log.c_str());
  make_dir(mode(), "audit-" + mode_name(mode()), 0777);
  std::string log_path = scratch() + "/audit-" + mode_name(mode()) + "/network.log";
  run(policy(local_rule()),
      {"sh", "-c", "wget -q -O- http://localhost:" + port() + "/ >/dev/null; osh-probe proxy-connect localhost 1 status"},
      {"--network-log", log_path});
  std::string lines = file_contents(log_path);
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"allow\""));
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"deny\""));
  for (const char* field : {"\"time\":", "\"sandbox\":", "\"binary\":\"/bin/busybox\"", "\"pid\":",
                            "\"host\":\"localhost\"", "\"port\":", "\"rule\":\"local\""})
    EXPECT_THAT(lines, HasSubstr(field)) << lines;
}

TEST_P(Network, MalformedPoliciesAreRejectedWithLineAndField) {
  std::string bad = policy("[network_policies.x]\nendpoints = [ { host = \"*.com\", port = 443 } ]\n");
  Result v = openshell(mode(), {"policy", "validate", bad});
  EXPECT_EQ(v.status, 125);
  EXPECT_THAT(v.err, HasSubstr(bad + ":3: network_policies.x.endpoints[0].host"));
  std::string noport = policy("[network_policies.x]\nendpoints = [ { host = \"a.example.com\" } ]\n");
  Result r = run(noport, {"true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("needs a port"));
  Result ok = openshell(mode(), {"policy", "validate", policy(local_rule())});
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("valid (1 network policies, 1 endpoints)"));
}

// Policies of long-lived sandboxes change live: the network part applies to
// new connections at once, revisions are kept, a bad one changes nothing.
TEST_P(Network, LivePolicyUpdatesFlipAllowAndDeny) {
  std::string home = make_dir(mode(), "nethome-" + mode_name(mode()), 0700);
  Options o = env();
  o.env.push_back("OPENSHELL_HOME=" + home);
  auto os = [&](const std::vector<std::string>& args) { return openshell(mode(), args, o); };
  std::string allow = policy(local_rule());
  std::string deny = policy("[network_policies.local]\nendpoints = [ { host = \"localhost\", port = 1 } ]\n");
  ASSERT_EQ(os({"sandbox", "create", "--name", "live", "--from", rootfs(), "--policy", allow}).status, 0);
  const std::vector<std::string> fetch = {"sandbox", "exec", "live", "--", "wget", "-q", "-O-",
                                          "http://localhost:" + port() + "/"};
  Result first = os(fetch);
  EXPECT_EQ(first.status, 0) << first.err;
  EXPECT_EQ(first.out, "hello from the test server\n");
  for (int round = 0; round < 2; ++round) {
    Result set = os({"policy", "set", "live", "--policy", deny});
    EXPECT_EQ(set.status, 0) << set.err;
    EXPECT_THAT(set.out, HasSubstr("applied to new connections"));
    Result denied = os(fetch);
    EXPECT_NE(denied.status, 0);
    EXPECT_THAT(denied.err, HasSubstr("403"));
    ASSERT_EQ(os({"policy", "set", "live", "--policy", allow}).status, 0);
    EXPECT_EQ(os(fetch).status, 0);
  }
  // Revisions are kept and readable.
  Result list = os({"policy", "list", "live"});
  EXPECT_THAT(list.out, HasSubstr("5 "));
  Result rev2 = os({"policy", "get", "live", "--rev", "2"});
  EXPECT_THAT(rev2.out, HasSubstr("port = 1"));
  // update: add and remove an endpoint.
  Result removed = os({"policy", "update", "live", "--remove-endpoint", "localhost:" + port()});
  EXPECT_EQ(removed.status, 0) << removed.err;
  EXPECT_NE(os(fetch).status, 0);
  Result added = os({"policy", "update", "live", "--add-endpoint", "localhost:" + port()});
  EXPECT_EQ(added.status, 0) << added.err;
  // Without allowed_ips the SSRF guard refuses loopback: still denied, but by the address check.
  Result guarded = os(fetch);
  EXPECT_NE(guarded.status, 0);
  // A bad policy is refused and the running one stays.
  std::string bad = policy("[network_policies.x]\nendpoints = [ { host = \"*\", port = 1 } ]\n");
  Result refused = os({"policy", "set", "live", "--policy", bad});
  EXPECT_EQ(refused.status, 125);
  EXPECT_THAT(refused.err, HasSubstr(":3: network_policies.x.endpoints[0].host"));
  ASSERT_EQ(os({"policy", "set", "live", "--policy", allow}).status, 0);
  EXPECT_EQ(os(fetch).status, 0);
  // The audit log, through the gateway.
  Result audit = os({"logs", "live", "--source", "network"});
  EXPECT_THAT(audit.out, HasSubstr("\"decision\":\"deny\""));
  EXPECT_THAT(audit.out, HasSubstr("\"decision\":\"allow\""));
  os({"sandbox", "delete", "--all"});
  os({"gateway", "stop"});
}

}  // namespace
}  // namespace e2e
