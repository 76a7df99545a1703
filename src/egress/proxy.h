// A sandbox's only way out: an HTTP proxy (CONNECT, and plain HTTP with an
// absolute URL) listening on the sandbox's 127.0.0.1:3128, dialling out from
// the host side after the policy allows the connection, and a DNS stub on
// the sandbox's 127.0.0.1:53. Both sockets are made inside the sandbox's
// network namespace and served here, so no veth, tun or privilege is needed.
//
// Every decision is one JSON line (time, sandbox, binary, pid, host, port,
// decision, rule, reason) handed to the audit callback.
//
// Plain HTTP is one request per connection to the proxy: the request goes on
// with `Connection: close`, only its own body follows it, and the response
// comes back with `Connection: close`. A second request on the same
// connection never reaches the first request's server unchecked; the client
// sends it again on a new connection, where it is checked and logged. An
// upgrade (WebSocket) that the server accepts with 101 turns the connection
// into a tunnel to that one server, like CONNECT.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include <boost/asio/io_context.hpp>

#include "base/unique_fd.h"
#include "egress/credentials.h"
#include "egress/identity.h"
#include "egress/rules.h"
#include "net/dns.h"

namespace openshell::egress {

// Where an HTTP/1 message body ends in a stream of bytes (RFC 9112 section
// 6): after Content-Length bytes, or after the last chunk and the trailer
// section of the chunked coding. The bytes are not changed, only counted.
class BodyEnd {
 public:
  static BodyEnd none();  // no body at all
  static BodyEnd length(uint64_t bytes);
  static BodyEnd chunked();

  // Of these, the next bytes of the stream, how many belong to the body.
  // Fewer than all when the body ended among them (done()) or is malformed
  // (failed()); 0 once either holds.
  size_t feed(std::string_view bytes);
  bool done() const { return state_ == State::kDone; }
  bool failed() const { return state_ == State::kFailed; }

 private:
  enum class State { kLength, kChunkSize, kChunkData, kChunkDataEnd, kTrailer, kDone, kFailed };
  explicit BodyEnd(State state, uint64_t remaining = 0) : state_(state), remaining_(remaining) {}
  State state_;
  uint64_t remaining_;
  std::string line_;  // a chunk-size or trailer line so far
};

// A request for an absolute http:// URL, as the proxy sends it on to the
// server: in origin form, with a Host field made from the URL (never the
// client's own), without hop-by-hop fields (Connection, Keep-Alive,
// Proxy-Connection, Proxy-Authorization and the fields Connection names),
// and with `Connection: close`, or `Connection: Upgrade` and its Upgrade
// field for an upgrade request.
struct OriginRequest {
  std::string host;  // lower case, IPv6 without brackets
  uint16_t port = 80;
  std::string head;  // request line, fields and the empty line
  BodyEnd body = BodyEnd::none();
  bool upgrade = false;
};

// `head` is a request head up to and including its empty line. Empty when it
// is a request the proxy forwards, else why not (the client gets 400): not
// an http:// URL, a malformed field, or a body whose end is ambiguous (both
// Content-Length and Transfer-Encoding, differing lengths, a coding other
// than chunked last).
std::string origin_request(std::string_view head, OriginRequest* request);

// The status code of a response head ("HTTP/1.1 200 OK..."), or 0 when it
// is not one.
int response_status(std::string_view head);

// A final response head as the client gets it: hop-by-hop fields dropped and
// `Connection: close`, for the proxy closes the connection after it.
std::string closing_response_head(std::string_view head);

class ConnectWatcher;
namespace tls {
class SandboxCa;
}

class Proxy {
 public:
  struct Options {
    std::string sandbox;  // its name, for the audit
    pid_t init_pid = 0;   // its PID 1 (host pid): callers are it and its descendants
    std::function<void(const std::string& json_line)> audit;
    // Connections open at once; one more is refused with a 503 and an audit
    // line. With it the proxy's own memory stays within a fixed budget (see
    // docs/policy.md).
    size_t max_connections = 512;
    // A client that has not sent its whole request head by then is closed.
    std::chrono::milliseconds head_timeout = std::chrono::seconds(30);
    // The sandbox's CA (tls.h), which its clients trust: with it the proxy
    // terminates their TLS to a layer-7 endpoint and judges each request.
    // Without one (a sandbox whose root cannot be given the CA), a CONNECT
    // to such an endpoint is refused; plain HTTP is judged all the same.
    // Outlives the proxy.
    tls::SandboxCa* ca = nullptr;
    // A kept-alive inspected connection idle this long between requests is
    // closed.
    std::chrono::milliseconds idle_timeout = std::chrono::seconds(120);
  };

  Proxy(boost::asio::io_context& io, Options options,
        net::dns::ResolverConfig resolver = net::dns::ResolverConfig::from_environment());
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // The policy's network part; takes effect for the next connection or
  // query, and closes the open connections it would refuse (each audited
  // with decision "closed", reason "policy revision N: ...").
  void set_rules(std::shared_ptr<const NetworkRules> rules, int64_t revision = 0);
  // The credentials the proxy fills into inspected requests (credentials.h;
  // in_query and in_body are the endpoint's to say, credentials_in): the
  // next request sees the new set, whole. Throws Error for a set that
  // Credentials refuses, and then keeps the one before.
  void set_credentials(std::vector<Credential> credentials);

  // Serves the proxy's listening socket and the DNS stub's socket.
  // diag_socket: a NETLINK_SOCK_DIAG socket made in the sandbox's network
  // namespace, to identify callers with (see identity.h); without one they
  // are identified through /proc, slowly. connect_listener: the seccomp
  // listener that hears the sandbox's connect(2)s (runtime/seccomp.h), served
  // on a thread of its own (see connect_watch.h); without one, a connection
  // is judged by the processes holding its socket alone.
  void serve(UniqueFd listener, UniqueFd dns_socket, UniqueFd diag_socket,
             UniqueFd connect_listener = {});
  // Stops accepting; open connections go on until they end.
  void close();

  // A micro-VM's guest has no network: its connections to the proxy and its
  // DNS queries arrive as fds (the host ends of vsock connections, Unix
  // stream sockets), one at a time, each served here like one the listener
  // accepted. None of these needs serve(): a proxy made with init_pid 0 for
  // them alone has no listener, no UDP socket, no identity search. Called
  // on the loop's thread, as set_rules() is; after close(), the fd is
  // closed unserved.
  //
  // One client connection whose caller is known: no identity search; the
  // rules that name binaries judge `caller` (credited as its exe only when
  // its untrusted is ""), and the audit names it. max_connections, the head
  // timeout and policy changes hold as for an accepted connection.
  void serve_identified(UniqueFd client, Caller caller);
  // A guest's egress connection: its first line names the caller
  // (identity_line.h), the HTTP request follows. A malformed line refuses
  // the connection (400, and an audit line): no one is credited.
  void serve_guest_connection(UniqueFd client);
  // A guest's DNS stream: queries and answers each after its length (2
  // bytes, big-endian), many on one stream, each answered as the DNS stub
  // answers a datagram (policy, audit). A message over 1500 bytes, or of 0,
  // closes the stream; at most 16 streams are open at once. close() closes
  // them.
  void serve_dns_stream(UniqueFd stream);

  struct Impl;  // public so that the connections (in proxy.cc) may hold it
  class IdentityWorker;

 private:
  std::shared_ptr<Impl> impl_;
  std::shared_ptr<IdentityWorker> worker_;
  std::unique_ptr<ConnectWatcher> connect_watcher_;
};

}  // namespace openshell::egress
