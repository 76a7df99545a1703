#include "egress/credentials.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <string_view>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include "base/error.h"
#include "base/text.h"
#include "egress/rules.h"

namespace openshell::egress {

namespace {

using json = nlohmann::json;

// Values shorter than this are not searched for: they would be found in
// any request (and are no secret worth the name).
constexpr size_t kMinSearchedValue = 4;
// The shortest base64 run that counts as a value's trace.
constexpr size_t kMinBase64Trace = 6;
// A header name quoted in a reason is clipped: the sandbox chooses it.
constexpr size_t kMaxQuotedName = 64;

bool key_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte at text[i] and how many characters spell it: a percent escape
// counts as its byte when `escapes`.
bool byte_at(std::string_view text, size_t i, bool escapes, char* byte, size_t* size) {
  if (i >= text.size()) return false;
  if (escapes && text[i] == '%' && i + 2 < text.size()) {
    int hi = hex_digit(text[i + 1]), lo = hex_digit(text[i + 2]);
    if (hi >= 0 && lo >= 0) {
      *byte = static_cast<char>(hi * 16 + lo);
      *size = 3;
      return true;
    }
  }
  *byte = text[i];
  *size = 1;
  return true;
}

// A placeholder as written: [begin, end) of the text, its key, and
// whether some of it was percent-encoded.
struct Placeholder {
  size_t begin = 0, end = 0;
  std::string key;
  bool escaped = false;
};

std::vector<Placeholder> find_placeholders(std::string_view text, bool escapes) {
  const std::string_view prefix = kPlaceholderPrefix;
  std::vector<Placeholder> found;
  size_t i = 0;
  while (i < text.size()) {
    Placeholder p{i, i, {}, false};
    size_t j = i, matched = 0;
    char byte;
    size_t size;
    while (matched < prefix.size() && byte_at(text, j, escapes, &byte, &size) &&
           byte == prefix[matched]) {
      p.escaped = p.escaped || size > 1;
      j += size;
      ++matched;
    }
    if (matched == prefix.size()) {
      while (byte_at(text, j, escapes, &byte, &size) && key_char(byte)) {
        p.key += byte;
        p.escaped = p.escaped || size > 1;
        j += size;
      }
      if (!p.key.empty()) {
        p.end = j;
        found.push_back(std::move(p));
        i = j;
        continue;
      }
    }
    ++i;
  }
  return found;
}

// Percent escapes decoded where they are well formed, the rest as it is;
// `plus` reads "+" as a space too (a query, a form).
std::string lenient_decode(std::string_view text, bool plus) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char byte;
    size_t size;
    byte_at(text, i, true, &byte, &size);
    out += plus && size == 1 && byte == '+' ? ' ' : byte;
    i += size;
  }
  return out;
}

std::string base64(std::string_view data) {
  std::string out(4 * ((data.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(data.data()),
                          static_cast<int>(data.size()));
  out.resize(n < 0 ? 0 : static_cast<size_t>(n));
  return out;
}

std::optional<std::string> unbase64(std::string_view text) {
  std::string s(text);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.pop_back();
  std::replace(s.begin(), s.end(), '-', '+');
  std::replace(s.begin(), s.end(), '_', '/');
  while (s.size() % 4 != 0) s += '=';
  if (s.empty()) return std::string();
  std::string out(3 * s.size() / 4 + 1, '\0');
  int n =
      EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                      reinterpret_cast<const unsigned char*>(s.data()), static_cast<int>(s.size()));
  if (n < 0) return std::nullopt;
  size_t size = static_cast<size_t>(n);
  // EVP_DecodeBlock counts the padding's bytes as data.
  for (size_t i = s.size(); i > 0 && s[i - 1] == '='; --i) --size;
  out.resize(size);
  return out;
}

// The base64 characters of a value that do not depend on the bytes around
// it, for each of the three alignments it may have inside a longer text
// ("user:VALUE" encoded as one): both alphabets.
std::vector<std::string> base64_traces(const std::string& value) {
  std::vector<std::string> traces;
  for (size_t shift = 0; shift < 3; ++shift) {
    std::string encoded = base64(std::string(shift, '\0') + value);
    size_t begin = (8 * shift + 5) / 6;
    size_t end = 8 * (shift + value.size()) / 6;
    if (end <= begin || end - begin < kMinBase64Trace) continue;
    std::string trace = encoded.substr(begin, end - begin);
    traces.push_back(trace);
    std::replace(trace.begin(), trace.end(), '+', '-');
    std::replace(trace.begin(), trace.end(), '/', '_');
    if (trace != traces.back()) traces.push_back(trace);
  }
  return traces;
}

std::string media_type(std::string_view content_type) {
  std::string type = text::lower(content_type.substr(0, content_type.find(';')));
  while (!type.empty() && (type.back() == ' ' || type.back() == '\t')) type.pop_back();
  while (!type.empty() && (type.front() == ' ' || type.front() == '\t')) type.erase(0, 1);
  return type;
}

bool is_json(const std::string& type) {
  return type == "application/json" ||
         (type.size() > 5 && type.compare(type.size() - 5, 5, "+json") == 0);
}

bool is_form(const std::string& type) { return type == "application/x-www-form-urlencoded"; }

// Every string of a JSON document (keys too), one a line: what the
// server reads once the escapes are undone.
void json_strings(const json& value, std::string* out) {
  if (value.is_string()) {
    *out += value.get_ref<const std::string&>();
    *out += '\n';
  } else if (value.is_object()) {
    for (const auto& [key, item] : value.items()) {
      *out += key;
      *out += '\n';
      json_strings(item, out);
    }
  } else if (value.is_array()) {
    for (const auto& item : value) json_strings(item, out);
  }
}

// "Basic xxx" -> "xxx", or nullopt for another scheme.
std::optional<std::string_view> basic_token(std::string_view value) {
  while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) value.remove_prefix(1);
  if (value.size() < 6 || !text::iequals(value.substr(0, 6), "basic ")) return std::nullopt;
  value.remove_prefix(6);
  while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  return value;
}

std::string quoted_name(std::string_view name) {
  return std::string(name.substr(0, std::min(name.size(), kMaxQuotedName)));
}

}  // namespace

Credentials::Credentials(std::vector<Credential> credentials) {
  std::set<std::string> keys;
  for (auto& c : credentials) {
    if (c.key.empty() || (c.key[0] >= '0' && c.key[0] <= '9') ||
        !std::all_of(c.key.begin(), c.key.end(), key_char))
      throw Error("credential " + quoted_name(c.key) +
                  ": a key is letters, digits and _, not starting with a digit");
    if (!keys.insert(c.key).second) throw Error("credential " + c.key + ": named twice");
    if (c.value.empty()) throw Error("credential " + c.key + ": the value is empty");
    Entry entry;
    for (const auto& endpoint : c.endpoints) {
      auto colon = endpoint.rfind(':');
      std::string host = colon == std::string::npos ? "" : endpoint.substr(0, colon);
      if (host.size() > 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
      auto port = colon == std::string::npos
                      ? std::nullopt
                      : text::parse_uint(std::string_view(endpoint).substr(colon + 1), 65535);
      if (host.empty() || !port || *port == 0)
        throw Error("credential " + c.key + ": endpoint " + endpoint + " is not HOST:PORT");
      entry.endpoints.push_back({text::lower(host), static_cast<uint16_t>(*port)});
    }
    if (c.value.size() >= kMinSearchedValue) {
      entry.forms.push_back(c.value);
      for (auto& trace : base64_traces(c.value)) entry.forms.push_back(std::move(trace));
    }
    entry.credential = std::move(c);
    entries_.push_back(std::move(entry));
  }
}

// One fill: the request's places, searched and rewritten in turn.
struct CredentialFill {
  const std::vector<Credentials::Entry>& entries;
  CredentialRequest& request;
  CredentialResult result;

  const Credentials::Entry* find(const std::string& key) const {
    for (const auto& e : entries)
      if (e.credential.key == key) return &e;
    return nullptr;
  }

  bool bound(const Credentials::Entry& e) const {
    for (const auto& endpoint : e.endpoints)
      if (endpoint.port == request.port && host_matches(endpoint.host, request.host)) return true;
    return false;
  }

  std::string destination() const { return request.host + ":" + std::to_string(request.port); }

  // Always true (refused). The first refusal wins; a reason that would
  // quote a secret in any of its forms (the sandbox chose a header's name,
  // an unknown key or the host name to hold one) is replaced by one that
  // quotes nothing.
  bool refuse(std::string reason) {
    if (result.refused) return true;
    const std::string decoded = lenient_decode(reason, true);
    for (const auto& e : entries) {
      bool quoted = false;
      for (const auto& form : e.forms)
        quoted = quoted || reason.find(form) != std::string::npos ||
                 decoded.find(form) != std::string::npos;
      if (quoted) {
        reason = "the secret of a credential is in a place its reason would show";
        break;
      }
    }
    result.refused = true;
    result.reason = std::move(reason);
    return true;
  }

  // A secret of a credential not bound here, in any form, in a view of a place.
  bool holds_foreign_value(std::string_view view, const std::string& place) {
    std::string decoded = lenient_decode(view, false), decoded_plus = lenient_decode(view, true);
    for (const auto& e : entries) {
      if (e.forms.empty() || bound(e)) continue;
      bool found = decoded.find(e.credential.value) != std::string::npos ||
                   decoded_plus.find(e.credential.value) != std::string::npos;
      for (size_t i = 0; !found && i < e.forms.size(); ++i)
        found = view.find(e.forms[i]) != std::string_view::npos;
      if (found)
        return refuse("the secret of credential " + e.credential.key + " in " + place +
                      " is not for " + destination());
    }
    return false;
  }

  // The placeholders of a view of a place; `fillable` says whether a bound
  // credential's placeholder may be filled in there ("" when it may), and
  // says why not otherwise.
  bool check_placeholders(std::string_view view, const std::string& place,
                          const std::function<std::string(const Credentials::Entry&)>& fillable) {
    for (const auto& p : find_placeholders(view, true)) {
      const Credentials::Entry* e = find(p.key);
      if (!e)
        return refuse("unknown credential " + quoted_name(p.key) + " in " + place +
                      " (no provider of this sandbox has it)");
      if (!bound(*e))
        return refuse("credential " + p.key + " in " + place + " is not for " + destination());
      std::string why = fillable(*e);
      if (!why.empty()) return refuse("credential " + p.key + " in " + place + ": " + why);
    }
    return false;
  }

  bool check(std::string_view view, const std::string& place,
             const std::function<std::string(const Credentials::Entry&)>& fillable) {
    return check_placeholders(view, place, fillable) || holds_foreign_value(view, place);
  }

  void note_filled(const std::string& key) {
    if (std::find(result.filled.begin(), result.filled.end(), key) == result.filled.end())
      result.filled.push_back(key);
  }

  // The text with its placeholders (all of bound credentials: checked
  // before) replaced, each by what `encode` makes of the value.
  std::string replace(std::string_view text, bool escapes,
                      const std::function<std::optional<std::string>(const Credentials::Entry&,
                                                                     const Placeholder&)>& encode) {
    std::string out;
    size_t at = 0;
    for (const auto& p : find_placeholders(text, escapes)) {
      const Credentials::Entry* e = find(p.key);
      if (!e) continue;
      auto value = encode(*e, p);
      if (!value) return std::string(text);
      out.append(text.substr(at, p.begin - at));
      out += *value;
      at = p.end;
      note_filled(p.key);
    }
    out.append(text.substr(at));
    return out;
  }

  void run() {
    const std::string dest = destination();
    std::string_view content_type = request.content_type;
    for (const auto& [name, value] : request.headers)
      if (content_type.empty() && text::iequals(name, "content-type")) content_type = value;
    const std::string type = media_type(content_type);
    const bool body_fillable_type = is_json(type) || is_form(type);
    result.body_too_large = request.body.size() > kMaxRewrittenBody;
    auto nowhere = [](const Credentials::Entry&) { return std::string("not filled in here"); };
    auto anywhere = [](const Credentials::Entry&) { return std::string(); };

    std::string_view target = request.target;
    auto question = target.find('?');
    std::string path(target.substr(0, question));
    std::string query(question == std::string_view::npos ? "" : target.substr(question + 1));

    std::string body_view = request.body;
    if (is_json(type)) {
      json parsed = json::parse(request.body, nullptr, false);
      if (!parsed.is_discarded()) {
        body_view += '\n';
        json_strings(parsed, &body_view);
      }
    }

    // What may not leave, wherever it is.
    if (check(request.host, "the host name", nowhere)) return;
    for (const auto& [name, value] : request.headers) {
      if (check(name, "a header's name", nowhere)) return;
      std::string place = "header " + quoted_name(name);
      std::string view = value;
      if (auto token = basic_token(value))
        if (auto decoded = unbase64(*token)) view += "\n" + *decoded;
      if (check(view, place, anywhere)) return;
    }
    if (check(path, "the path", [](const Credentials::Entry&) {
          return std::string("paths end up in logs; send it in a header");
        }))
      return;
    if (check(query, "the query", [&](const Credentials::Entry& e) {
          return e.credential.in_query ? std::string() : "it may not go in the query of " + dest;
        }))
      return;
    if (check(body_view, "the body", [&](const Credentials::Entry& e) {
          if (!e.credential.in_body) return "it may not go in the body of a request to " + dest;
          if (!body_fillable_type && !result.body_too_large)
            return std::string("only JSON and form bodies are filled in");
          return std::string();
        }))
      return;

    // Filled in.
    for (auto& [name, value] : request.headers) {
      std::string place = "header " + quoted_name(name);
      auto header_value = [&](const Credentials::Entry& e,
                              const Placeholder& p) -> std::optional<std::string> {
        const std::string& v = e.credential.value;
        if (v.find_first_of(std::string("\r\n\0", 3)) != std::string::npos) {
          refuse("credential " + e.credential.key + " cannot go in " + place +
                 ": its value holds a line break or a NUL");
          return std::nullopt;
        }
        return p.escaped ? text::percent_encode(v) : v;
      };
      if (auto token = basic_token(value)) {
        auto decoded = unbase64(*token);
        if (decoded && !find_placeholders(*decoded, false).empty()) {
          std::string filled = replace(*decoded, false, header_value);
          if (result.refused) return;
          value = "Basic " + base64(filled);
          continue;
        }
      }
      value = replace(value, true, header_value);
      if (result.refused) return;
    }
    if (!query.empty()) {
      std::string filled =
          replace(query, true, [](const Credentials::Entry& e, const Placeholder&) {
            return std::optional<std::string>(text::percent_encode(e.credential.value));
          });
      if (filled != query) request.target = path + "?" + filled;
    }
    if (!result.body_too_large && body_fillable_type) {
      std::string filled;
      if (is_form(type)) {
        filled = replace(request.body, true, [](const Credentials::Entry& e, const Placeholder&) {
          return std::optional<std::string>(text::percent_encode(e.credential.value));
        });
      } else {
        filled = replace(
            request.body, true,
            [&](const Credentials::Entry& e, const Placeholder& p) -> std::optional<std::string> {
              std::string v =
                  p.escaped ? text::percent_encode(e.credential.value) : e.credential.value;
              try {
                std::string quoted = json(v).dump();
                return quoted.substr(1, quoted.size() - 2);
              } catch (const json::exception&) {
                refuse("credential " + e.credential.key +
                       " cannot go in a JSON body: its value is not UTF-8");
                return std::nullopt;
              }
            });
      }
      if (result.refused) return;
      if (filled != request.body) {
        request.body = std::move(filled);
        set_content_length();
      }
    }

    // A placeholder still there was written in a way the text replacement
    // does not read (a JSON \u escape): it is refused rather than sent on.
    std::string rest;
    for (const auto& [name, value] : request.headers) {
      rest = value;
      if (auto token = basic_token(value))
        if (auto decoded = unbase64(*token)) rest += "\n" + *decoded;
      if (!find_placeholders(rest, true).empty())
        return void(refuse("credential " + find_placeholders(rest, true)[0].key + " in header " +
                           quoted_name(name) + " is written in a form that cannot be filled in"));
    }
    if (!result.body_too_large && is_json(type)) {
      json parsed = json::parse(request.body, nullptr, false);
      rest.clear();
      if (!parsed.is_discarded()) json_strings(parsed, &rest);
      if (auto left = find_placeholders(rest, true); !left.empty())
        return void(refuse("credential " + left[0].key +
                           " in the body is written in a form that cannot be filled in"));
    }
  }

  // The body is whole: a chunked request goes on with its length instead.
  void set_content_length() {
    auto& headers = request.headers;
    headers.erase(
        std::remove_if(headers.begin(), headers.end(),
                       [](const auto& h) { return text::iequals(h.first, "transfer-encoding"); }),
        headers.end());
    std::string length = std::to_string(request.body.size());
    bool set = false;
    for (auto& [name, value] : headers)
      if (text::iequals(name, "content-length")) value = length, set = true;
    if (!set) headers.emplace_back("Content-Length", length);
  }
};

CredentialResult Credentials::fill(CredentialRequest request) const {
  CredentialFill fill{entries_, request, {}};
  fill.run();
  CredentialResult result = std::move(fill.result);
  if (result.refused) {
    result.filled.clear();
  } else {
    result.request = std::move(request);
  }
  return result;
}

}  // namespace openshell::egress
