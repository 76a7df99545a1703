// The identity line of a guest's egress connection (egress/identity_line.h):
// what it credits, and that anything else credits no one.
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "egress/identity_line.h"

namespace openshell::egress {
namespace {

using ::testing::HasSubstr;

TEST(IdentityLine, TheThreeFieldsAreTheCaller) {
  std::string why;
  auto caller = parse_identity_line(R"({"pid":1234,"exe":"/usr/bin/curl","untrusted":""})", &why);
  ASSERT_TRUE(caller) << why;
  EXPECT_EQ(caller->pid, 1234);
  EXPECT_EQ(caller->exe, "/usr/bin/curl");
  EXPECT_EQ(caller->untrusted, "");
}

TEST(IdentityLine, AnUnknownCallerAndAnUntrustedOneAreLinesToo) {
  std::string why;
  auto unknown = parse_identity_line(R"({"untrusted":"","exe":"","pid":0})", &why);
  ASSERT_TRUE(unknown) << why;
  EXPECT_EQ(unknown->pid, 0);
  EXPECT_EQ(unknown->exe, "");
  auto untrusted = parse_identity_line(
      R"( {"pid":7, "exe":"/usr/bin/python3", "untrusted":"LD_PRELOAD in its environment"} )",
      &why);
  ASSERT_TRUE(untrusted) << why;
  EXPECT_EQ(untrusted->untrusted, "LD_PRELOAD in its environment");
}

TEST(IdentityLine, AnythingElseIsRefusedWithItsReason) {
  const std::pair<std::string, std::string> cases[] = {
      {"", "not JSON"},
      {"curl", "not JSON"},
      {R"(["/usr/bin/curl"])", "not a JSON object"},
      {R"({"pid":1,"exe":"/usr/bin/curl"})", "no \"untrusted\""},
      {R"({"exe":"/usr/bin/curl","untrusted":""})", "no \"pid\""},
      {R"({"pid":1,"exe":"/usr/bin/curl","untrusted":"","uid":0})", "an unknown key \"uid\""},
      {R"({"pid":1,"exe":"/usr/bin/wget","exe":"/usr/bin/curl","untrusted":""})",
       "a key given twice"},
      {R"({"pid":-1,"exe":"","untrusted":""})", "\"pid\" is not a whole number"},
      {R"({"pid":1.5,"exe":"","untrusted":""})", "\"pid\" is not a whole number"},
      {R"({"pid":"1","exe":"","untrusted":""})", "\"pid\" is not a whole number"},
      {R"({"pid":2147483648,"exe":"","untrusted":""})", "\"pid\" is not a whole number"},
      {R"({"pid":1,"exe":null,"untrusted":""})", "must be strings"},
      {R"({"pid":1,"exe":"/usr/bin/curl","untrusted":false})", "must be strings"},
      {R"({"pid":1,"exe":"curl","untrusted":""})", "\"exe\" is not absolute"},
      {R"({"pid":1,"exe":"/usr/bin/curl\u0000x","untrusted":""})", "a NUL in a string"},
      {"{\"pid\":1,\"exe\":\"/usr/bin/\xff\",\"untrusted\":\"\"}", "not JSON"},
      {R"({"pid":1,"exe":"/usr/bin/curl","untrusted":""} {})", "not JSON"},
      {R"({"pid":1,"exe":"/)" + std::string(4100, 'a') + R"(","untrusted":""})",
       "longer than 4095 bytes"},
  };
  for (const auto& [line, reason] : cases) {
    std::string why;
    EXPECT_EQ(parse_identity_line(line, &why), std::nullopt) << line;
    EXPECT_THAT(why, HasSubstr(reason)) << line;
  }
}

}  // namespace
}  // namespace openshell::egress
