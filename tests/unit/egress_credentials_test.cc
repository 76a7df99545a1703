#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "egress/credentials.h"

namespace openshell::egress {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kSecret = "ghp_s3cr3t+v/al=ue";
const std::string kPlaceholder = "openshell:resolve:env:GITHUB_TOKEN";
// ':' as %3A, as a URL encoder writes it.
const std::string kEncodedPlaceholder = "openshell%3Aresolve%3Aenv%3AGITHUB_TOKEN";

Credentials github(bool in_query = false, bool in_body = false) {
  return Credentials({{"GITHUB_TOKEN",
                       kSecret,
                       {"api.github.com:443", "*.githubusercontent.com:443"},
                       in_query,
                       in_body},
                      {"OTHER_KEY", "other-secret-value", {"other.example:443"}, true, true}});
}

CredentialRequest request(std::string host, std::string target = "/") {
  CredentialRequest r;
  r.host = std::move(host);
  r.port = 443;
  r.method = "GET";
  r.target = std::move(target);
  r.headers = {{"Host", r.host}, {"Accept", "*/*"}};
  return r;
}

CredentialRequest with_body(CredentialRequest r, std::string type, std::string body) {
  r.method = "POST";
  r.content_type = type;
  r.headers.emplace_back("Content-Type", type);
  r.headers.emplace_back("Content-Length", std::to_string(body.size()));
  r.body = std::move(body);
  return r;
}

std::string header(const CredentialRequest& r, const std::string& name) {
  for (const auto& [n, v] : r.headers)
    if (n == name) return v;
  return "(absent)";
}

std::string b64(const std::string& text);  // below, with the test that needs it

// A refusal names the key and the place, never the value.
void expect_refused(const CredentialResult& result, const std::string& part) {
  ASSERT_TRUE(result.refused) << "not refused; expected: " << part;
  EXPECT_THAT(result.reason, HasSubstr(part));
  EXPECT_THAT(result.reason, Not(HasSubstr(kSecret)));
  EXPECT_THAT(result.reason, Not(HasSubstr("other-secret-value")));
  EXPECT_THAT(result.reason, Not(HasSubstr(b64(kSecret))));
}

TEST(EgressCredentials, FillsABearerHeaderForItsEndpoint) {
  auto r = request("api.github.com");
  r.headers.emplace_back("Authorization", "Bearer " + kPlaceholder);
  auto result = github().fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(header(result.request, "Authorization"), "Bearer " + kSecret);
  EXPECT_EQ(result.filled, std::vector<std::string>{"GITHUB_TOKEN"});
  EXPECT_EQ(header(result.request, "Accept"), "*/*");
}

TEST(EgressCredentials, FillsEveryHeaderAndAWildcardEndpoint) {
  auto r = request("raw.githubusercontent.com");
  r.headers.emplace_back("X-Token", kPlaceholder);
  r.headers.emplace_back("X-Two", "a=" + kPlaceholder + ",b=" + kPlaceholder);
  auto result = github().fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(header(result.request, "X-Token"), kSecret);
  EXPECT_EQ(header(result.request, "X-Two"), "a=" + kSecret + ",b=" + kSecret);
}

TEST(EgressCredentials, APercentEncodedPlaceholderInAHeaderGetsTheEncodedValue) {
  auto r = request("api.github.com");
  r.headers.emplace_back("Cookie", "t=" + kEncodedPlaceholder);
  auto result = github().fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(header(result.request, "Cookie"), "t=ghp_s3cr3t%2Bv%2Fal%3Due");
}

std::string b64(const std::string& text) {
  static const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 2 < text.size(); i += 3) {
    unsigned n =
        (unsigned char)text[i] << 16 | (unsigned char)text[i + 1] << 8 | (unsigned char)text[i + 2];
    for (int s = 18; s >= 0; s -= 6) out += alphabet[(n >> s) & 63];
  }
  if (i + 1 == text.size()) {
    unsigned n = (unsigned char)text[i] << 16;
    out += alphabet[(n >> 18) & 63];
    out += alphabet[(n >> 12) & 63];
    out += "==";
  } else if (i + 2 == text.size()) {
    unsigned n = (unsigned char)text[i] << 16 | (unsigned char)text[i + 1] << 8;
    out += alphabet[(n >> 18) & 63];
    out += alphabet[(n >> 12) & 63];
    out += alphabet[(n >> 6) & 63];
    out += "=";
  }
  return out;
}

TEST(EgressCredentials, FillsTheBasicPasswordDecodedAndEncodedAgain) {
  auto r = request("api.github.com");
  r.headers.emplace_back("Authorization", "Basic " + b64("x-access-token:" + kPlaceholder));
  auto result = github().fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(header(result.request, "Authorization"), "Basic " + b64("x-access-token:" + kSecret));
}

TEST(EgressCredentials, FillsTheQueryPercentEncodedWhenAllowed) {
  auto r =
      request("api.github.com", "/search?q=x&token=" + kPlaceholder + "&e=" + kEncodedPlaceholder);
  auto result = github(/*in_query=*/true).fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(result.request.target,
            "/search?q=x&token=ghp_s3cr3t%2Bv%2Fal%3Due&e=ghp_s3cr3t%2Bv%2Fal%3Due");
}

TEST(EgressCredentials, RefusesTheQueryWhenNotAllowed) {
  auto r = request("api.github.com", "/search?token=" + kPlaceholder);
  expect_refused(github().fill(r), "credential GITHUB_TOKEN in the query: it may not go");
}

TEST(EgressCredentials, FillsAJsonBodyEscapedAndFixesContentLength) {
  std::string body = R"({"token":")" + kPlaceholder + R"(","n":1})";
  auto r = with_body(request("api.github.com"), "application/json; charset=utf-8", body);
  Credentials quoted({{"K", "a\"b\\c", {"api.github.com:443"}, false, true}});
  auto plain = github(false, true).fill(r);
  ASSERT_FALSE(plain.refused) << plain.reason;
  EXPECT_EQ(plain.request.body, R"({"token":")" + kSecret + R"(","n":1})");
  EXPECT_EQ(header(plain.request, "Content-Length"), std::to_string(plain.request.body.size()));

  auto r2 = with_body(request("api.github.com"), "application/vnd.api+json",
                      R"({"t":"openshell:resolve:env:K"})");
  auto escaped = quoted.fill(r2);
  ASSERT_FALSE(escaped.refused) << escaped.reason;
  EXPECT_EQ(escaped.request.body, R"({"t":"a\"b\\c"})");
  EXPECT_EQ(header(escaped.request, "Content-Length"), std::to_string(escaped.request.body.size()));
}

TEST(EgressCredentials, FillsAFormBodyPercentEncoded) {
  auto r = with_body(request("api.github.com"), "application/x-www-form-urlencoded",
                     "grant=x&secret=" + kPlaceholder);
  r.headers.erase(r.headers.end() - 1);  // chunked: no Content-Length
  r.headers.emplace_back("Transfer-Encoding", "chunked");
  auto result = github(false, true).fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(result.request.body, "grant=x&secret=ghp_s3cr3t%2Bv%2Fal%3Due");
  EXPECT_EQ(header(result.request, "Content-Length"), std::to_string(result.request.body.size()));
  EXPECT_EQ(header(result.request, "Transfer-Encoding"), "(absent)");
}

TEST(EgressCredentials, TheBodysTypeIsTheHeadersWhenNotGiven) {
  auto r = with_body(request("api.github.com"), "application/x-www-form-urlencoded",
                     "secret=" + kPlaceholder);
  r.content_type.clear();
  auto result = github(false, true).fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(result.request.body, "secret=ghp_s3cr3t%2Bv%2Fal%3Due");
}

TEST(EgressCredentials, RefusesTheBodyWhenNotAllowedOrNotJsonNorForm) {
  auto json_body = with_body(request("api.github.com"), "application/json",
                             R"({"t":")" + kPlaceholder + R"("})");
  expect_refused(github().fill(json_body), "credential GITHUB_TOKEN in the body: it may not go");
  auto text_body = with_body(request("api.github.com"), "text/plain", kPlaceholder);
  expect_refused(github(false, true).fill(text_body), "only JSON and form bodies");
}

TEST(EgressCredentials, AJsonEscapedPlaceholderIsRefusedNotSentOn) {
  auto r = with_body(request("api.github.com"), "application/json",
                     R"({"t":"openshell\u003aresolve:env:GITHUB_TOKEN"})");
  expect_refused(github(false, true).fill(r), "cannot be filled in");
}

TEST(EgressCredentials, ALargeBodyIsNotRewrittenAndSaysSo) {
  std::string body =
      R"({"t":")" + kPlaceholder + R"(","pad":")" + std::string(kMaxRewrittenBody, 'a') + R"("})";
  auto result =
      github(false, true).fill(with_body(request("api.github.com"), "application/json", body));
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_TRUE(result.body_too_large);
  EXPECT_EQ(result.request.body, body);
}

TEST(EgressCredentials, ALargeBodyIsStillSearchedForAForeignSecret) {
  std::string body = std::string(kMaxRewrittenBody, 'a') + kSecret;
  auto r = with_body(request("evil.example"), "application/octet-stream", body);
  expect_refused(github().fill(r), "the secret of credential GITHUB_TOKEN in the body");
}

TEST(EgressCredentials, APlaceholderInThePathIsRefusedEvenForItsEndpoint) {
  auto r = request("api.github.com", "/repos/" + kPlaceholder + "/x");
  expect_refused(github(true, true).fill(r), "credential GITHUB_TOKEN in the path: paths end up");
  auto encoded = request("api.github.com", "/repos/" + kEncodedPlaceholder);
  expect_refused(github(true, true).fill(encoded), "in the path");
}

TEST(EgressCredentials, APlaceholderToAnotherHostIsRefusedWherever) {
  auto in_header = request("evil.example");
  in_header.headers.emplace_back("Authorization", "Bearer " + kPlaceholder);
  expect_refused(github().fill(in_header),
                 "credential GITHUB_TOKEN in header Authorization is not for evil.example:443");

  auto in_basic = request("evil.example");
  in_basic.headers.emplace_back("Authorization", "Basic " + b64("u:" + kPlaceholder));
  expect_refused(github().fill(in_basic), "in header Authorization is not for");

  expect_refused(github(true, true).fill(request("evil.example", "/" + kPlaceholder)),
                 "in the path is not for");
  expect_refused(github(true, true).fill(request("evil.example", "/?k=" + kEncodedPlaceholder)),
                 "in the query is not for");
  expect_refused(github(true, true)
                     .fill(with_body(request("evil.example"), "application/json",
                                     R"({"k":")" + kPlaceholder + R"("})")),
                 "in the body is not for");
  expect_refused(github(true, true)
                     .fill(with_body(request("evil.example"), "application/octet-stream",
                                     "blob " + kPlaceholder)),
                 "in the body is not for");
}

TEST(EgressCredentials, TheSamePortIsPartOfTheEndpoint) {
  auto r = request("api.github.com");
  r.port = 8443;
  r.headers.emplace_back("Authorization", "Bearer " + kPlaceholder);
  expect_refused(github().fill(r), "is not for api.github.com:8443");
}

// The exfiltration OpenShell's policies miss: an allowed host, the secret
// in its query.
TEST(EgressCredentials, TheQueryStringExfiltrationIsRefused) {
  auto creds = github(true, true);
  expect_refused(creds.fill(request("other.example", "/?k=" + kPlaceholder)),
                 "credential GITHUB_TOKEN in the query is not for other.example:443");
  expect_refused(creds.fill(request("other.example", "/?k=" + kSecret)),
                 "the secret of credential GITHUB_TOKEN in the query is not for other.example:443");
}

TEST(EgressCredentials, AForeignSecretIsFoundInEachEncoding) {
  auto creds = github();
  // percent-encoded, fully and in part, and with + for a space
  std::string full;
  for (unsigned char c : kSecret) {
    static const char* digits = "0123456789ABCDEF";
    full += '%';
    full += digits[c >> 4];
    full += digits[c & 15];
  }
  expect_refused(creds.fill(request("evil.example", "/?k=" + full)), "in the query");
  expect_refused(creds.fill(request("evil.example", "/?k=ghp_s3cr3t%2Bv%2fal%3Due")),
                 "in the query");
  Credentials spaced({{"K", "with a space", {"a.example:443"}, false, false}});
  expect_refused(spaced.fill(request("evil.example", "/?k=with+a+space")), "credential K");
  // base64, alone, inside "user:VALUE", and URL-safe
  for (std::string prefix : {"", "u", "us", "user:"}) {
    auto r = request("evil.example");
    r.headers.emplace_back("X-Data", b64(prefix + kSecret + "tail"));
    expect_refused(creds.fill(r), "the secret of credential GITHUB_TOKEN in header X-Data");
  }
  std::string url_safe = b64(kSecret);
  for (auto& c : url_safe) c = c == '+' ? '-' : c == '/' ? '_' : c;
  expect_refused(creds.fill(request("evil.example", "/?d=" + url_safe)), "in the query");
  // raw, in the path, a header's name, the body and the host name
  expect_refused(creds.fill(request("evil.example", "/x/" + kSecret)), "in the path");
  auto named = request("evil.example");
  named.headers.emplace_back("X-" + kSecret, "1");
  expect_refused(creds.fill(named), "the secret of credential GITHUB_TOKEN in a header's name");
  expect_refused(creds.fill(with_body(request("evil.example"), "application/json",
                                      R"({"a":"ghp_s3cr3t+v\/al=ue"})")),
                 "in the body");
  Credentials dotted({{"K", "abcd1234", {"a.example:443"}, false, false}});
  // The reason would quote the host name, and so the secret: it quotes neither.
  auto leaked = dotted.fill(request("abcd1234.evil.example"));
  expect_refused(leaked, "the secret of a credential is in a place its reason would show");
  EXPECT_THAT(leaked.reason, Not(HasSubstr("abcd1234")));
}

TEST(EgressCredentials, ASecretToItsOwnEndpointPasses) {
  auto r = request("api.github.com", "/?k=" + kSecret);
  r.headers.emplace_back("Authorization", "token " + kSecret);
  auto result = github().fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(result.request.target, r.target);
}

TEST(EgressCredentials, AnUnknownKeyIsRefused) {
  auto r = request("api.github.com");
  r.headers.emplace_back("Authorization", "Bearer openshell:resolve:env:GITHUB_TOKN");
  expect_refused(github().fill(r), "unknown credential GITHUB_TOKN in header Authorization");
  expect_refused(Credentials().fill(request("x.example", "/?a=" + kPlaceholder)),
                 "unknown credential GITHUB_TOKEN in the query");
}

TEST(EgressCredentials, AReasonNeverQuotesASecret) {
  // The sandbox names an unknown key after a secret it knows.
  Credentials creds({{"K", "ABCDEFGH", {"a.example:443"}, false, false}});
  auto r = request("a.example");
  r.headers.emplace_back("X", "openshell:resolve:env:ABCDEFGH");
  auto result = creds.fill(r);
  ASSERT_TRUE(result.refused);
  EXPECT_THAT(result.reason, Not(HasSubstr("ABCDEFGH")));
  EXPECT_THAT(result.reason, HasSubstr("the secret of a credential"));
}

TEST(EgressCredentials, ARequestWithoutPlaceholdersPassesUnchanged) {
  auto r = with_body(request("example.com", "/a?b=c"), "application/json", R"({"a":1})");
  auto result = github(true, true).fill(r);
  ASSERT_FALSE(result.refused) << result.reason;
  EXPECT_EQ(result.request.target, r.target);
  EXPECT_EQ(result.request.body, r.body);
  EXPECT_EQ(result.request.headers, r.headers);
  EXPECT_TRUE(result.filled.empty());
}

TEST(EgressCredentials, AValueWithALineBreakNeverGoesInAHeader) {
  Credentials creds({{"K", "line\r\nX-Injected: 1", {"a.example:443"}, false, false}});
  auto r = request("a.example");
  r.headers.emplace_back("Authorization", "Bearer openshell:resolve:env:K");
  auto result = creds.fill(r);
  ASSERT_TRUE(result.refused);
  EXPECT_THAT(result.reason, HasSubstr("credential K cannot go in header Authorization"));
  EXPECT_THAT(result.reason, Not(HasSubstr("Injected")));
}

// Rotation replaces the set whole: a request sees the old set or the new.
TEST(EgressCredentials, ARotatedSetFillsTheNewValue) {
  auto set = std::make_shared<const Credentials>(github());
  auto r = request("api.github.com");
  r.headers.emplace_back("Authorization", "Bearer " + kPlaceholder);
  std::shared_ptr<const Credentials> in_use = set;
  std::atomic_store(&set,
                    std::make_shared<const Credentials>(Credentials(
                        {{"GITHUB_TOKEN", "ghp_rotated", {"api.github.com:443"}, false, false}})));
  EXPECT_EQ(header(in_use->fill(r).request, "Authorization"), "Bearer " + kSecret);
  EXPECT_EQ(header(std::atomic_load(&set)->fill(r).request, "Authorization"), "Bearer ghp_rotated");
}

TEST(EgressCredentials, BadCredentialsAreRefusedWhenTheSetIsBuilt) {
  EXPECT_THROW(Credentials({{"1KEY", "v", {"a:1"}, false, false}}), Error);
  EXPECT_THROW(Credentials({{"K-EY", "v", {"a:1"}, false, false}}), Error);
  EXPECT_THROW(Credentials({{"K", "", {"a:1"}, false, false}}), Error);
  EXPECT_THROW(Credentials({{"K", "v", {"a"}, false, false}}), Error);
  EXPECT_THROW(Credentials({{"K", "v", {"a:0"}, false, false}}), Error);
  EXPECT_THROW(Credentials({{"K", "v", {"a:1"}, false, false}, {"K", "w", {"a:1"}, false, false}}),
               Error);
  try {
    Credentials({{"K", "the-secret", {"nohost"}, false, false}});
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), Not(HasSubstr("the-secret")));
  }
}

}  // namespace
}  // namespace openshell::egress
