#include "egress/http_rules.h"

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/text.h"

namespace openshell::egress {

namespace {

using text::hex_value;

// The byte of the escape at text[i] ('%'), or -1 when it is not one.
int escape_at(std::string_view text, size_t i) {
  if (i + 2 >= text.size()) return -1;
  int high = hex_value(text[i + 1]);
  int low = hex_value(text[i + 2]);
  if (high < 0 || low < 0) return -1;
  return high * 16 + low;
}

bool is_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

bool is_control(unsigned char c) { return c < 0x20 || c == 0x7f; }

void append_escape(std::string* out, unsigned char byte) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  out->push_back('%');
  out->push_back(kHex[byte >> 4]);
  out->push_back(kHex[byte & 0xf]);
}

// RFC 9110 tchar.
bool is_token(std::string_view text) {
  if (text.empty()) return false;
  for (unsigned char c : text) {
    bool ok =
        (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
        std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

bool equals_folded(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    char x = a[i], y = b[i];
    if (x >= 'a' && x <= 'z') x = static_cast<char>(x - 'a' + 'A');
    if (y >= 'a' && y <= 'z') y = static_cast<char>(y - 'a' + 'A');
    if (x != y) return false;
  }
  return true;
}

// A query key or value: %XX decoded, '+' a space. The escapes were checked
// before (judge refuses a query with a broken one).
void form_decode(std::string_view text, std::string* out) {
  out->clear();
  for (size_t i = 0; i < text.size(); ++i) {
    int byte = text[i] == '%' ? escape_at(text, i) : -1;
    if (byte >= 0) {
      out->push_back(static_cast<char>(byte));
      i += 2;
    } else {
      out->push_back(text[i] == '+' ? ' ' : text[i]);
    }
  }
}

// A glob of the policy read as paths are: escapes of unreserved characters
// decoded, the others' hex in upper case.
std::string normalize_glob_escapes(std::string_view glob) {
  std::string out;
  out.reserve(glob.size());
  for (size_t i = 0; i < glob.size(); ++i) {
    int byte = glob[i] == '%' ? escape_at(glob, i) : -1;
    if (byte < 0) {
      out.push_back(glob[i]);
    } else {
      if (is_unreserved(static_cast<unsigned char>(byte)))
        out.push_back(static_cast<char>(byte));
      else
        append_escape(&out, static_cast<unsigned char>(byte));
      i += 2;
    }
  }
  return out;
}

const char* preset_reason(std::string_view access) {
  if (access == "read-only") return "read-only access allows only GET, HEAD and OPTIONS";
  return "read-write access allows only GET, HEAD, OPTIONS, POST, PUT and PATCH";
}

bool preset_allows(std::string_view access, std::string_view method) {
  if (access == "full") return true;
  if (method == "GET" || method == "HEAD" || method == "OPTIONS") return true;
  return access == "read-write" && (method == "POST" || method == "PUT" || method == "PATCH");
}

}  // namespace

bool normalize_http_path(std::string_view path, bool allow_encoded_slash, std::string* out,
                         std::string* reason) {
  out->clear();
  if (path.empty() || path[0] != '/') {
    *reason = "the path does not begin with /";
    return false;
  }
  out->reserve(path.size());
  // One segment at a time, decoded straight into *out, then looked at:
  // "." and ".." are taken back out, so %2E%2E climbs as ".." does.
  bool trailing_slash = false;
  size_t i = 1;
  for (;;) {
    size_t segment_start = out->size();
    out->push_back('/');
    size_t j = i;
    for (; j < path.size() && path[j] != '/'; ++j) {
      auto c = static_cast<unsigned char>(path[j]);
      if (is_control(c) || c == ' ') {
        *reason = c == 0 ? "the path holds a NUL byte" : "the path holds a control byte or a space";
        return false;
      }
      if (c == '#') {
        *reason = "the path holds a fragment (#)";
        return false;
      }
      if (c != '%') {
        out->push_back(static_cast<char>(c));
        continue;
      }
      int byte = escape_at(path, j);
      if (byte < 0) {
        *reason = "the path holds an invalid percent-encoding";
        return false;
      }
      j += 2;
      if (is_control(static_cast<unsigned char>(byte))) {
        *reason = byte == 0 ? "the path holds an encoded NUL byte (%00)"
                            : "the path holds an encoded control byte";
        return false;
      }
      if (byte == '/' && !allow_encoded_slash) {
        *reason =
            "the path holds an encoded slash (%2F) and the endpoint does not allow_encoded_slash";
        return false;
      }
      if (is_unreserved(static_cast<unsigned char>(byte)))
        out->push_back(static_cast<char>(byte));
      else
        append_escape(out, static_cast<unsigned char>(byte));
    }
    bool last = j >= path.size();
    std::string_view segment(out->data() + segment_start + 1, out->size() - segment_start - 1);
    if (segment.empty()) {
      if (!last) {
        *reason = "the path holds an empty segment (//)";
        return false;
      }
      out->resize(segment_start);
      trailing_slash = true;
    } else if (segment == ".") {
      out->resize(segment_start);
      trailing_slash = last;
    } else if (segment == "..") {
      out->resize(segment_start);
      if (out->empty()) {
        *reason = "the path climbs above /";
        return false;
      }
      out->resize(out->rfind('/'));
      trailing_slash = last;
    } else {
      trailing_slash = false;
    }
    if (last) break;
    i = j + 1;
  }
  if (out->empty())
    out->push_back('/');
  else if (trailing_slash)
    out->push_back('/');
  return true;
}

bool HttpRules::Glob::matches(std::string_view text) const {
  if (!wild) return text == literal;
  // States 0..n, n accepting; the closure only moves forward, so one pass
  // in index order computes it. Globs are short: the states live on the
  // stack unless one is not.
  const size_t n = nodes.size();
  std::array<uint8_t, 2 * 257> small{};
  std::vector<uint8_t> large;
  uint8_t* current = small.data();
  uint8_t* next = small.data() + 257;
  if (n + 1 > 257) {
    large.assign(2 * (n + 1), 0);
    current = large.data();
    next = large.data() + n + 1;
  }
  auto close = [&](uint8_t* states) {
    for (size_t s = 0; s < n; ++s) {
      if (!states[s]) continue;
      if (nodes[s].kind == kStar || nodes[s].kind == kAny) states[s + 1] = 1;
      if (nodes[s].kind == kSlashAny) states[s + 2] = 1;
    }
  };
  current[0] = 1;
  close(current);
  for (char c : text) {
    std::fill(next, next + n + 1, 0);
    bool any = false;
    for (size_t s = 0; s < n; ++s) {
      if (!current[s]) continue;
      const Node& node = nodes[s];
      switch (node.kind) {
        case kLiteral:
          if (node.c == c) next[s + 1] = any = true;
          break;
        case kStar:
          if (c != '/') next[s] = any = true;
          break;
        case kSlashAny:
          if (c == '/') next[s + 1] = any = true;
          break;
        case kAny:
          next[s] = any = true;
          break;
      }
    }
    if (!any) return false;
    close(next);
    std::swap(current, next);
  }
  return current[n] != 0;
}

HttpRules::Glob HttpRules::compile_path_glob(std::string_view written) {
  Glob glob;
  glob.literal = normalize_glob_escapes(written);
  std::string_view text = glob.literal;
  auto segment_ends = [&](size_t at) { return at >= text.size() || text[at] == '/'; };
  for (size_t i = 0; i < text.size();) {
    if (i == 0 && text.starts_with("**") && segment_ends(2)) {
      // A leading "**" segment: anything before the next literal.
      glob.nodes.push_back({Glob::kAny, 0});
      i += 2;
    } else if (text.compare(i, 3, "/**") == 0 && segment_ends(i + 3)) {
      // "/**": nothing, or a slash and anything (more segments).
      glob.nodes.push_back({Glob::kSlashAny, 0});
      glob.nodes.push_back({Glob::kAny, 0});
      i += 3;
    } else if (text[i] == '*') {
      while (i < text.size() && text[i] == '*') ++i;
      glob.nodes.push_back({Glob::kStar, 0});
    } else {
      glob.nodes.push_back({Glob::kLiteral, text[i]});
      ++i;
    }
  }
  glob.wild = glob.literal.find('*') != std::string::npos;
  return glob;
}

HttpRules::Glob HttpRules::compile_value_glob(std::string_view written) {
  Glob glob;
  glob.literal = std::string(written);
  for (size_t i = 0; i < written.size();) {
    if (written[i] == '*') {
      while (i < written.size() && written[i] == '*') ++i;
      glob.nodes.push_back({Glob::kAny, 0});
    } else {
      glob.nodes.push_back({Glob::kLiteral, written[i]});
      ++i;
    }
  }
  glob.wild = glob.literal.find('*') != std::string::npos;
  return glob;
}

HttpRules::Compiled HttpRules::compile(const Rule& rule) {
  Compiled compiled;
  if (rule.method != "*") compiled.method = rule.method;
  compiled.any_path = rule.path.empty();
  if (!compiled.any_path) compiled.path = compile_path_glob(rule.path);
  for (const auto& matcher : rule.query) {
    CompiledMatcher out;
    out.key = matcher.key;
    for (const auto& glob : matcher.globs) out.globs.push_back(compile_value_glob(glob));
    compiled.query.push_back(std::move(out));
  }
  return compiled;
}

HttpRules::HttpRules(const Spec& spec)
    : audit_(spec.audit),
      access_(spec.access),
      has_rules_(!spec.rules.empty()),
      allow_encoded_slash_(spec.allow_encoded_slash) {
  if (!access_.empty() && access_ != "read-only" && access_ != "read-write" && access_ != "full")
    throw Error("access: \"" + access_ + "\" is not read-only, read-write or full");
  if (!access_.empty() && has_rules_) throw Error("access and rules exclude each other");
  for (const auto& rule : spec.rules) rules_.push_back(compile(rule));
  for (const auto& rule : spec.deny_rules) deny_rules_.push_back(compile(rule));
}

bool HttpRules::method_matches(const Compiled& rule, std::string_view method, bool fold_case) {
  if (rule.method.empty()) return true;
  return fold_case ? equals_folded(rule.method, method) : rule.method == method;
}

bool HttpRules::query_matches(const Compiled& rule, std::string_view query, bool every_value) {
  std::string key;
  std::string value;
  for (const auto& matcher : rule.query) {
    bool found = false;
    bool some_value_matched = false;
    for (size_t start = 0; start <= query.size();) {
      size_t end = query.find('&', start);
      if (end == std::string_view::npos) end = query.size();
      std::string_view part = query.substr(start, end - start);
      start = end + 1;
      if (part.empty()) continue;
      size_t equals = part.find('=');
      form_decode(part.substr(0, equals), &key);
      if (key != matcher.key) continue;
      found = true;
      form_decode(equals == std::string_view::npos ? std::string_view() : part.substr(equals + 1),
                  &value);
      bool matched = false;
      for (const auto& glob : matcher.globs) {
        if (glob.matches(value)) {
          matched = true;
          break;
        }
      }
      if (matched) some_value_matched = true;
      if (every_value && !matched) return false;
      if (!every_value && matched) break;
    }
    if (every_value ? !found : !some_value_matched) return false;
  }
  return true;
}

HttpVerdict HttpRules::judge(std::string_view method, std::string_view target) const {
  HttpVerdict verdict;
  auto malformed = [&](std::string reason) {
    verdict.malformed = true;
    verdict.path.clear();
    verdict.reason = std::move(reason);
    return verdict;
  };
  if (!is_token(method)) return malformed("the method is not an HTTP token");
  if (target.empty() || target[0] != '/')
    return malformed("the request-target is not in origin form (/path?query)");
  size_t question = target.find('?');
  std::string_view path = target.substr(0, question);
  std::string_view query =
      question == std::string_view::npos ? std::string_view() : target.substr(question + 1);
  std::string reason;
  if (!normalize_http_path(path, allow_encoded_slash_, &verdict.path, &reason))
    return malformed(reason);
  for (size_t i = 0; i < query.size(); ++i) {
    auto c = static_cast<unsigned char>(query[i]);
    if (is_control(c) || c == ' ') return malformed("the query holds a control byte or a space");
    if (c == '#') return malformed("the query holds a fragment (#)");
    if (c == '%' && escape_at(query, i) < 0)
      return malformed("the query holds an invalid percent-encoding");
  }

  auto refuse = [&](std::string rule, std::string why) {
    verdict.rule = std::move(rule);
    verdict.reason = std::move(why);
    verdict.allowed = audit_;
    verdict.audit_only = audit_;
    return verdict;
  };
  auto rule_matches = [&](const Compiled& rule, bool deny) {
    return method_matches(rule, method, deny) &&
           (rule.any_path || rule.path.matches(verdict.path)) && query_matches(rule, query, !deny);
  };
  for (size_t i = 0; i < deny_rules_.size(); ++i) {
    if (rule_matches(deny_rules_[i], true))
      return refuse("deny_rules[" + std::to_string(i) + "]", "a deny rule matches");
  }
  if (!access_.empty()) {
    if (!preset_allows(access_, method)) return refuse("access " + access_, preset_reason(access_));
    verdict.allowed = true;
    verdict.rule = "access " + access_;
    return verdict;
  }
  if (has_rules_) {
    for (size_t i = 0; i < rules_.size(); ++i) {
      if (rule_matches(rules_[i], false)) {
        verdict.allowed = true;
        verdict.rule = "rules[" + std::to_string(i) + "]";
        return verdict;
      }
    }
    return refuse("rules", "no allow rule matches");
  }
  verdict.allowed = true;
  return verdict;
}

std::string http_denial_body(const HttpVerdict& verdict, std::string_view sandbox,
                             std::string_view host, uint16_t port, std::string_view method) {
  std::string hint = "openshell policy update ";
  hint += sandbox.empty() ? std::string_view("SANDBOX") : sandbox;
  hint += " --add-allow ";
  hint += host;
  hint += ':';
  hint += std::to_string(port);
  hint += ':';
  hint += method;
  hint += ':';
  hint += verdict.path;
  nlohmann::ordered_json body;
  body["error"] = "policy_denied";
  body["rule"] = verdict.rule;
  body["reason"] = verdict.reason;
  body["host"] = host;
  body["port"] = port;
  body["method"] = method;
  body["path"] = verdict.path;
  body["hint"] = hint;
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

std::string http_malformed_body(const HttpVerdict& verdict, std::string_view host, uint16_t port,
                                std::string_view method) {
  nlohmann::ordered_json body;
  body["error"] = "malformed_request";
  body["reason"] = verdict.reason;
  body["host"] = host;
  body["port"] = port;
  body["method"] = method;
  return body.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

}  // namespace openshell::egress
