#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "../fuzz/http_rules_check.h"
#include "base/error.h"
#include "egress/http_rules.h"
#include "policy/policy.h"
#include "supervisor/http_rules.h"

namespace openshell::egress {
namespace {

HttpRules::Rule rule(std::string method, std::string path,
                     std::vector<HttpRules::QueryMatcher> query = {}) {
  return {std::move(method), std::move(path), std::move(query)};
}

HttpRules with_rules(std::vector<HttpRules::Rule> rules, std::vector<HttpRules::Rule> deny = {}) {
  HttpRules::Spec spec;
  spec.rules = std::move(rules);
  spec.deny_rules = std::move(deny);
  return HttpRules(spec);
}

HttpRules with_access(std::string access, std::vector<HttpRules::Rule> deny = {}) {
  HttpRules::Spec spec;
  spec.access = std::move(access);
  spec.deny_rules = std::move(deny);
  return HttpRules(spec);
}

bool allowed(const HttpRules& rules, std::string_view method, std::string_view target) {
  auto verdict = rules.judge(method, target);
  return verdict.allowed && !verdict.malformed;
}

// The normalized path, or "!reason" when refused.
std::string normalized(std::string_view path, bool allow_encoded_slash = false) {
  std::string out, reason;
  if (!normalize_http_path(path, allow_encoded_slash, &out, &reason)) return "!" + reason;
  return out;
}

TEST(EgressHttpRules, NoRulesAllowEveryRequest) {
  HttpRules rules;
  for (const char* method : {"GET", "POST", "DELETE", "PROPFIND"}) {
    auto verdict = rules.judge(method, "/a/b?x=1");
    EXPECT_TRUE(verdict.allowed) << method;
    EXPECT_FALSE(verdict.audit_only);
    EXPECT_EQ(verdict.rule, "");
    EXPECT_EQ(verdict.path, "/a/b");
  }
}

TEST(EgressHttpRules, ReadOnlyPreset) {
  auto rules = with_access("read-only");
  for (const char* method : {"GET", "HEAD", "OPTIONS"}) {
    auto verdict = rules.judge(method, "/repos");
    EXPECT_TRUE(verdict.allowed) << method;
    EXPECT_EQ(verdict.rule, "access read-only");
  }
  for (const char* method : {"POST", "PUT", "PATCH", "DELETE", "get"}) {
    auto verdict = rules.judge(method, "/repos");
    EXPECT_FALSE(verdict.allowed) << method;
    EXPECT_FALSE(verdict.malformed);
    EXPECT_EQ(verdict.rule, "access read-only");
    EXPECT_EQ(verdict.reason, "read-only access allows only GET, HEAD and OPTIONS");
  }
}

TEST(EgressHttpRules, ReadWritePreset) {
  auto rules = with_access("read-write");
  for (const char* method : {"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH"})
    EXPECT_TRUE(allowed(rules, method, "/x")) << method;
  for (const char* method : {"DELETE", "CONNECT", "TRACE"}) {
    auto verdict = rules.judge(method, "/x");
    EXPECT_FALSE(verdict.allowed) << method;
    EXPECT_EQ(verdict.rule, "access read-write");
  }
}

TEST(EgressHttpRules, FullPreset) {
  auto rules = with_access("full");
  for (const char* method : {"GET", "DELETE", "PROPFIND", "X-CUSTOM"})
    EXPECT_TRUE(allowed(rules, method, "/x")) << method;
}

TEST(EgressHttpRules, BadSpecsAreRefused) {
  HttpRules::Spec spec;
  spec.access = "write-only";
  EXPECT_THROW(HttpRules{spec}, Error);
  spec.access = "read-only";
  spec.rules.push_back(rule("GET", "/"));
  EXPECT_THROW(HttpRules{spec}, Error);
}

TEST(EgressHttpRules, AllowRulesNameTheOneThatMatched) {
  auto rules = with_rules({rule("GET", "/a"), rule("POST", "/b"), rule("*", "/c"), rule("", "")});
  EXPECT_EQ(rules.judge("GET", "/a").rule, "rules[0]");
  EXPECT_EQ(rules.judge("POST", "/b").rule, "rules[1]");
  EXPECT_EQ(rules.judge("DELETE", "/c").rule, "rules[2]");
  EXPECT_EQ(rules.judge("PUT", "/z").rule, "rules[3]");

  auto narrow = with_rules({rule("GET", "/a")});
  auto verdict = narrow.judge("POST", "/a");
  EXPECT_FALSE(verdict.allowed);
  EXPECT_EQ(verdict.rule, "rules");
  EXPECT_EQ(verdict.reason, "no allow rule matches");
  // Methods are case-sensitive for allow rules.
  EXPECT_FALSE(allowed(narrow, "get", "/a"));
}

TEST(EgressHttpRules, DenyWinsOverAllow) {
  auto rules = with_rules({rule("*", "/**")}, {rule("DELETE", "/repos/**")});
  EXPECT_TRUE(allowed(rules, "DELETE", "/issues/1"));
  EXPECT_TRUE(allowed(rules, "GET", "/repos/a/b"));
  auto verdict = rules.judge("DELETE", "/repos/a/b");
  EXPECT_FALSE(verdict.allowed);
  EXPECT_EQ(verdict.rule, "deny_rules[0]");
  EXPECT_EQ(verdict.reason, "a deny rule matches");
  // A deny rule's method matches in any case: a server folding case must
  // not serve "delete" past it.
  EXPECT_FALSE(rules.judge("delete", "/repos/a").allowed);
  // Deny rules apply over presets too, and with no allow side at all.
  auto preset = with_access("full", {rule("POST", "/admin")});
  EXPECT_FALSE(preset.judge("POST", "/admin").allowed);
  EXPECT_EQ(preset.judge("POST", "/admin").rule, "deny_rules[0]");
  EXPECT_TRUE(allowed(preset, "POST", "/other"));
  auto deny_only = with_rules({}, {rule("", "/secret")});
  EXPECT_FALSE(deny_only.judge("GET", "/secret").allowed);
  EXPECT_TRUE(allowed(deny_only, "GET", "/public"));
  // An encoded form of the denied path is the same path.
  EXPECT_FALSE(deny_only.judge("GET", "/%73ecret").allowed);
  EXPECT_FALSE(deny_only.judge("GET", "/x/../secret").allowed);
  EXPECT_FALSE(deny_only.judge("GET", "/./secret").allowed);
}

TEST(EgressHttpRules, AuditModeAllowsAndReportsWouldBeDenials) {
  HttpRules::Spec spec;
  spec.audit = true;
  spec.access = "read-only";
  spec.deny_rules.push_back(rule("GET", "/secret"));
  HttpRules rules(spec);
  auto post = rules.judge("POST", "/x");
  EXPECT_TRUE(post.allowed);
  EXPECT_TRUE(post.audit_only);
  EXPECT_EQ(post.rule, "access read-only");
  auto secret = rules.judge("GET", "/secret");
  EXPECT_TRUE(secret.allowed);
  EXPECT_TRUE(secret.audit_only);
  EXPECT_EQ(secret.rule, "deny_rules[0]");
  auto get = rules.judge("GET", "/x");
  EXPECT_TRUE(get.allowed);
  EXPECT_FALSE(get.audit_only);
  // Malformed requests are refused in audit mode too.
  auto bad = rules.judge("GET", "/../etc");
  EXPECT_FALSE(bad.allowed);
  EXPECT_TRUE(bad.malformed);
}

TEST(EgressHttpRules, SingleStarStaysWithinOneSegment) {
  auto rules = with_rules({rule("GET", "/repos/*/issues"), rule("GET", "/files/*.txt")});
  EXPECT_TRUE(allowed(rules, "GET", "/repos/openshell/issues"));
  EXPECT_TRUE(rules.judge("GET", "/repos//issues").malformed);
  EXPECT_FALSE(allowed(rules, "GET", "/repos/a/b/issues"));
  EXPECT_FALSE(allowed(rules, "GET", "/repos/a/issues/1"));
  EXPECT_TRUE(allowed(rules, "GET", "/files/a.txt"));
  EXPECT_TRUE(allowed(rules, "GET", "/files/.txt"));
  EXPECT_FALSE(allowed(rules, "GET", "/files/a/b.txt"));
  EXPECT_FALSE(allowed(rules, "GET", "/files/a.txt.gz"));
}

TEST(EgressHttpRules, DoubleStarSpansSegments) {
  auto rules = with_rules({rule("GET", "/a/**"), rule("GET", "/x/**/y"), rule("GET", "**/z")});
  for (const char* path : {"/a", "/a/", "/a/b", "/a/b/c/d"})
    EXPECT_TRUE(allowed(rules, "GET", path)) << path;
  EXPECT_FALSE(allowed(rules, "GET", "/ab"));
  EXPECT_FALSE(allowed(rules, "GET", "/b/a"));
  for (const char* path : {"/x/y", "/x/1/y", "/x/1/2/3/y"})
    EXPECT_TRUE(allowed(rules, "GET", path)) << path;
  EXPECT_FALSE(allowed(rules, "GET", "/x/1/y/2"));
  EXPECT_FALSE(allowed(rules, "GET", "/x/1y"));
  for (const char* path : {"/z", "/q/z", "/q/r/z"})
    EXPECT_TRUE(allowed(rules, "GET", path)) << path;
  EXPECT_FALSE(allowed(rules, "GET", "/q/zz"));
  // "**" inside a segment is "*".
  auto inner = with_rules({rule("GET", "/v**x")});
  EXPECT_TRUE(allowed(inner, "GET", "/v1x"));
  EXPECT_FALSE(allowed(inner, "GET", "/v1/x"));
}

TEST(EgressHttpRules, OtherCharactersAreLiteral) {
  auto rules = with_rules({rule("GET", "/a+b/[c]/d.e")});
  EXPECT_TRUE(allowed(rules, "GET", "/a+b/[c]/d.e"));
  EXPECT_FALSE(allowed(rules, "GET", "/aab/c/dxe"));
  // A reserved character and its escape are not one (RFC 3986).
  EXPECT_FALSE(allowed(rules, "GET", "/a%2Bb/[c]/d.e"));
  // Escapes in a glob are read as paths are.
  auto tilde = with_rules({rule("GET", "/%7euser/%3a")});
  EXPECT_TRUE(allowed(tilde, "GET", "/~user/%3A"));
  EXPECT_TRUE(allowed(tilde, "GET", "/%7Euser/%3a"));
  EXPECT_FALSE(allowed(tilde, "GET", "/~user/:"));
}

TEST(EgressHttpRules, ManyStarsOnALongPathStayFast) {
  // A backtracking matcher takes exponential time here.
  std::string glob;
  for (int i = 0; i < 40; ++i) glob += "*a";
  glob += "b";
  std::string path = "/" + std::string(20000, 'a');
  auto segment = with_rules({rule("GET", "/" + glob), rule("GET", "/**/" + glob + "/**")});
  auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(allowed(segment, "GET", path));
  EXPECT_TRUE(allowed(segment, "GET", path + "b"));
  std::string query_glob;
  for (int i = 0; i < 40; ++i) query_glob += "*a";
  auto query = with_rules({rule("GET", "/", {{"q", {query_glob + "b"}}})});
  EXPECT_FALSE(allowed(query, "GET", "/?q=" + std::string(20000, 'a')));
  auto took = std::chrono::steady_clock::now() - start;
  EXPECT_LT(took, std::chrono::seconds(2));
}

TEST(EgressHttpRules, QueryMatchers) {
  auto rules = with_rules({rule("GET", "/search", {{"q", {"open*"}}, {"page", {"1", "2"}}})});
  EXPECT_TRUE(allowed(rules, "GET", "/search?q=openshell&page=1"));
  EXPECT_TRUE(allowed(rules, "GET", "/search?page=2&q=open&other=free"));
  // Decoded: %xx and '+' as a space.
  EXPECT_TRUE(allowed(rules, "GET", "/search?%71=open+shell&page=%31"));
  EXPECT_FALSE(allowed(rules, "GET", "/search?q=closed&page=1"));
  EXPECT_FALSE(allowed(rules, "GET", "/search?q=open&page=3"));
  // An absent key: the rule does not match.
  EXPECT_FALSE(allowed(rules, "GET", "/search?q=open"));
  EXPECT_FALSE(allowed(rules, "GET", "/search"));
  // Every value of a key must match.
  EXPECT_FALSE(allowed(rules, "GET", "/search?q=open&page=1&q=secret"));
  EXPECT_TRUE(allowed(rules, "GET", "/search?q=open&page=1&q=opener"));
  // A key without '=' has the empty value.
  EXPECT_FALSE(allowed(rules, "GET", "/search?q&page=1"));
  auto empty_ok = with_rules({rule("GET", "/", {{"flag", {""}}})});
  EXPECT_TRUE(allowed(empty_ok, "GET", "/?flag"));
  EXPECT_TRUE(allowed(empty_ok, "GET", "/?flag=&&x=1"));
}

TEST(EgressHttpRules, DenyQueryMatcherNeedsOneValue) {
  auto rules = with_rules({}, {rule("GET", "/api", {{"debug", {"1", "true"}}})});
  EXPECT_TRUE(allowed(rules, "GET", "/api"));
  EXPECT_TRUE(allowed(rules, "GET", "/api?debug=0"));
  EXPECT_FALSE(rules.judge("GET", "/api?debug=1").allowed);
  // A harmless second value does not hide the denied one.
  EXPECT_FALSE(rules.judge("GET", "/api?debug=0&debug=true").allowed);
  EXPECT_FALSE(rules.judge("GET", "/api?de%62ug=%31").allowed);
}

TEST(EgressHttpRules, NormalizationDecodesUnreservedOnly) {
  EXPECT_EQ(normalized("/"), "/");
  EXPECT_EQ(normalized("/a/b"), "/a/b");
  EXPECT_EQ(normalized("/%61%2D%2e%5F%7e%30"), "/a-._~0");
  EXPECT_EQ(normalized("/a%20b"), "/a%20b");
  EXPECT_EQ(normalized("/a%3ab%3F"), "/a%3Ab%3F");
  EXPECT_EQ(normalized("/caf\xc3\xa9"), "/caf\xc3\xa9");
}

TEST(EgressHttpRules, NormalizationResolvesDotSegments) {
  EXPECT_EQ(normalized("/a/./b"), "/a/b");
  EXPECT_EQ(normalized("/a/../b"), "/b");
  EXPECT_EQ(normalized("/a/b/.."), "/a/");
  EXPECT_EQ(normalized("/a/."), "/a/");
  EXPECT_EQ(normalized("/a/b/../../c/"), "/c/");
  EXPECT_EQ(normalized("/a/%2E%2E/b"), "/b");
  EXPECT_EQ(normalized("/a/.%2e"), "/");
  EXPECT_EQ(normalized("/a/..."), "/a/...");
  EXPECT_EQ(normalized("/a/..b"), "/a/..b");
  EXPECT_EQ(normalized("/.."), "!the path climbs above /");
  EXPECT_EQ(normalized("/a/../.."), "!the path climbs above /");
  EXPECT_EQ(normalized("/%2e%2e/etc"), "!the path climbs above /");
}

TEST(EgressHttpRules, NormalizationRefusals) {
  EXPECT_EQ(normalized("//a"), "!the path holds an empty segment (//)");
  EXPECT_EQ(normalized("/a//b"), "!the path holds an empty segment (//)");
  EXPECT_EQ(normalized("/a/"), "/a/");  // a trailing slash is not an empty segment
  EXPECT_EQ(normalized("/a%"), "!the path holds an invalid percent-encoding");
  EXPECT_EQ(normalized("/a%4"), "!the path holds an invalid percent-encoding");
  EXPECT_EQ(normalized("/a%zz"), "!the path holds an invalid percent-encoding");
  EXPECT_EQ(normalized("/a%2Fb"),
            "!the path holds an encoded slash (%2F) and the endpoint does not allow_encoded_slash");
  EXPECT_EQ(normalized("/a%2fb", true), "/a%2Fb");
  EXPECT_EQ(normalized("/a/..%2F..", true), "/a/..%2F..");
  EXPECT_EQ(normalized(std::string_view("/a\0b", 4)), "!the path holds a NUL byte");
  EXPECT_EQ(normalized("/a%00"), "!the path holds an encoded NUL byte (%00)");
  EXPECT_EQ(normalized("/a\tb"), "!the path holds a control byte or a space");
  EXPECT_EQ(normalized("/a b"), "!the path holds a control byte or a space");
  EXPECT_EQ(normalized("/a%0Ab"), "!the path holds an encoded control byte");
  EXPECT_EQ(normalized("/a%7f"), "!the path holds an encoded control byte");
  EXPECT_EQ(normalized("/a#b"), "!the path holds a fragment (#)");
  EXPECT_EQ(normalized("a/b"), "!the path does not begin with /");
}

TEST(EgressHttpRules, MalformedRequestsAreNotDenials) {
  HttpRules rules;
  auto slash = rules.judge("GET", "/a%2Fb");
  EXPECT_TRUE(slash.malformed);
  EXPECT_FALSE(slash.allowed);
  EXPECT_EQ(slash.rule, "");
  EXPECT_EQ(slash.path, "");
  EXPECT_TRUE(rules.judge("GET", "http://x/a").malformed);
  EXPECT_TRUE(rules.judge("OPTIONS", "*").malformed);
  EXPECT_TRUE(rules.judge("GET", "").malformed);
  EXPECT_TRUE(rules.judge("GE T", "/").malformed);
  EXPECT_TRUE(rules.judge("", "/").malformed);
  EXPECT_EQ(rules.judge("GET", "/?q=%zz").reason, "the query holds an invalid percent-encoding");
  EXPECT_TRUE(rules.judge("GET", "/?q=a#b").malformed);
  EXPECT_TRUE(rules.judge("GET", "/?q=a\rb").malformed);
  HttpRules::Spec spec;
  spec.allow_encoded_slash = true;
  spec.rules.push_back(rule("GET", "/pkg/*"));
  HttpRules encoded(spec);
  // The encoded slash stays inside its segment.
  EXPECT_TRUE(allowed(encoded, "GET", "/pkg/a%2Fb"));
  EXPECT_FALSE(allowed(encoded, "GET", "/pkg/a/b"));
}

TEST(EgressHttpRules, DenialBody) {
  auto rules = with_access("read-only");
  auto verdict = rules.judge("POST", "/repos/x/../y?token=SECRETVALUE");
  std::string text = http_denial_body(verdict, "dev", "api.github.com", 443, "POST");
  EXPECT_EQ(text.find('\n'), std::string::npos);
  EXPECT_EQ(text.find("SECRETVALUE"), std::string::npos);
  EXPECT_EQ(text.find("token"), std::string::npos);
  auto body = nlohmann::json::parse(text);
  EXPECT_EQ(body["error"], "policy_denied");
  EXPECT_EQ(body["rule"], "access read-only");
  EXPECT_EQ(body["reason"], "read-only access allows only GET, HEAD and OPTIONS");
  EXPECT_EQ(body["host"], "api.github.com");
  EXPECT_EQ(body["port"], 443);
  EXPECT_EQ(body["method"], "POST");
  EXPECT_EQ(body["path"], "/repos/y");
  EXPECT_EQ(body["hint"],
            "openshell policy update dev --add-allow api.github.com:443:POST:/repos/y");
  EXPECT_EQ(text.rfind("{\"error\":\"policy_denied\",\"rule\":", 0), 0u);
  auto unnamed = nlohmann::json::parse(http_denial_body(verdict, "", "h", 80, "POST"));
  EXPECT_EQ(unnamed["hint"], "openshell policy update SANDBOX --add-allow h:80:POST:/repos/y");
}

TEST(EgressHttpRules, MalformedBody) {
  HttpRules rules;
  auto verdict = rules.judge("GET", "/../x?secret=VALUE");
  std::string text = http_malformed_body(verdict, "example.com", 8443, "GET");
  EXPECT_EQ(text.find("VALUE"), std::string::npos);
  auto body = nlohmann::json::parse(text);
  EXPECT_EQ(body["error"], "malformed_request");
  EXPECT_EQ(body["reason"], "the path climbs above /");
  EXPECT_EQ(body["host"], "example.com");
  EXPECT_EQ(body["port"], 8443);
  EXPECT_EQ(body["method"], "GET");
  EXPECT_FALSE(body.contains("path"));
}

TEST(EgressHttpRules, FromAPolicyEndpoint) {
  policy::Endpoint endpoint;
  endpoint.host = "api.github.com";
  endpoint.ports = {443};
  endpoint.protocol = "rest";
  endpoint.enforcement = "audit";
  endpoint.rules.push_back({"GET", "/repos/**", {{"state", "", {"open", "closed"}}}});
  endpoint.rules.push_back({"POST", "/repos/*/issues", {{"label", "bug*", {}}}});
  endpoint.deny_rules.push_back({"GET", "/repos/*/secrets/**", {}});
  endpoint.allow_encoded_slash = true;
  auto spec = supervisor::http_rules_spec(endpoint);
  EXPECT_TRUE(spec.audit);
  EXPECT_TRUE(spec.allow_encoded_slash);
  ASSERT_EQ(spec.rules.size(), 2u);
  EXPECT_EQ(spec.rules[0].query[0].globs, (std::vector<std::string>{"open", "closed"}));
  EXPECT_EQ(spec.rules[1].query[0].globs, (std::vector<std::string>{"bug*"}));
  endpoint.enforcement = "enforce";
  auto rules = supervisor::http_rules(endpoint);
  EXPECT_EQ(rules.judge("GET", "/repos/a/b?state=open").rule, "rules[0]");
  EXPECT_FALSE(rules.judge("GET", "/repos/a/b?state=all").allowed);
  EXPECT_EQ(rules.judge("POST", "/repos/a/issues?label=bugfix").rule, "rules[1]");
  EXPECT_EQ(rules.judge("GET", "/repos/a/secrets/k?state=open").rule, "deny_rules[0]");
  EXPECT_TRUE(rules.judge("GET", "/repos/a%2Fb?state=open").allowed);
}

// The fuzz target's properties, over its committed corpus, on every build.
TEST(EgressHttpRulesCorpus, EveryInputKeepsTheRulesProperties) {
  namespace fs = std::filesystem;
  int count = 0;
  for (const auto& entry : fs::directory_iterator(OSH_HTTP_RULES_CORPUS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(fuzz::http_rules_violation(data), "") << entry.path();
    ++count;
  }
  EXPECT_GE(count, 15) << "the corpus at " OSH_HTTP_RULES_CORPUS " is missing";
}

// The properties can fail: a path that is not canonical is caught.
TEST(EgressHttpRulesCorpus, TheCheckFindsANonCanonicalPath) {
  EXPECT_NE(fuzz::normalized_path_violation("/a//b", false), "");
  EXPECT_NE(fuzz::normalized_path_violation("/a/../b", false), "");
  EXPECT_NE(fuzz::normalized_path_violation("/%61", false), "");
  EXPECT_NE(fuzz::normalized_path_violation("/a%2fb", true), "");
  EXPECT_NE(fuzz::normalized_path_violation("/a%2Fb", false), "");
  EXPECT_EQ(fuzz::normalized_path_violation("/a%2Fb", true), "");
  EXPECT_EQ(fuzz::normalized_path_violation("/a/b/", false), "");
}

}  // namespace
}  // namespace openshell::egress
