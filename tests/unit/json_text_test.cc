#include "base/json_text.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace openshell {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

TEST(JsonText, BytesThatAreNotUtf8BecomeTheReplacementCharacter) {
  json line = {{"host", "\xff\xfe.example"}, {"binary", std::string("/tmp/\xff", 6)}};
  EXPECT_THROW(line.dump(), json::type_error) << "what the plain dump() does";
  std::string text;
  ASSERT_NO_THROW(text = json_text(line));
  json back = json::parse(text);  // valid JSON, valid UTF-8
  EXPECT_EQ(back["host"], kReplacement + kReplacement + ".example");
  EXPECT_EQ(back["binary"], "/tmp/" + kReplacement);
  EXPECT_THAT(text, Not(HasSubstr("\xff")));
}

TEST(JsonText, TruncatedAndOverlongSequencesAndSurrogatesAreReplaced) {
  for (const std::string& bad :
       {std::string("\xC3"), std::string("\xE2\x82"), std::string("\xC0\xAF"),
        std::string("\xED\xA0\x80"), std::string("a\x80z"), std::string("\xF4\x90\x80\x80")}) {
    std::string text = json_text(json{{"s", bad}});
    json back;
    ASSERT_NO_THROW(back = json::parse(text)) << text;
    EXPECT_THAT(back["s"].get<std::string>(), HasSubstr(kReplacement)) << text;
  }
}

TEST(JsonText, ValidTextIsAsDumpWritesIt) {
  json value = {{"a", "caf\xC3\xA9"}, {"b", {1, 2}}, {"c", "line\nbreak\x01"}};
  EXPECT_EQ(json_text(value), value.dump());
  EXPECT_EQ(json_text(value, 2), value.dump(2));
  EXPECT_EQ(json_text(value).find('\n'), std::string::npos) << "one line";
}

TEST(JsonText, NestedValuesAreCovered) {
  json value = {{"outer", {{"inner", json::array({std::string("\xff")})}}}};
  EXPECT_NO_THROW(json::parse(json_text(value)));
  EXPECT_NO_THROW(json::parse(json_text(value, 2)));
}

TEST(Clip, ShortTextIsKeptLongTextIsCutWithItsLength) {
  EXPECT_EQ(clip("short", 10), "short");
  EXPECT_EQ(clip("0123456789", 10), "0123456789");
  std::string cut = clip(std::string(70000, 'a'), 256);
  EXPECT_LE(cut.size(), 256u);
  EXPECT_THAT(cut, HasSubstr("...(70000 bytes)"));
  EXPECT_EQ(cut.substr(0, 10), std::string(10, 'a'));
}

}  // namespace
}  // namespace openshell
