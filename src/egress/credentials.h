// Credentials the sandbox never sees: its environment holds placeholders
// (KEY=openshell:resolve:env:KEY) and the proxy fills in the real value in
// a request headed to one of the credential's endpoints, or refuses it.
//
//  - Filled in: every header value (inside "Bearer ...", and inside a Basic
//    credential's base64 "user:password", decoded and encoded again); the
//    query and a JSON or form-urlencoded body when the credential allows it
//    (percent-encoded in a query or a form, JSON-escaped in JSON), with
//    Content-Length fixed.
//  - Refused, with 403 credential_endpoint_mismatch: a placeholder of a
//    credential, or its secret value (raw, percent-encoded, or base64, also
//    inside a longer base64 text such as "user:VALUE"), in a request to a
//    host:port the credential is not bound to, anywhere (the host, a header,
//    the path, the query, the body); a placeholder in the path even for its
//    own endpoint (paths end up in logs); a placeholder in the query or the
//    body of an endpoint whose credential does not allow it there, or in a
//    body that is neither JSON nor a form; an unknown key's placeholder (a
//    typo would otherwise send the placeholder on, and a probe would learn
//    nothing from a quiet pass).
//  - A reason names the key and the place (header NAME, path, query, body)
//    but never a value: a reason that would hold one (a header named after
//    it) says so without the name.
//  - A body over kMaxRewrittenBody is not rewritten (the result says so), but
//    it is still searched for what may not leave.
//
// A Credentials set is immutable: rotation builds a new one, and the caller
// swaps a shared_ptr<const Credentials>, so a request sees one set whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace openshell::egress {

inline constexpr const char* kPlaceholderPrefix = "openshell:resolve:env:";
inline constexpr const char* kCredentialRefusal = "credential_endpoint_mismatch";
inline constexpr size_t kMaxRewrittenBody = 256 * 1024;

struct Credential {
  std::string key;                     // A-Z a-z 0-9 _, not starting with a digit
  std::string value;                   // the secret
  std::vector<std::string> endpoints;  // "host:port"; host exact or "*.example.com"
  bool in_query = false;               // may be filled in the query string
  bool in_body = false;                // may be filled in a JSON or form body
};

struct CredentialRequest {
  std::string host;  // as the request is routed (the CONNECT or SNI name)
  uint16_t port = 0;
  std::string method;
  std::string target;                                        // origin form: "/p?q"
  std::vector<std::pair<std::string, std::string>> headers;  // in order, repeats kept
  std::string body;                                          // de-chunked
  std::string content_type;  // the media type; empty: the Content-Type header's
};

struct CredentialResult {
  bool refused = false;
  std::string reason;               // when refused: "credential GITHUB_TOKEN in query: ..."
  CredentialRequest request;        // when not refused: the request, filled in
  std::vector<std::string> filled;  // the keys filled in, once each, in the order met
  bool body_too_large = false;      // over kMaxRewrittenBody: the body was not rewritten
};

class Credentials {
 public:
  Credentials() = default;
  // Throws Error for a bad key, an empty value, a repeated key, or an
  // endpoint that is not "host:port".
  explicit Credentials(std::vector<Credential> credentials);

  // The request, its placeholders filled in for the credentials bound to
  // its host:port, or the refusal. Without credentials, a request carrying
  // no placeholder passes unchanged.
  CredentialResult fill(CredentialRequest request) const;

  bool empty() const { return entries_.empty(); }

 private:
  struct Endpoint {
    std::string host;  // lower case
    uint16_t port = 0;
  };
  struct Entry {
    Credential credential;
    std::vector<Endpoint> endpoints;
    // What the value looks like where it may hide: raw, percent-encoded,
    // and the parts of its base64 that do not depend on what is around it.
    std::vector<std::string> forms;
  };
  std::vector<Entry> entries_;
  friend struct CredentialFill;
};

}  // namespace openshell::egress
