#include "policy/policy.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/address.h"
#include "base/error.h"
#include "base/text.h"
#include "supervisor/network_rules.h"
#include "test_util.h"

namespace openshell::policy {
namespace {

using openshell::testing::error_of;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

constexpr const char* kExample = R"(version = 1

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
endpoints = [
  { host = "api.github.com", port = 443 },
  { host = "*.githubusercontent.com", ports = [443] },
]
binaries = [ { path = "/usr/bin/git" }, { path = "/usr/bin/curl" } ]
)";

// The message of the Error that parse() throws, or a test failure.
std::string parse_error(const std::string& text) {
  try {
    parse(text, "policy.toml");
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "parse() accepted:\n" << text;
  return "";
}

TEST(PolicyParse, Example) {
  Policy p = parse(kExample, "policy.toml");
  EXPECT_EQ(p.version, 1);
  EXPECT_TRUE(p.has_filesystem_policy);
  EXPECT_TRUE(p.filesystem.include_workdir);
  EXPECT_THAT(p.filesystem.read_only, ElementsAre("/usr", "/lib", "/etc", "/proc"));
  EXPECT_THAT(p.filesystem.read_write, ElementsAre("/sandbox", "/tmp", "/dev/null"));
  EXPECT_EQ(p.landlock, LandlockCompatibility::kBestEffort);
  EXPECT_EQ(p.process.run_as_user, "sandbox");
  EXPECT_EQ(p.process.run_as_group, "sandbox");
  ASSERT_EQ(p.network.size(), 1u);
  const NetworkPolicy& github = p.network[0];
  EXPECT_EQ(github.name, "github");
  ASSERT_EQ(github.endpoints.size(), 2u);
  EXPECT_EQ(github.endpoints[0].host, "api.github.com");
  EXPECT_THAT(github.endpoints[0].ports, ElementsAre(443));
  EXPECT_EQ(github.endpoints[1].host, "*.githubusercontent.com");
  EXPECT_THAT(github.endpoints[1].ports, ElementsAre(443));
  ASSERT_EQ(github.binaries.size(), 2u);
  EXPECT_EQ(github.binaries[0].path, "/usr/bin/git");
  EXPECT_EQ(github.binaries[1].path, "/usr/bin/curl");
}

TEST(PolicyParse, DefaultsWhenOnlyVersion) {
  Policy p = parse("version = 1\n", "policy.toml");
  EXPECT_FALSE(p.has_filesystem_policy);
  EXPECT_TRUE(p.filesystem.include_workdir);
  EXPECT_THAT(p.filesystem.read_only, IsEmpty());
  EXPECT_THAT(p.filesystem.read_write, IsEmpty());
  EXPECT_EQ(p.landlock, LandlockCompatibility::kBestEffort);
  EXPECT_FALSE(p.process.run_as_user.has_value());
  EXPECT_FALSE(p.process.run_as_group.has_value());
  EXPECT_THAT(p.network, IsEmpty());
}

TEST(PolicyParse, EmptyFilesystemPolicyStillCounts) {
  Policy p = parse("version = 1\n[filesystem_policy]\ninclude_workdir = false\n", "p.toml");
  EXPECT_TRUE(p.has_filesystem_policy);
  EXPECT_FALSE(p.filesystem.include_workdir);
}

TEST(PolicyParse, HardRequirementAndNumericIds) {
  Policy p = parse(R"(version = 1
[landlock]
compatibility = "hard_requirement"
[process]
run_as_user = 1000
run_as_group = 100
)",
                   "p.toml");
  EXPECT_EQ(p.landlock, LandlockCompatibility::kHardRequirement);
  EXPECT_EQ(p.process.run_as_user, "1000");
  EXPECT_EQ(p.process.run_as_group, "100");
}

TEST(PolicyParse, EndpointOptionalFields) {
  Policy p = parse(R"(version = 1
[network_policies.api]
endpoints = [ { host = "example.com", port = 80, ports = [8080, 8443], allowed_ips = ["10.0.0.0/8"], protocol = "rest", access = "read-only" } ]
)",
                   "p.toml");
  ASSERT_EQ(p.network.size(), 1u);
  ASSERT_EQ(p.network[0].endpoints.size(), 1u);
  const Endpoint& e = p.network[0].endpoints[0];
  EXPECT_THAT(e.ports, ElementsAre(80, 8080, 8443));
  EXPECT_THAT(e.allowed_ips, ElementsAre("10.0.0.0/8"));
  EXPECT_EQ(e.protocol, "rest");
  EXPECT_EQ(e.access, "read-only");
}

TEST(PolicyErrors, MissingVersionNamesSourceAndField) {
  EXPECT_THAT(parse_error("[landlock]\ncompatibility = \"best_effort\"\n"),
              StartsWith("policy.toml: version: missing"));
  EXPECT_THAT(parse_error(""), StartsWith("policy.toml: version: missing"));
}

TEST(PolicyErrors, UnsupportedVersion) {
  EXPECT_THAT(parse_error("\nversion = 2\n"),
              StartsWith("policy.toml:2: version: unsupported version"));
  EXPECT_THAT(parse_error("version = \"1\"\n"),
              StartsWith("policy.toml:1: version: unsupported version"));
}

TEST(PolicyErrors, UnknownTopLevelKey) {
  std::string message = parse_error("version = 1\nnetwork = true\n");
  EXPECT_THAT(message, StartsWith("policy.toml:2: network: unknown field"));
  EXPECT_THAT(message, HasSubstr("network_policies"));  // the hint lists the known ones
}

TEST(PolicyErrors, UnknownKeyInFilesystemPolicy) {
  EXPECT_THAT(
      parse_error("version = 1\n[filesystem_policy]\nread_only = []\nwritable = [\"/x\"]\n"),
      StartsWith("policy.toml:4: filesystem_policy.writable: unknown field"));
}

TEST(PolicyErrors, FilesystemPolicyMustBeATable) {
  EXPECT_THAT(parse_error("version = 1\nfilesystem_policy = 5\n"),
              StartsWith("policy.toml:2: filesystem_policy: must be a table"));
}

TEST(PolicyErrors, IncludeWorkdirMustBeBoolean) {
  EXPECT_THAT(
      parse_error("version = 1\n[filesystem_policy]\ninclude_workdir = \"yes\"\n"),
      StartsWith("policy.toml:3: filesystem_policy.include_workdir: must be true or false"));
}

TEST(PolicyErrors, RelativePathNamesTheItemAndItsLine) {
  EXPECT_THAT(
      parse_error(R"(version = 1
[filesystem_policy]
read_only = [
  "/usr",
  "usr/lib",
]
)"),
      StartsWith("policy.toml:5: filesystem_policy.read_only[1]: must be an absolute path"));
}

TEST(PolicyErrors, DotDotInPath) {
  EXPECT_THAT(
      parse_error("version = 1\n[filesystem_policy]\nread_write = [\"/tmp\", \"/a/../etc\"]\n"),
      StartsWith("policy.toml:3: filesystem_policy.read_write[1]: must not contain '..'"));
}

TEST(PolicyErrors, PathsMustBeStrings) {
  EXPECT_THAT(parse_error("version = 1\n[filesystem_policy]\nread_only = [\"/usr\", 5]\n"),
              StartsWith("policy.toml:3: filesystem_policy.read_only[1]: must be a string"));
  EXPECT_THAT(
      parse_error("version = 1\n[filesystem_policy]\nread_only = \"/usr\"\n"),
      StartsWith("policy.toml:3: filesystem_policy.read_only: must be an array of strings"));
}

TEST(PolicyErrors, RootIsNeverReadWrite) {
  EXPECT_THAT(parse_error("version = 1\n[filesystem_policy]\nread_write = [\"/\"]\n"),
              StartsWith("policy.toml:3: filesystem_policy.read_write[0]: / cannot be read-write"));
  // Read-only is fine.
  Policy p = parse("version = 1\n[filesystem_policy]\nread_only = [\"/\"]\n", "p.toml");
  EXPECT_THAT(p.filesystem.read_only, ElementsAre("/"));
}

// Regression (fixed): the "/ cannot be read-write" rule compares the string with "/" only, so
// other spellings of the root ("//", "/.", "/tmp/..") pass; Landlock then opens
// them as / and the whole tree becomes writable. ("/tmp/.." is refused for
// its "..", but "//" and "/." are not.)
TEST(PolicyErrors, RootIsNeverReadWriteWhateverItsSpelling) {
  for (const char* root : {"//", "/.", "/./"})
    EXPECT_THAT(parse_error(std::string("version = 1\n[filesystem_policy]\nread_write = [\"") +
                            root + "\"]\n"),
                HasSubstr("cannot be read-write"))
        << root;
}

TEST(PolicyErrors, BadLandlockCompatibility) {
  EXPECT_THAT(parse_error("version = 1\n[landlock]\ncompatibility = \"strict\"\n"),
              StartsWith("policy.toml:3: landlock.compatibility: must be \"best_effort\" or "
                         "\"hard_requirement\", not \"strict\""));
  EXPECT_THAT(parse_error("version = 1\n[landlock]\nmode = \"x\"\n"),
              StartsWith("policy.toml:3: landlock.mode: unknown field"));
}

TEST(PolicyErrors, RunAsRootIsRefused) {
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = \"root\"\n"),
              StartsWith("policy.toml:3: process.run_as_user: must not be root"));
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = 0\n"),
              StartsWith("policy.toml:3: process.run_as_user: must not be root"));
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = \"0\"\n"),
              StartsWith("policy.toml:3: process.run_as_user: must not be root"));
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = \"a\"\nrun_as_group = \"root\"\n"),
              StartsWith("policy.toml:4: process.run_as_group: must not be root"));
}

TEST(PolicyProcess, AllowRootLetsThePolicyNameRoot) {
  Policy p = parse("version = 1\n[process]\nallow_root = true\nrun_as_user = \"root\"\n", "p");
  EXPECT_TRUE(p.process.allow_root);
  EXPECT_EQ(p.process.run_as_user, "root");
  EXPECT_FALSE(parse("version = 1\n[process]\nallow_root = false\n", "p").process.allow_root);
  EXPECT_FALSE(parse("version = 1\n", "p").process.allow_root);
  // Its place in the table does not matter.
  EXPECT_TRUE(parse("version = 1\n[process]\nrun_as_user = 0\nallow_root = true\n", "p")
                  .process.allow_root);
  EXPECT_THAT(parse_error("version = 1\n[process]\nallow_root = \"yes\"\n"),
              StartsWith("policy.toml:3: process.allow_root: must be true or false"));
  EXPECT_THAT(parse_error("version = 1\n[process]\nallow_root = false\nrun_as_user = 0\n"),
              StartsWith("policy.toml:4: process.run_as_user: must not be root (unless "
                         "process.allow_root = true)"));
  Policy round = parse(to_toml(p), "again");
  EXPECT_EQ(round, p);
  EXPECT_THAT(to_toml(p), HasSubstr("[process]\nallow_root = true\n"));
}

// Regression (fixed): resolve_user() reads "00" as uid 0, but the policy's root check only
// compares with "root" and "0".
TEST(PolicyErrors, RunAsRootIsRefusedWithLeadingZeros) {
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = \"00\"\n"),
              HasSubstr("must not be root"));
}

TEST(PolicyErrors, BadIds) {
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = -1\n"),
              StartsWith("policy.toml:3: process.run_as_user: is not a valid id"));
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = \"\"\n"),
              StartsWith("policy.toml:3: process.run_as_user: must not be empty"));
  EXPECT_THAT(parse_error("version = 1\n[process]\nrun_as_user = true\n"),
              StartsWith("policy.toml:3: process.run_as_user: must be a string"));
}

TEST(PolicyErrors, EndpointWithoutPort) {
  EXPECT_THAT(
      parse_error(
          "version = 1\n[network_policies.x]\nendpoints = [ { host = \"example.com\" } ]\n"),
      StartsWith("policy.toml:3: network_policies.x.endpoints[0]: needs a port or ports"));
}

TEST(PolicyErrors, EndpointWithoutHost) {
  EXPECT_THAT(parse_error("version = 1\n[network_policies.x]\nendpoints = [ { port = 443 } ]\n"),
              StartsWith("policy.toml:3: network_policies.x.endpoints[0]: needs a host"));
}

TEST(PolicyErrors, PortOutOfRange) {
  EXPECT_THAT(
      parse_error("version = 1\n[network_policies.x]\nendpoints = [ { host = \"a.com\", port = "
                  "70000 } ]\n"),
      StartsWith(
          "policy.toml:3: network_policies.x.endpoints[0].port: must be between 1 and 65535"));
  EXPECT_THAT(
      parse_error(R"(version = 1
[network_policies.x]
endpoints = [
  { host = "a.com", port = 443 },
  { host = "b.com", ports = [443, 0] },
]
)"),
      StartsWith("policy.toml:5: network_policies.x.endpoints[1].ports[1]: must be between"));
  EXPECT_THAT(
      parse_error("version = 1\n[network_policies.x]\nendpoints = [ { host = \"a.com\", port = "
                  "\"443\" } ]\n"),
      StartsWith("policy.toml:3: network_policies.x.endpoints[0].port: must be a port number"));
}

TEST(PolicyErrors, BadHostPatterns) {
  auto with_host = [](const std::string& host) {
    return "version = 1\n[network_policies.x]\nendpoints = [ { host = \"" + host +
           "\", port = 443 } ]\n";
  };
  const std::string field = "policy.toml:3: network_policies.x.endpoints[0].host: ";
  EXPECT_THAT(parse_error(with_host("*.com")), StartsWith(field + "wildcard must leave"));
  EXPECT_THAT(parse_error(with_host("a.*.com")), StartsWith(field + "may hold '*' only"));
  EXPECT_THAT(parse_error(with_host("*")), StartsWith(field + "wildcard must leave"));
  EXPECT_THAT(parse_error(with_host("")), StartsWith(field + "must not be empty"));
}

TEST(PolicyErrors, BinaryPathMustBeAbsolute) {
  EXPECT_THAT(
      parse_error(R"(version = 1
[network_policies.x]
binaries = [
  { path = "/usr/bin/git" },
  { path = "bin/curl" },
]
)"),
      StartsWith("policy.toml:5: network_policies.x.binaries[1].path: must be an absolute path"));
  EXPECT_THAT(parse_error("version = 1\n[network_policies.x]\nbinaries = [ \"/usr/bin/git\" ]\n"),
              StartsWith("policy.toml:3: network_policies.x.binaries[0]: must be a table"));
  EXPECT_THAT(parse_error("version = 1\n[network_policies.x]\nbinaries = [ { name = \"git\" } ]\n"),
              StartsWith("policy.toml:3: network_policies.x.binaries[0].name: unknown field"));
}

TEST(PolicyErrors, BadAllowedIpsNameFileLineAndEntry) {
  auto with_ips = [](const std::string& ips) {
    return "version = 1\n[network_policies.x]\nendpoints = [ { host = \"a.example.com\", port = "
           "443, "
           "allowed_ips = [" +
           ips + "] } ]\n";
  };
  const std::string field = "policy.toml:3: network_policies.x.endpoints[0].allowed_ips";
  EXPECT_EQ(parse_error(with_ips("\"nonsense\"")),
            field +
                "[0]: \"nonsense\" is not an IP address or CIDR (like 10.0.0.0/8, 192.0.2.1 or "
                "fd00::/8)");
  EXPECT_EQ(parse_error(with_ips("\"10.0.0.0/8\", \"10.0.0.0/33\"")),
            field +
                "[1]: \"10.0.0.0/33\" is not an IP address or CIDR: the prefix length must be a "
                "number from 0 to 32");
  EXPECT_EQ(
      parse_error(with_ips("\"1.2.3.4/\"")),
      field +
          "[0]: \"1.2.3.4/\" is not an IP address or CIDR: the prefix length after '/' is missing");
  EXPECT_EQ(parse_error(with_ips("\"fd00::/129\"")),
            field +
                "[0]: \"fd00::/129\" is not an IP address or CIDR: the prefix length must be a "
                "number from 0 to 128");
  for (const char* bad :
       {"", "/8", "10.0.0/8", "010.0.0.1", "example.com/8", "10.0.0.0/-1", "10.0.0.0/+8",
        "10.0.0.0/8/8", "10.0.0.0/ 8", " 10.0.0.1", "fe80::1%eth0"})
    EXPECT_THAT(parse_error(with_ips("\"" + std::string(bad) + "\"")),
                StartsWith(field + "[0]: \"" + bad + "\" is not an IP address or CIDR"))
        << bad;
  EXPECT_THAT(parse_error(with_ips("8")), StartsWith(field + "[0]: must be a string"));
  EXPECT_THAT(
      parse_error("version = 1\n[network_policies.x]\nendpoints = [ { host = \"a.example.com\", "
                  "port = 443, allowed_ips = \"10.0.0.0/8\" } ]\n"),
      StartsWith(field + ": must be an array of strings"));
  // The line is the entry's own, in an array over several lines.
  EXPECT_EQ(parse_error(R"(version = 1

[network_policies.internal]
endpoints = [
  { host = "registry.corp.example", port = 5000, allowed_ips = [
      "10.20.0.0/16",
      "10.30.0.0/99",
  ] },
]
)"),
            "policy.toml:7: network_policies.internal.endpoints[0].allowed_ips[1]: "
            "\"10.30.0.0/99\" is not "
            "an IP address or CIDR: the prefix length must be a number from 0 to 32");
}

TEST(PolicyParse, AllowedIpsForms) {
  Policy p = parse(R"(version = 1
[network_policies.x]
endpoints = [ { host = "a.example.com", port = 443, allowed_ips = [
  "10.20.0.0/16", "127.0.0.1", "10.1.2.3/8", "0.0.0.0/0", "fd00::/8", "::1", "[::1]/128", "::/0",
  "::ffff:127.0.0.1/128" ] } ]
)",
                   "policy.toml");
  ASSERT_EQ(p.network.size(), 1u);
  EXPECT_EQ(p.network[0].endpoints[0].allowed_ips.size(), 9u);
}

// Whatever parse() accepts, the egress rules compile: a bad network field
// must stop `policy validate`, never a running sandbox's proxy.
TEST(PolicyParse, WhatParsesCompilesIntoEgressRules) {
  for (const char* entry : {"10.0.0.0/8",
                            "1.2.3.4",
                            "1.2.3.4/32",
                            "1.2.3.4/0",
                            "::/0",
                            "[::1]",
                            "[::1]/128",
                            "fd00::/8",
                            "::ffff:10.0.0.0/104",
                            "nonsense",
                            "10.0.0.0/33",
                            "1.2.3.4/",
                            "::/129",
                            "/8",
                            "[1.2.3.4]",
                            "1.2.3.4/08",
                            "1.2.3.4/0x8",
                            "1.2.3.4//8",
                            "[::1",
                            "::1]",
                            "1.2.3.4\\u0000/8",
                            "2001:db8::1/64%eth0",
                            "10.0.0.0/99999999999999999999999"}) {
    std::string text = std::string(
                           "version = 1\n[network_policies.x]\nendpoints = [ { host = "
                           "\"a.example.com\", port = 443, allowed_ips = [\"") +
                       entry + "\"] } ]\n";
    bool parsed = false;
    try {
      Policy p = parse(text, "policy.toml");
      parsed = true;
      EXPECT_NO_THROW(supervisor::network_rules(p)) << entry;
    } catch (const Error&) {
    }
    // The same verdict as the rules' own parser, in both directions.
    std::string unescaped = entry;
    if (auto nul = unescaped.find("\\u0000"); nul != std::string::npos)
      unescaped.replace(nul, 6, std::string(1, '\0'));
    EXPECT_EQ(parsed, Cidr::parse(unescaped).has_value()) << entry;
  }
  // Hosts, ports and binaries: every form parse() takes, compiled and used.
  Policy p = parse(R"(version = 1
[network_policies.odd]
endpoints = [
  { host = "2001:db8::1", ports = [1, 65535] },
  { host = "192.0.2.1", port = 80 },
  { host = "*.example.com", port = 443 },
  { host = "api-*.example.com", port = 443 },
  { host = "Under_Score.Example.COM", port = 443 },
]
binaries = [ { path = "/usr/bin/[" }, { path = "/opt/*/bin/?" }, { path = "/" }, { path = "/a/../b" } ]
)",
                   "policy.toml");
  egress::NetworkRules rules;
  ASSERT_NO_THROW(rules =
                      supervisor::network_rules(p, [](const std::string& path) { return path; }));
  EXPECT_TRUE(rules.check("/opt/x/bin/y", "api-1.example.com", 443, nullptr).allowed);
  EXPECT_TRUE(rules.check("/opt/x/bin/y", "2001:db8::1", 65535, nullptr).allowed);
}

TEST(PolicyErrors, UnknownKeyInNetworkRule) {
  EXPECT_THAT(parse_error("version = 1\n[network_policies.x]\nhosts = []\n"),
              StartsWith("policy.toml:3: network_policies.x.hosts: unknown field"));
}

TEST(PolicyErrors, MalformedTomlHasLineNumber) {
  EXPECT_THAT(parse_error("version = 1\n\n[filesystem_policy\nread_only = []\n"),
              StartsWith("policy.toml:3: "));
  EXPECT_THAT(parse_error("version = 1\nread_only = [\"/usr\"\n"), StartsWith("policy.toml:"));
  EXPECT_THAT(parse_error("version = = 1\n"), StartsWith("policy.toml:1: "));
}

TEST(PolicyLoad, MissingFileNamesPath) {
  openshell::testing::TempDir tmp;
  std::string path = tmp / "absent.toml";
  try {
    load(path);
    FAIL() << "load() of a missing file did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), StartsWith("policy " + path + ": "));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
}

TEST(PolicyLoad, ReadsFileAndUsesPathAsSource) {
  openshell::testing::TempDir tmp;
  std::string path = tmp / "p.toml";
  openshell::testing::write_file(path, kExample);
  Policy p = load(path);
  EXPECT_THAT(p.filesystem.read_write, ElementsAre("/sandbox", "/tmp", "/dev/null"));

  openshell::testing::write_file(path, "version = 1\n[process]\nrun_as_user = \"root\"\n");
  try {
    load(path);
    FAIL() << "load() accepted run_as_user = root";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), StartsWith(path + ":3: process.run_as_user: "));
  }
}

TEST(DefaultPolicy, Contents) {
  Policy p = default_policy();
  EXPECT_EQ(p.version, 1);
  EXPECT_TRUE(p.has_filesystem_policy);
  EXPECT_TRUE(p.filesystem.include_workdir);
  EXPECT_EQ(p.landlock, LandlockCompatibility::kBestEffort);
  for (const char* dir : {"/usr", "/lib", "/etc", "/proc", "/dev", "/sys"})
    EXPECT_THAT(p.filesystem.read_only, Contains(dir));
  for (const char* dir : {"/sandbox", "/tmp", "/dev/null"})
    EXPECT_THAT(p.filesystem.read_write, Contains(dir));
  EXPECT_THAT(p.filesystem.read_write, Not(Contains("/")));
  EXPECT_THAT(p.filesystem.read_write, Not(Contains("/etc")));
  EXPECT_THAT(p.filesystem.read_write, Not(Contains("/usr")));
  EXPECT_THAT(p.network, IsEmpty());  // no network by default
  EXPECT_FALSE(p.process.run_as_user.has_value());
  for (const auto& path : p.filesystem.read_only)
    EXPECT_EQ(openshell::text::check_absolute_path(path), "") << path;
  for (const auto& path : p.filesystem.read_write)
    EXPECT_EQ(openshell::text::check_absolute_path(path), "") << path;
}

TEST(CheckHostPattern, Accepts) {
  for (const char* host : {"api.github.com", "*.githubusercontent.com", "localhost", "Example.COM",
                           "10.0.0.1", "my-host_1.example.org"})
    EXPECT_EQ(check_host_pattern(host), "") << host;
}

TEST(CheckHostPattern, Rejects) {
  EXPECT_EQ(check_host_pattern(""), "must not be empty");
  EXPECT_EQ(check_host_pattern(std::string(254, 'a')), "is longer than 253 characters");
  EXPECT_EQ(check_host_pattern("a..b"), "has an empty label");
  EXPECT_EQ(check_host_pattern("example.com."), "has an empty label");
  EXPECT_EQ(check_host_pattern("exa mple.com"), "has an invalid character ' '");
  EXPECT_EQ(check_host_pattern("a/b.com"), "has an invalid character '/'");
  EXPECT_EQ(check_host_pattern("a.*.com"), "may hold '*' only in its first label");
  EXPECT_THAT(check_host_pattern("*.com"), StartsWith("wildcard must leave at least two labels"));
  EXPECT_THAT(check_host_pattern("*"), StartsWith("wildcard must leave at least two labels"));
}

TEST(CheckAllowedIp, Reasons) {
  for (const char* good : {"10.0.0.0/8", "192.0.2.1", "fd00::/8", "::1", "[::1]/128", "0.0.0.0/0"})
    EXPECT_EQ(check_allowed_ip(good), "") << good;
  EXPECT_EQ(check_allowed_ip("corp"),
            "\"corp\" is not an IP address or CIDR (like 10.0.0.0/8, 192.0.2.1 or fd00::/8)");
  EXPECT_THAT(check_allowed_ip("10.0.0.0/33"), HasSubstr("from 0 to 32"));
  EXPECT_THAT(check_allowed_ip("::/129"), HasSubstr("from 0 to 128"));
  EXPECT_THAT(check_allowed_ip("1.2.3.4/"), HasSubstr("after '/' is missing"));
}

// parse(to_toml(policy)), with the text in the failure message.
Policy round_trip(const Policy& policy) {
  std::string text = to_toml(policy);
  try {
    return parse(text, "written.toml");
  } catch (const Error& e) {
    ADD_FAILURE() << e.what() << "\n" << text;
    return {};
  }
}

TEST(PolicyToToml, DesignExampleInItsOwnLayout) {
  Policy p = parse(kExample, "policy.toml");
  EXPECT_EQ(to_toml(p), R"(version = 1

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
endpoints = [
  { host = "api.github.com", port = 443 },
  { host = "*.githubusercontent.com", port = 443 },
]
binaries = [
  { path = "/usr/bin/git" },
  { path = "/usr/bin/curl" },
]
)");
  Policy back = round_trip(p);
  EXPECT_EQ(back, p);
  ASSERT_EQ(back.network.size(), 1u);
  EXPECT_EQ(back.network[0].binaries.size(), 2u);
}

TEST(PolicyToToml, EmptyPolicy) {
  Policy empty;
  std::string text = to_toml(empty);
  EXPECT_THAT(text, StartsWith("version = 1\n"));
  EXPECT_THAT(text, Not(HasSubstr("filesystem_policy")));
  EXPECT_THAT(text, Not(HasSubstr("[process]")));
  EXPECT_THAT(text, Not(HasSubstr("network_policies")));
  Policy back = round_trip(empty);
  EXPECT_EQ(back, empty);
  EXPECT_FALSE(back.has_filesystem_policy);
}

TEST(PolicyToToml, DefaultPolicy) {
  Policy p = default_policy();
  EXPECT_EQ(round_trip(p), p);
}

TEST(PolicyToToml, EveryField) {
  Policy p;
  p.has_filesystem_policy = true;
  p.filesystem.include_workdir = false;
  // Long enough to be written one path a line.
  for (int i = 0; i < 12; ++i) p.filesystem.read_only.push_back("/opt/tool-" + std::to_string(i));
  p.filesystem.read_write = {};
  p.landlock = LandlockCompatibility::kHardRequirement;
  p.process.run_as_user = "1000";
  p.process.run_as_group = "staff";
  NetworkPolicy api;
  api.name = "api";
  api.endpoints.push_back(
      {"example.com", {80, 8080, 8443}, {"10.0.0.0/8", "fd00::/8"}, "rest", "read-only", "", ""});
  api.endpoints.push_back({"*.example.org", {443}, {}, "", ""});
  api.endpoints.push_back({"10.1.2.3", {22}, {"10.1.2.3/32"}, "rest", "", "skip", "audit"});
  api.binaries = {{"/usr/bin/python3*"}, {"/usr/bin/curl"}};
  NetworkPolicy bare;  // no endpoints, no binaries
  bare.name = "bare";
  p.network = {api, bare};

  std::string text = to_toml(p);
  EXPECT_THAT(text, HasSubstr("read_only = [\n  \"/opt/tool-0\",\n"));
  EXPECT_THAT(text, HasSubstr("read_write = []\n"));
  EXPECT_THAT(text, HasSubstr("compatibility = \"hard_requirement\"\n"));
  EXPECT_THAT(text, HasSubstr("ports = [80, 8080, 8443]"));
  Policy back = round_trip(p);
  EXPECT_EQ(back, p);
  ASSERT_EQ(back.network.size(), 2u);
  EXPECT_EQ(back.network[0].endpoints[0].access, "read-only");
  EXPECT_EQ(back.network[1].name, "bare");
}

TEST(PolicyToToml, OnlyAGroup) {
  Policy p;
  p.process.run_as_group = "100";
  Policy back = round_trip(p);
  EXPECT_EQ(back, p);
  EXPECT_FALSE(back.process.run_as_user.has_value());
}

TEST(PolicyToToml, StringsAndNamesAreQuoted) {
  Policy p;
  p.has_filesystem_policy = true;
  p.filesystem.read_only = {"/tmp/a \"b\" \\c", "/donn\u00e9es", "/tab\there"};
  NetworkPolicy odd;
  odd.name = "my policy.v2 \"x\"";
  odd.endpoints.push_back({"api.example.com", {443}, {}, "rest"});
  odd.endpoints[0].ca_file = "/line\nbreak\x01/a\\b";
  p.network = {odd};
  Policy back = round_trip(p);
  EXPECT_EQ(back, p);
  ASSERT_EQ(back.network.size(), 1u);
  EXPECT_EQ(back.network[0].name, "my policy.v2 \"x\"");
  EXPECT_EQ(back.network[0].endpoints[0].ca_file, "/line\nbreak\x01/a\\b");
}

TEST(PolicyToToml, FilesystemLeftOutWhenNotGiven) {
  Policy p;
  p.has_filesystem_policy = false;
  p.filesystem.read_only = {"/ignored"};
  EXPECT_THAT(to_toml(p), Not(HasSubstr("/ignored")));
  EXPECT_THAT(round_trip(p).filesystem.read_only, IsEmpty());
}

TEST(PolicyToToml, NetworkPoliciesComeBackSortedByName) {
  Policy p;
  p.network = {{"zeta", {{"z.example.com", {443}, {}, "", ""}}, {}},
               {"alpha", {{"a.example.com", {443}, {}, "", ""}}, {}}};
  std::string text = to_toml(p);
  EXPECT_LT(text.find("[network_policies.zeta]"), text.find("[network_policies.alpha]"));
  Policy back = round_trip(p);
  ASSERT_EQ(back.network.size(), 2u);
  EXPECT_EQ(back.network[0].name, "alpha");
  EXPECT_EQ(back.network[1].name, "zeta");
}

TEST(PolicyToToml, DuplicateNameIsAnError) {
  Policy p;
  p.network = {{"web", {}, {}}, {"web", {}, {}}};
  EXPECT_THROW(to_toml(p), Error);
}

// --- [vm] ---------------------------------------------------------------------------

TEST(PolicyVm, VcpusAndMemoryAsSizesOrMib) {
  Policy p = parse("version = 1\n[vm]\nvcpus = 2\nmemory = \"512M\"\n", "p.toml");
  EXPECT_EQ(p.vm.vcpus, 2u);
  EXPECT_EQ(p.vm.memory_mib, 512u);
  EXPECT_EQ(parse("version = 1\n[vm]\nmemory = 2048\n", "p.toml").vm.memory_mib, 2048u);
  EXPECT_EQ(parse("version = 1\n[vm]\nmemory = \"1G\"\n", "p.toml").vm.memory_mib, 1024u);
  EXPECT_EQ(parse("version = 1\n[vm]\nmemory = \"2Gi\"\n", "p.toml").vm.memory_mib, 2048u);
  // Rounded up to whole MiB, as --memory is for a guest.
  EXPECT_EQ(parse("version = 1\n[vm]\nmemory = \"67108865\"\n", "p.toml").vm.memory_mib, 65u);
  // Without [vm], nothing is set: the command line's defaults hold.
  EXPECT_EQ(parse("version = 1\n", "p.toml").vm, VmPolicy{});
  EXPECT_EQ(default_policy().vm, VmPolicy{});
}

TEST(PolicyVm, RefusedWithTheLineAndTheField) {
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nvcpu = 2\n", "policy.toml"); }),
              StartsWith("policy.toml:3: vm.vcpu: unknown field (expected one of: vcpus, memory)"));
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nvcpus = 0\n", "policy.toml"); }),
              StartsWith("policy.toml:3: vm.vcpus: must be between 1 and 64"));
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nvcpus = 65\n", "p.toml"); }),
              HasSubstr("vm.vcpus"));
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nvcpus = \"2\"\n", "p.toml"); }),
              HasSubstr("vm.vcpus: must be a number of vCPUs"));
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nmemory = \"lots\"\n", "p.toml"); }),
              HasSubstr("p.toml:3: vm.memory: not a size"));
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nmemory = \"32M\"\n", "p.toml"); }),
              HasSubstr("vm.memory: must be between 64 and 65536 MiB"));
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nmemory = 0\n", "p.toml"); }),
              HasSubstr("vm.memory: not a size"));
  EXPECT_THAT(error_of([] { parse("version = 1\n[vm]\nmemory = true\n", "p.toml"); }),
              HasSubstr("vm.memory: must be a size"));
  EXPECT_THAT(error_of([] { parse("version = 1\nvm = 2\n", "p.toml"); }),
              HasSubstr("vm: must be a table"));
}

TEST(PolicyVm, RoundTripsThroughTomlAndReadsFromYaml) {
  Policy p = default_policy();
  p.vm.vcpus = 4;
  p.vm.memory_mib = 1536;
  EXPECT_THAT(to_toml(p), HasSubstr("\n[vm]\nvcpus = 4\nmemory = \"1536M\"\n"));
  EXPECT_EQ(round_trip(p), p);
  Policy only_memory;
  only_memory.vm.memory_mib = 256;
  EXPECT_EQ(round_trip(only_memory), only_memory);
  EXPECT_THAT(to_toml(Policy{}), Not(HasSubstr("[vm]")));

  Policy yaml = parse("version: 1\nvm:\n  vcpus: 2\n  memory: 512M\n", "p.yaml");
  EXPECT_EQ(yaml.vm.vcpus, 2u);
  EXPECT_EQ(yaml.vm.memory_mib, 512u);
  EXPECT_THAT(error_of([] { parse("version: 1\nvm:\n  cpus: 2\n", "p.yaml"); }),
              StartsWith("p.yaml:3: vm.cpus: unknown field"));
}

// An endpoint line in [network_policies.api], to check one field.
std::string layer7(const std::string& fields) {
  return "version = 1\n[network_policies.api]\nendpoints = [\n  { host = \"api.github.com\", "
         "port = 443" +
         (fields.empty() ? "" : ", " + fields) + " },\n]\n";
}

const Endpoint& only_endpoint(const Policy& p) {
  EXPECT_EQ(p.network.size(), 1u);
  EXPECT_EQ(p.network.at(0).endpoints.size(), 1u);
  return p.network.at(0).endpoints.at(0);
}

TEST(PolicyLayer7, EachFieldIsAccepted) {
  Policy p =
      parse(layer7(R"(protocol = "rest", tls = "auto", enforcement = "audit", )"
                   R"(rules = [ { allow = { method = "get", path = "/repos/**", )"
                   R"(query = { per_page = "1*", state = { any = ["open", "closed"] } } } }, )"
                   R"({ allow = { method = "*", path = "/user" } } ], )"
                   R"(deny_rules = [ { deny = { method = "DELETE", path = "/**" } } ], )"
                   R"(allow_encoded_slash = true, ca_file = "/etc/ssl/private-ca.pem")"),
            "p.toml");
  const Endpoint& e = only_endpoint(p);
  EXPECT_EQ(e.protocol, "rest");
  EXPECT_EQ(e.tls, "auto");
  EXPECT_EQ(e.enforcement, "audit");
  EXPECT_EQ(e.access, "");
  ASSERT_EQ(e.rules.size(), 2u);
  EXPECT_EQ(e.rules[0].method, "GET") << "stored upper case";
  EXPECT_EQ(e.rules[0].path, "/repos/**");
  ASSERT_EQ(e.rules[0].query.size(), 2u);
  EXPECT_EQ(e.rules[0].query[0], (QueryMatcher{"per_page", "1*", {}}));
  EXPECT_EQ(e.rules[0].query[1], (QueryMatcher{"state", "", {"open", "closed"}}));
  EXPECT_EQ(e.rules[1], (HttpRule{"*", "/user", {}}));
  ASSERT_EQ(e.deny_rules.size(), 1u);
  EXPECT_EQ(e.deny_rules[0], (HttpRule{"DELETE", "/**", {}}));
  EXPECT_TRUE(e.allow_encoded_slash);
  EXPECT_EQ(e.ca_file, "/etc/ssl/private-ca.pem");
  EXPECT_EQ(only_endpoint(parse(layer7(R"(protocol = "rest", credentials_in = ["query", "body"])"),
                                "p"))
                .credentials_in,
            (std::vector<std::string>{"query", "body"}));

  EXPECT_EQ(
      only_endpoint(parse(layer7(R"(protocol = "websocket", access = "read-write")"), "p")).access,
      "read-write");
  EXPECT_EQ(only_endpoint(parse(layer7(R"(protocol = "rest", access = "full")"), "p")).access,
            "full");
  EXPECT_EQ(only_endpoint(parse(layer7(R"(tls = "skip")"), "p")).tls, "skip");
  EXPECT_EQ(only_endpoint(parse(layer7(R"(protocol = "rest", tls = "skip")"), "p")).tls, "skip");
  // access with deny_rules: a preset with exceptions.
  Endpoint mixed = only_endpoint(parse(
      layer7(
          R"(protocol = "rest", access = "full", deny_rules = [ { deny = { path = "/admin/**" } } ])"),
      "p"));
  EXPECT_EQ(mixed.deny_rules.at(0), (HttpRule{"", "/admin/**", {}}));
}

TEST(PolicyLayer7, ValuesOutsideTheirChoicesAreRefusedWithTheirLine) {
  const std::string at = "policy.toml:4: network_policies.api.endpoints[0].";
  EXPECT_EQ(parse_error(layer7(R"(protocol = "graphql")")),
            at + "protocol: must be \"rest\" or \"websocket\", not \"graphql\"");
  EXPECT_EQ(parse_error(layer7(R"(tls = "terminate")")),
            at + "tls: must be \"auto\" or \"skip\", not \"terminate\"");
  EXPECT_EQ(parse_error(layer7(R"(protocol = "rest", enforcement = "log")")),
            at + "enforcement: must be \"enforce\" or \"audit\", not \"log\"");
  EXPECT_EQ(parse_error(layer7(R"(protocol = "rest", access = "read")")),
            at + "access: must be \"read-only\", \"read-write\" or \"full\", not \"read\"");
  EXPECT_EQ(parse_error(layer7(R"(protocol = 7)")), at + "protocol: must be a string");
  EXPECT_EQ(parse_error(layer7(R"(protocol = "rest", allow_encoded_slash = "yes")")),
            at + "allow_encoded_slash: must be true or false");
  EXPECT_EQ(parse_error(layer7(R"(ca_file = "certs/ca.pem")")),
            at + "ca_file: " + text::check_absolute_path("certs/ca.pem"));
  EXPECT_EQ(parse_error(layer7(R"(protocol = "rest", credentials_in = ["path"])")),
            at + "credentials_in[0]: must be \"query\" or \"body\", not \"path\"");
  EXPECT_EQ(parse_error(layer7(R"(protocol = "rest", credentials_in = ["query", "query"])")),
            at + "credentials_in[1]: \"query\" is given twice");
  EXPECT_THAT(parse_error(layer7(R"(credentials_in = ["query"])")),
              StartsWith(at + "credentials_in: needs protocol = \"rest\" or \"websocket\""));
  EXPECT_THAT(parse_error(layer7(R"(protocol = "rest", tls = "skip", credentials_in = ["body"])")),
              StartsWith(at + "credentials_in: cannot go with tls = \"skip\""));
  EXPECT_THAT(parse_error(layer7(R"(protcol = "rest")")),
              HasSubstr("protcol: unknown field (expected one of: host, port, ports, allowed_ips, "
                        "protocol, tls, enforcement, access, rules, deny_rules, "
                        "allow_encoded_slash, ca_file, credentials_in)"));
}

TEST(PolicyLayer7, RuleShapesAreChecked) {
  const std::string at = "policy.toml:4: network_policies.api.endpoints[0].";
  auto rules = [](const std::string& r) { return layer7("protocol = \"rest\", " + r); };
  EXPECT_THAT(parse_error(rules(R"(rules = { allow = { path = "/" } })")),
              StartsWith(at + "rules: must be an array like [ { allow = {"));
  EXPECT_THAT(parse_error(rules(R"(rules = [ { deny = { path = "/" } } ])")),
              StartsWith(at + "rules[0].deny: an entry of rules is { allow = {"));
  EXPECT_THAT(parse_error(rules(R"(deny_rules = [ { allow = { path = "/" } } ])")),
              StartsWith(at + "deny_rules[0].allow: an entry of deny_rules is { deny = {"));
  EXPECT_THAT(parse_error(rules(R"(rules = [ { method = "GET" } ])")),
              StartsWith(at + "rules[0].method: unknown field (expected one of: allow)"));
  EXPECT_THAT(parse_error(rules(R"(rules = [ "GET /" ])")),
              StartsWith(at + "rules[0]: must be a table like { allow = {"));
  EXPECT_THAT(parse_error(rules(R"(rules = [ { allow = { verb = "GET" } } ])")),
              StartsWith(at + "rules[0].allow.verb: unknown field (expected one of: method, "
                              "path, query)"));
  EXPECT_EQ(parse_error(rules(R"(rules = [ { allow = { method = "GE T" } } ])")),
            at + "rules[0].allow.method: \"GE T\" is not an HTTP method (like GET or POST)");
  EXPECT_EQ(parse_error(rules(R"(rules = [ { allow = { method = "" } } ])")),
            at + "rules[0].allow.method: must not be empty (\"*\" is any method)");
  EXPECT_EQ(parse_error(rules(R"(rules = [ { allow = { method = "G*" } } ])")),
            at + "rules[0].allow.method: may be \"*\" (any method) but not hold it");
  EXPECT_EQ(parse_error(rules(R"(rules = [ { allow = { path = "repos/**" } } ])")),
            at + "rules[0].allow.path: must start with '/' (like \"/repos/**\")");
  EXPECT_EQ(parse_error(rules(R"(rules = [ { allow = { path = "/search?q=x" } } ])")),
            at + "rules[0].allow.path: must not hold '?': match the query string with query "
                 "= { ... }");
  EXPECT_THAT(parse_error(rules(R"(rules = [ { allow = { path = "/a**" } } ])")),
              StartsWith(at + "rules[0].allow.path: \"**\" must be a whole segment"));
  EXPECT_EQ(parse_error(rules(R"(deny_rules = [ {}, { deny = { path = "/a b" } } ])")),
            at + "deny_rules[0]: must be a table like { deny = { method = \"GET\", path = "
                 "\"/**\" } }");
}

TEST(PolicyLayer7, QueryMatchersAreChecked) {
  const std::string at = "policy.toml:4: network_policies.api.endpoints[0].rules[0].allow.query";
  auto query = [](const std::string& q) {
    return layer7("protocol = \"rest\", rules = [ { allow = { path = \"/\", query = " + q +
                  " } } ]");
  };
  EXPECT_EQ(parse_error(query(R"({ "" = "x" })")), at + ": a query key must not be empty");
  EXPECT_EQ(parse_error(query(R"({ state = { any = [] } })")),
            at + ".state.any: must not be empty");
  EXPECT_EQ(parse_error(query(R"({ state = { any = ["a", 1] } })")),
            at + ".state.any[1]: must be a string");
  EXPECT_EQ(parse_error(query(R"({ state = {} })")), at + ".state: needs any = [\"glob\", ...]");
  EXPECT_THAT(parse_error(query(R"({ state = { one = ["a"] } })")),
              StartsWith(at + ".state.one: unknown field (expected one of: any)"));
  EXPECT_EQ(parse_error(query(R"({ page = 2 })")),
            at + ".page: must be a glob string or { any = [\"glob\", ...] }");
  EXPECT_THAT(parse_error(query(R"("page=2")")), StartsWith(at + ": must be a table like"));
}

TEST(PolicyLayer7, FieldsThatExcludeOrNeedEachOther) {
  const std::string at = "policy.toml:4: network_policies.api.endpoints[0].";
  EXPECT_EQ(
      parse_error(layer7(
          R"(protocol = "rest", access = "read-only", rules = [ { allow = { method = "POST" } } ])")),
      at + "rules: access and rules exclude each other: give access (a preset) or rules, "
           "not both");
  const std::string needs =
      ": needs protocol = \"rest\" or \"websocket\" on this endpoint (without it the endpoint is "
      "layer 4: its requests are not read)";
  EXPECT_EQ(parse_error(layer7(R"(rules = [ { allow = { method = "GET" } } ])")),
            at + "rules" + needs);
  EXPECT_EQ(parse_error(layer7(R"(deny_rules = [ { deny = { method = "GET" } } ])")),
            at + "deny_rules" + needs);
  EXPECT_EQ(parse_error(layer7(R"(access = "read-only")")), at + "access" + needs);
  EXPECT_EQ(parse_error(layer7(R"(enforcement = "audit")")), at + "enforcement" + needs);
  EXPECT_EQ(parse_error(layer7(R"(allow_encoded_slash = false)")),
            at + "allow_encoded_slash" + needs);
  const std::string skip =
      ": cannot go with tls = \"skip\": the bytes are relayed unread, so there is no request to "
      "judge";
  EXPECT_EQ(parse_error(layer7(R"(protocol = "rest", tls = "skip", access = "read-only")")),
            at + "access" + skip);
  EXPECT_EQ(parse_error(layer7(
                R"(protocol = "rest", tls = "skip", rules = [ { allow = { method = "GET" } } ])")),
            at + "rules" + skip);
  EXPECT_EQ(
      parse_error(layer7(
          R"(protocol = "rest", tls = "skip", deny_rules = [ { deny = { method = "GET" } } ])")),
      at + "deny_rules" + skip);
}

TEST(PolicyLayer7, RoundTripsThroughToml) {
  Policy p = parse(kExample, "p.toml");
  Endpoint& e = p.network[0].endpoints[0];
  e.protocol = "rest";
  e.tls = "auto";
  e.enforcement = "audit";
  e.allow_encoded_slash = true;
  e.ca_file = "/etc/ssl/a \"quoted\" ca.pem";
  e.credentials_in = {"query", "body"};
  e.rules = {{"GET", "/repos/**", {{"per_page", "1*", {}}, {"state", "", {"open", "closed"}}}},
             {"*", "/user", {}},
             {"", "", {}}};
  e.deny_rules = {{"DELETE", "/**", {{"dotted.key", "x", {}}}}};
  Endpoint& short_one = p.network[0].endpoints[1];
  short_one.host = "x.io";
  short_one.protocol = "rest";
  short_one.deny_rules = {{"POST", "", {}}};
  std::string text = to_toml(p);
  EXPECT_EQ(parse(text, "again.toml"), p) << text;
  // A short endpoint stays on one line; a long one spans lines, a rule each.
  EXPECT_THAT(text, HasSubstr("  { host = \"x.io\", port = 443, protocol = \"rest\", "
                              "deny_rules = [{ deny = { method = \"POST\" } }] },\n"));
  EXPECT_THAT(text, HasSubstr(", rules = [\n      { allow = { method = \"GET\", path = "
                              "\"/repos/**\", query = { per_page = \"1*\", state = { any = "
                              "[\"open\", \"closed\"] } } } },\n"));
  EXPECT_THAT(text, HasSubstr("      { allow = {} },\n    ], deny_rules = [\n"));
  EXPECT_THAT(text, HasSubstr("query = { \"dotted.key\" = \"x\" }"));
}

TEST(PolicyLayer7, ReadFromYamlWithTheSameChecks) {
  Policy p = parse(R"(version: 1
network_policies:
  api:
    endpoints:
      - host: api.github.com
        port: 443
        protocol: rest
        enforcement: enforce
        rules:
          - allow:
              method: GET
              path: /repos/**
              query:
                state:
                  any: [open, closed]
                per_page: "1*"
        deny_rules:
          - deny: { method: DELETE, path: "/**" }
        allow_encoded_slash: true
)",
                   "p.yaml");
  const Endpoint& e = only_endpoint(p);
  EXPECT_EQ(e.protocol, "rest");
  EXPECT_EQ(e.enforcement, "enforce");
  ASSERT_EQ(e.rules.size(), 1u);
  EXPECT_EQ(
      e.rules[0],
      (HttpRule{"GET", "/repos/**", {{"per_page", "1*", {}}, {"state", "", {"open", "closed"}}}}));
  EXPECT_EQ(e.deny_rules.at(0), (HttpRule{"DELETE", "/**", {}}));
  EXPECT_TRUE(e.allow_encoded_slash);
  EXPECT_EQ(parse(to_toml(p), "again.toml"), p);
  EXPECT_EQ(error_of([] {
              parse(
                  "version: 1\nnetwork_policies:\n  api:\n    endpoints:\n      - host: a.com\n"
                  "        port: 443\n        access: read-only\n",
                  "p.yaml");
            }),
            "p.yaml:7: network_policies.api.endpoints[0].access: needs protocol = \"rest\" or "
            "\"websocket\" on this endpoint (without it the endpoint is layer 4: its requests are "
            "not read)");
  EXPECT_EQ(error_of([] {
              parse(
                  "version: 1\nnetwork_policies:\n  api:\n    endpoints:\n      - host: a.com\n"
                  "        port: 443\n        protocol: rest\n        rules:\n"
                  "          - allow: { path: nope }\n",
                  "p.yaml");
            }),
            "p.yaml:9: network_policies.api.endpoints[0].rules[0].allow.path: must start with "
            "'/' (like \"/repos/**\")");
}

}  // namespace
}  // namespace openshell::policy
