// Where a client finds a gateway: its Unix socket, or a TCP address served
// with TLS (mutual: the client shows a certificate) or, on loopback only and
// when asked for explicitly, plain TCP.
//
//   unix:///run/openshell/gateway.sock   (or the bare path)
//   https://127.0.0.1:17670              https://[::1]:17670
//   http://127.0.0.1:17671               (a gateway's --insecure-listen)
#pragma once

#include <cstdint>
#include <string>

namespace openshell::net {

// The files of a TLS peer: the CA it trusts for the other side, and its own
// certificate and key (PEM).
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
};

struct Endpoint {
  enum class Kind { kUnix, kTls, kTcp };
  Kind kind = Kind::kUnix;
  std::string socket_path;  // kUnix
  std::string host;         // kTls, kTcp: a name or an address, without brackets
  uint16_t port = 0;
  TlsFiles tls;  // kTls, on the client's side

  static Endpoint unix_socket(std::string path);
  // Parses the forms above; throws Error naming what is wrong:
  // "gateway endpoint 'ftp://x': the scheme must be unix, https or http".
  static Endpoint parse(const std::string& text);
  // The URL form ("https://[::1]:17670", "unix:///path").
  std::string url() const;
  // host:port as an address is written, with brackets for IPv6.
  std::string host_port() const;
};

// "127.0.0.1:17670", "[::1]:17670", "localhost:17670" -> host and port.
// Throws Error naming `what` ("--listen '1.2.3.4'": a port is required).
void parse_host_port(const std::string& text, const std::string& what, std::string* host,
                     uint16_t* port);

}  // namespace openshell::net
