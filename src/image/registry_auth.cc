// Registry authentication: the anonymous bearer-token flow.
#include <cerrno>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/text.h"
#include "image/registry_internal.h"

namespace openshell::image {
namespace registry_detail {

// The first Bearer challenge with a realm among the WWW-Authenticate values:
// Bearer realm="https://auth.example/token",service="x",scope="repository:a:pull".
std::optional<Challenge> bearer_challenge(const std::vector<std::string>& values) {
  for (const std::string& value : values) {
    std::string_view text = text::trim(value);
    if (text.size() < 7 || !iequals(text.substr(0, 6), "bearer") || text[6] != ' ') continue;
    text.remove_prefix(7);
    Challenge challenge;
    size_t i = 0;
    while (i < text.size()) {
      while (i < text.size() && (text[i] == ' ' || text[i] == ',' || text[i] == '\t')) ++i;
      size_t equals = text.find('=', i);
      if (equals == std::string_view::npos) break;
      std::string name = lower(text::trim(text.substr(i, equals - i)));
      i = equals + 1;
      std::string param;
      if (i < text.size() && text[i] == '"') {
        for (++i; i < text.size() && text[i] != '"'; ++i) {
          if (text[i] == '\\' && i + 1 < text.size()) ++i;
          param += text[i];
        }
        ++i;  // the closing quote
      } else {
        size_t end = text.find(',', i);
        if (end == std::string_view::npos) end = text.size();
        param = std::string(text::trim(text.substr(i, end - i)));
        i = end;
      }
      if (name == "realm") challenge.realm = param;
      if (name == "service") challenge.service = param;
      if (name == "scope") challenge.scope = param;
    }
    if (!challenge.realm.empty()) return challenge;
  }
  return std::nullopt;
}

}  // namespace registry_detail

using json = nlohmann::json;

// GET path on the registry: redirects followed, a bearer token fetched
// when the registry asks for one.
Reply RegistryClient::Impl::open(const std::string& path, const Fields& fields) {
  Url url = registry;
  url.target = path;
  for (int round = 0;; ++round) {
    Reply reply = follow(url, fields, true);
    if (reply.status != 401 || !reply.url.same_origin(registry)) return reply;
    std::vector<std::string> challenges = reply.all("www-authenticate");
    drain(reply);
    auto challenge = bearer_challenge(challenges);
    // A second 401 comes after a token fetched just now (the first may have
    // followed a cached token that expired).
    if (!challenge || round > 0)
      throw Fatal{"registry " + registry.host_port() +
                      " requires authentication; anonymous access was refused",
                  401};
    token = fetch_token(*challenge);
  }
}

Reply RegistryClient::Impl::send_to(const Url& url, const Fields& fields, const Send& send) {
  for (int round = 0;; ++round) {
    Fields sent = fields;
    if (!token.empty() && url.same_origin(registry))
      sent.emplace_back("Authorization", "Bearer " + token);
    Reply reply = exchange(url, sent, send);
    if (reply.status != 401 || !url.same_origin(registry)) return reply;
    std::vector<std::string> challenges = reply.all("www-authenticate");
    drain(reply);
    auto challenge = bearer_challenge(challenges);
    if (!challenge || round > 0)
      throw Fatal{"registry " + registry.host_port() +
                      " requires authentication; anonymous push was refused",
                  401};
    token = fetch_token(*challenge);
  }
}

std::string RegistryClient::Impl::fetch_token(const Challenge& challenge) {
  std::string from = "registry " + registry.host_port();
  auto url = parse_url(challenge.realm);
  if (!url) throw Fatal{from + " named an invalid token realm: " + printable(challenge.realm)};
  if (registry.https && !url->https && !options.insecure)
    throw Fatal{from + " named a token realm on plain HTTP (" + url->origin() + "); refused"};
  std::string scope =
      challenge.scope.empty() ? "repository:" + ref.repository + ":" + actions : challenge.scope;
  std::string query;
  if (!challenge.service.empty())
    query = "service=" + text::percent_encode(challenge.service) + "&";
  query += "scope=" + text::percent_encode(scope);
  url->target += (url->target.find('?') == std::string::npos ? "?" : "&") + query;

  Reply reply = follow(*url, {{"Accept", "application/json"}}, false);
  std::string who = "token server " + reply.url.host_port();
  if (reply.status != 200) status_failure(reply, who);
  std::string body;
  beast::error_code ec = read_body(reply, [&body](const char* data, size_t size) {
    if (body.size() + size > kMaxTokenBytes)
      throw Fatal{"the answer of the token server is larger than " +
                  text::format_bytes(kMaxTokenBytes)};
    body.append(data, size);
  });
  if (ec) throw Transient{"read the token from " + reply.url.host_port() + ": " + step_message(ec)};
  json doc = json::parse(body, nullptr, false);
  for (const char* key : {"token", "access_token"}) {
    if (doc.is_object() && doc.contains(key) && doc[key].is_string()) {
      std::string value = doc[key].get<std::string>();
      if (valid_token_text(value)) return value;
    }
  }
  throw Fatal{who + " answered without a usable token"};
}

}  // namespace openshell::image
