// One connection the proxy inspects at layer 7: the HTTP/1.1 requests a
// sandbox's client sends to one host:port, each read with Boost.Beast's
// parser, judged on its own (its owner asks the policy), its credential
// placeholders filled in (credentials.h), and sent on; the responses come
// back the same way. Keep-alive holds in both directions.
//
// Inside a CONNECT tunnel the client may speak TLS (its first byte is a
// handshake record): the session then terminates it with the leaf the
// sandbox's CA issued for the CONNECT's host, and speaks TLS to the server
// too, verifying it. Otherwise both sides are plain HTTP.
//
// What is refused, and how:
//  - a request the rules refuse: 403 with a JSON body saying which rule,
//    why, and how to allow it; the connection then closes (its body is not
//    read, so nothing it holds is mistaken for a next request);
//  - a request whose framing or routing is ambiguous (smuggling): both
//    Content-Length and Transfer-Encoding, a coding other than "chunked",
//    Content-Length given twice, no Host or two, a Host or absolute-form
//    target naming another host:port than the tunnel's, an SNI naming
//    another host: 400, closed;
//  - a credential placeholder (or a secret's value) headed where its
//    credential does not belong: 403 credential_endpoint_mismatch;
//  - a server whose certificate does not verify: 502 naming why.
// Every judged request is one audit line (kind "request": method, the
// normalized path without its query, decision allow, deny or audit).
//
// A request that upgrades (WebSocket) is judged like any other; once the
// server answers 101 the bytes are relayed both ways unread.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include <boost/asio/generic/stream_protocol.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <openssl/ssl.h>

#include "egress/credentials.h"
#include "egress/http_rules.h"

namespace openshell::egress {

// What a session asks of the connection it serves (the proxy's Connection).
class HttpSessionOwner {
 public:
  virtual ~HttpSessionOwner() = default;

  struct Judgement {
    HttpVerdict verdict;
    // The connection may carry no more requests: the policy no longer
    // judges it at layer 7, or no longer allows it (then the reason).
    bool close = false;
    std::string close_reason;
  };
  // The current policy's verdict on one request.
  virtual Judgement judge_request(std::string_view method, std::string_view target) = 0;
  // The credentials to fill in (never null).
  virtual std::shared_ptr<const Credentials> credentials() = 0;
  // One audit line: decision "allow", "deny", "audit" or "closed".
  virtual void audit_request(const std::string& method, const std::string& path,
                             const char* decision, const std::string& rule,
                             const std::string& reason) = 0;
  // The sandbox's name, for the hint in a denial.
  virtual const std::string& sandbox_name() const = 0;
};

struct HttpSessionOptions {
  std::string host;  // the CONNECT's (or the plain request's) host, lower case
  uint16_t port = 0;
  // The leaf for `host` (from the sandbox's CA) and the context of the
  // connection upstream: with both, a client that speaks TLS is inspected;
  // without, one that does is refused.
  std::shared_ptr<SSL_CTX> client_tls;
  std::shared_ptr<SSL_CTX> upstream_tls;
  // The client's bytes read already (after the CONNECT's head, or the plain
  // request itself).
  std::string initial;
  // A plain-HTTP proxy request: absolute-form targets, and one request
  // only (the client may send its next one for another host on the same
  // connection, which must reach the proxy's routing again).
  bool single_request = false;
  std::chrono::milliseconds head_timeout = std::chrono::seconds(30);
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(120);
};

// Serves `client` and `upstream` (connected) until either side ends, then
// closes both. `owner` is held until then; the sockets are its.
void start_http_session(std::shared_ptr<HttpSessionOwner> owner,
                        boost::asio::generic::stream_protocol::socket& client,
                        boost::asio::ip::tcp::socket& upstream, HttpSessionOptions options);

}  // namespace openshell::egress
