#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "egress/ocsf.h"

namespace openshell::egress::ocsf {
namespace {

using json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

json connect_line(const char* decision, const char* reason, const char* rule = "") {
  return {{"time", "2026-12-01T12:00:01.250000000Z"},
          {"sandbox", "agent"},
          {"kind", "connect"},
          {"binary", "/usr/bin/curl"},
          {"pid", 7},
          {"host", "example.com"},
          {"port", 443},
          {"decision", decision},
          {"rule", rule},
          {"reason", reason}};
}

TEST(EgressOcsf, ADeniedConnectionIsABlockedNetworkActivity) {
  auto e = event(connect_line("deny", "no rule allows it"));
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["class_uid"], 4001);
  EXPECT_EQ((*e)["category_uid"], 4);
  EXPECT_EQ((*e)["activity_id"], 5);  // Refuse
  EXPECT_EQ((*e)["type_uid"], 400105);
  EXPECT_EQ((*e)["disposition_id"], 2);
  EXPECT_EQ((*e)["disposition"], "Blocked");
  EXPECT_EQ((*e)["action_id"], 2);
  EXPECT_EQ((*e)["severity_id"], 3);
  EXPECT_EQ((*e)["time"], 1796126401250);  // ms since the epoch
  EXPECT_EQ((*e)["status_detail"], "no rule allows it");
  EXPECT_EQ((*e)["metadata"]["product"]["name"], "openshell");
  EXPECT_EQ((*e)["metadata"]["product"]["version"], OPENSHELL_VERSION);
  EXPECT_EQ((*e)["metadata"]["version"], kSchemaVersion);
  EXPECT_EQ((*e)["actor"]["process"]["pid"], 7);
  EXPECT_EQ((*e)["actor"]["process"]["file"]["path"], "/usr/bin/curl");
  EXPECT_EQ((*e)["actor"]["process"]["name"], "curl");
  EXPECT_EQ((*e)["src_endpoint"]["name"], "agent");
  EXPECT_EQ((*e)["dst_endpoint"]["hostname"], "example.com");
  EXPECT_EQ((*e)["dst_endpoint"]["port"], 443);
  EXPECT_FALSE(e->contains("firewall_rule"));
}

TEST(EgressOcsf, AnAllowedConnectionNamesItsRuleAndAddress) {
  json line = connect_line("allow", "", "github");
  line["address"] = "192.0.2.1";
  auto e = event(line);
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["activity_id"], 1);  // Open
  EXPECT_EQ((*e)["disposition"], "Allowed");
  EXPECT_EQ((*e)["severity_id"], 1);
  EXPECT_EQ((*e)["firewall_rule"]["name"], "github");
  EXPECT_EQ((*e)["dst_endpoint"]["ip"], "192.0.2.1");
  EXPECT_FALSE(e->contains("status_detail"));
}

TEST(EgressOcsf, AnAuditModeDecisionIsLoggedAndLetThrough) {
  json line = connect_line("audit", "would deny: POST is read-only", "github");
  line["method"] = "POST";
  line["path"] = "/x";
  auto e = event(line);
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["disposition_id"], 17);
  EXPECT_EQ((*e)["disposition"], "Logged");
  EXPECT_EQ((*e)["action"], "Allowed");
  EXPECT_EQ((*e)["severity_id"], 2);
  auto other = event(connect_line("refused-later", ""));
  EXPECT_EQ((*other)["disposition_id"], 99);
  EXPECT_EQ((*other)["disposition"], "refused-later");
}

TEST(EgressOcsf, AConnectionClosedByANewPolicyIsAClose) {
  auto e = event(connect_line("closed", "policy revision 3: no rule allows it"));
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["activity_id"], 2);
  EXPECT_EQ((*e)["disposition"], "Blocked");
}

TEST(EgressOcsf, ARequestIsAnHttpActivityWithThePathOnly) {
  json line = connect_line("deny", "rule github: POST is read-only", "github");
  line["method"] = "POST";
  line["path"] = "/repos/x?token=hunter2&q=1";
  auto e = event(line);
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["class_uid"], 4002);
  EXPECT_EQ((*e)["activity_id"], 6);  // Post
  EXPECT_EQ((*e)["type_uid"], 400206);
  EXPECT_EQ((*e)["http_request"]["http_method"], "POST");
  EXPECT_EQ((*e)["http_request"]["url"]["path"], "/repos/x");
  EXPECT_EQ((*e)["http_request"]["url"]["hostname"], "example.com");
  EXPECT_THAT(e->dump(), Not(HasSubstr("hunter2")));
  line["method"] = "PROPFIND";
  EXPECT_EQ((*event(line))["activity_id"], 99);

  auto t = text(line);
  ASSERT_TRUE(t);
  EXPECT_THAT(*t, HasSubstr("PROPFIND /repos/x  rule github"));
  EXPECT_THAT(*t, Not(HasSubstr("hunter2")));
}

TEST(EgressOcsf, ADnsQueryIsADnsActivity) {
  json line = {{"time", "2026-12-01T12:00:02Z"},
               {"sandbox", "agent"},
               {"kind", "dns"},
               {"binary", ""},
               {"pid", 0},
               {"host", "example.com"},
               {"port", 0},
               {"qtype", "AAAA"},
               {"decision", "cached"},
               {"answers", 2},
               {"rule", ""},
               {"reason", ""}};
  auto e = event(line);
  ASSERT_TRUE(e);
  EXPECT_EQ((*e)["class_uid"], 4003);
  EXPECT_EQ((*e)["query"]["hostname"], "example.com");
  EXPECT_EQ((*e)["query"]["type"], "AAAA");
  EXPECT_EQ((*e)["disposition"], "Allowed");
  EXPECT_FALSE(e->contains("actor"));
  EXPECT_EQ(*text(line), "12:00:02 cached dns -> example.com AAAA");
}

TEST(EgressOcsf, TheTextLineSaysWhoWhereAndWhy) {
  EXPECT_EQ(*text(connect_line("deny", "no rule allows it")),
            "12:00:01 deny curl(pid 7) -> example.com:443  no rule allows it");
  EXPECT_EQ(*text(connect_line("allow", "", "github")),
            "12:00:01 allow curl(pid 7) -> example.com:443  rule github");
  json v6 = connect_line("deny", "x");
  v6["host"] = "2001:db8::1";
  v6["binary"] = "";
  EXPECT_EQ(*text(v6), "12:00:01 deny pid 7 -> [2001:db8::1]:443  x");
}

TEST(EgressOcsf, WhatIsNotAnAuditLineIsNoEvent) {
  EXPECT_FALSE(event(json::parse("[1,2]")));
  EXPECT_FALSE(event(json{{"kind", "connect"}}));
  EXPECT_FALSE(text(json("text")));
}

TEST(EgressOcsf, ConvertKeepsAnUnfinishedLineForTheNextChunk) {
  std::string a = connect_line("deny", "no rule allows it").dump() + "\n";
  std::string b = connect_line("allow", "", "github").dump() + "\n";
  std::string stream = a + b + "not json\n";
  std::string carry, out;
  for (size_t i = 0; i < stream.size(); i += 7)
    out += convert(std::string_view(stream).substr(i, 7), Format::kText, &carry);
  EXPECT_EQ(out,
            "12:00:01 deny curl(pid 7) -> example.com:443  no rule allows it\n"
            "12:00:01 allow curl(pid 7) -> example.com:443  rule github\n"
            "not json\n");
  EXPECT_TRUE(carry.empty());

  carry.clear();
  std::string ocsf = convert(a + b, Format::kOcsf, &carry);
  auto first = json::parse(ocsf.substr(0, ocsf.find('\n')));
  EXPECT_EQ(first["class_uid"], 4001);
  EXPECT_EQ(std::count(ocsf.begin(), ocsf.end(), '\n'), 2);
  EXPECT_EQ(convert(a, Format::kJson, &carry), a);
}

}  // namespace
}  // namespace openshell::egress::ocsf
