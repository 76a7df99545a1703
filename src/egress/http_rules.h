// The layer-7 rules of one endpoint (docs/policy.md: protocol = "rest"):
// what judges each HTTP request the proxy reads, by method, path and query.
// Pure: no I/O, no clock; supervisor::http_rules() builds them from a
// policy's endpoint.
//
//  - Deny wins: a request matching any deny rule is refused, whatever the
//    allow side says. Then `access` (read-only: GET, HEAD, OPTIONS;
//    read-write: those and POST, PUT, PATCH; full: any method) or the
//    allow `rules` (at least one must match). No access and no rules:
//    every request is allowed, except what a deny rule refuses.
//  - Methods are case-sensitive tokens (RFC 9110), so "get" is not GET for
//    an allow rule or a preset; a deny rule's method matches in any case,
//    because a server that folds case would otherwise serve "delete" past
//    a rule that denies DELETE.
//  - Paths are judged after normalization; a request whose path cannot be
//    normalized is malformed (400), not denied (403), in audit mode too:
//      * percent-encoded unreserved characters (ALPHA DIGIT - . _ ~) are
//        decoded; every other escape is kept, its hex in upper case; an
//        escape that is not % and two hex digits is refused;
//      * %2F (an encoded slash) is refused unless allow_encoded_slash, and
//        then kept as %2F, inside its segment: servers disagree whether it
//        separates segments;
//      * a NUL or control byte, raw or encoded, is refused, as is a '#';
//      * "." and ".." segments are resolved (%2E counts as '.'), and one
//        climbing above "/" is refused;
//      * an empty segment ("//") is refused rather than kept or merged:
//        some servers merge slashes and some do not, so either reading of
//        "/a//b" lets through a request that another server reads as a
//        different path.
//    The policy's globs are compared with that normalized form, and are
//    themselves read the same way (escapes of unreserved characters
//    decoded, hex in upper case), so "/%7Euser" and "/~user" are one glob.
//  - Path globs: `*` matches any run of characters within one segment;
//    `**` as a whole segment matches any number of segments, none included
//    ("/a/**" matches "/a", "/a/" and "/a/b/c"; "/a/**/b" matches "/a/b");
//    `**` inside a segment is `*`. Every other character is literal. The
//    match is a set-of-states walk, linear in the path for a given glob.
//  - Query: the part after '?' is split on '&' into key=value (no '=':
//    the value is empty), each percent-decoded with '+' as a space. A
//    matcher names a key and globs (`*` matches any run of characters).
//    In an allow rule every value the key has must match one of the globs,
//    and a key the request does not give makes the rule not match (so an
//    allow rule cannot be met by leaving a value out). In a deny rule one
//    matching value suffices (so a second, harmless value cannot hide the
//    one denied). Keys no matcher names are free.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace openshell::egress {

// What a request was judged to be.
struct HttpVerdict {
  // Whether the request goes upstream: also true for a would-be denial in
  // audit mode (audit_only).
  bool allowed = false;
  // Allowed only because the endpoint's enforcement is "audit": the rules
  // refuse it, and the audit log says so.
  bool audit_only = false;
  // The request could not be judged (its target is not a normalizable
  // origin-form path, its method is not a token): a 400, never allowed.
  bool malformed = false;
  // The rule that decided: "deny_rules[0]", "rules[2]", "access read-only",
  // "rules" (none of them matched), "" (no rules at all, or malformed).
  std::string rule;
  std::string reason;  // one short phrase; never holds a query value
  std::string path;    // the normalized path ("" when malformed)
};

class HttpRules {
 public:
  struct QueryMatcher {
    std::string key;
    std::vector<std::string> globs;  // the value must match one of them
  };
  struct Rule {
    std::string method;  // "" or "*": any
    std::string path;    // glob; "": any
    std::vector<QueryMatcher> query;
  };
  struct Spec {
    bool audit = false;  // enforcement = "audit"
    std::string access;  // "", "read-only", "read-write", "full"
    std::vector<Rule> rules;
    std::vector<Rule> deny_rules;
    bool allow_encoded_slash = false;
  };

  HttpRules() = default;  // allows every well-formed request
  // Throws Error for an unknown access, or access given with rules (which
  // policy::parse() refuses, but a policy built in code may hold).
  explicit HttpRules(const Spec& spec);

  // `target` is the request-target in origin form ("/a/b?x=1").
  HttpVerdict judge(std::string_view method, std::string_view target) const;

 private:
  struct Glob {
    enum Kind : uint8_t { kLiteral, kStar, kSlashAny, kAny };
    struct Node {
      Kind kind;
      char c;
    };
    std::string literal;  // the whole glob when it has no wildcard
    std::vector<Node> nodes;
    bool wild = false;
    bool matches(std::string_view text) const;
  };
  struct CompiledMatcher {
    std::string key;
    std::vector<Glob> globs;
  };
  struct Compiled {
    std::string method;  // "": any
    bool any_path = true;
    Glob path;
    std::vector<CompiledMatcher> query;
  };
  static Glob compile_path_glob(std::string_view glob);
  static Glob compile_value_glob(std::string_view glob);
  static Compiled compile(const Rule& rule);
  static bool method_matches(const Compiled& rule, std::string_view method, bool fold_case);
  static bool query_matches(const Compiled& rule, std::string_view query, bool every_value);

  bool audit_ = false;
  std::string access_;
  bool has_rules_ = false;
  std::vector<Compiled> rules_;
  std::vector<Compiled> deny_rules_;
  bool allow_encoded_slash_ = false;
};

// The normalized path of an origin-form path (no query), as described
// above; on a refusal returns false and sets *reason.
bool normalize_http_path(std::string_view path, bool allow_encoded_slash, std::string* out,
                         std::string* reason);

// The 403 body of a denial, one line of JSON: {"error":"policy_denied",
// "rule","reason","host","port","method","path","hint"}. The hint is
// "openshell policy update SANDBOX --add-allow HOST:PORT:METHOD:PATH" with
// the request's path (never its query); `sandbox` "" writes SANDBOX.
std::string http_denial_body(const HttpVerdict& verdict, std::string_view sandbox,
                             std::string_view host, uint16_t port, std::string_view method);
// The 400 body of a malformed request: {"error":"malformed_request",
// "reason","host","port","method"}.
std::string http_malformed_body(const HttpVerdict& verdict, std::string_view host, uint16_t port,
                                std::string_view method);

}  // namespace openshell::egress
