#include "net/endpoint.h"

#include "base/error.h"
#include "base/text.h"

namespace openshell::net {

Endpoint Endpoint::unix_socket(std::string path) {
  Endpoint e;
  e.kind = Kind::kUnix;
  e.socket_path = std::move(path);
  return e;
}

void parse_host_port(const std::string& text, const std::string& what, std::string* host,
                     uint16_t* port) {
  std::string h, p;
  if (!text.empty() && text[0] == '[') {
    auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':')
      throw Error(what + " '" + text + "': an IPv6 address is written [ADDRESS]:PORT");
    h = text.substr(1, close - 1);
    p = text.substr(close + 2);
  } else {
    auto colon = text.rfind(':');
    if (colon == std::string::npos)
      throw Error(what + " '" + text + "': a port is required (HOST:PORT)");
    h = text.substr(0, colon);
    p = text.substr(colon + 1);
    if (h.find(':') != std::string::npos)
      throw Error(what + " '" + text + "': an IPv6 address is written [ADDRESS]:PORT");
  }
  if (h.empty()) throw Error(what + " '" + text + "': a host is required (HOST:PORT)");
  auto number = text::parse_uint(p, 65535);
  if (!number || *number == 0)
    throw Error(what + " '" + text + "': the port must be a number from 1 to 65535");
  *host = h;
  *port = static_cast<uint16_t>(*number);
}

Endpoint Endpoint::parse(const std::string& text) {
  const std::string what = "gateway endpoint";
  if (text.empty()) throw Error(what + ": empty");
  if (text[0] == '/') return unix_socket(text);
  auto scheme_end = text.find("://");
  if (scheme_end == std::string::npos)
    throw Error(what + " '" + text +
                "': expected unix:///PATH, https://HOST:PORT or http://HOST:PORT");
  const std::string scheme = text.substr(0, scheme_end);
  std::string rest = text.substr(scheme_end + 3);
  if (scheme == "unix") {
    if (rest.empty() || rest[0] != '/')
      throw Error(what + " '" + text + "': a Unix socket's path is absolute (unix:///PATH)");
    return unix_socket(rest);
  }
  Endpoint e;
  if (scheme == "https")
    e.kind = Kind::kTls;
  else if (scheme == "http")
    e.kind = Kind::kTcp;
  else
    throw Error(what + " '" + text + "': the scheme must be unix, https or http");
  while (!rest.empty() && rest.back() == '/') rest.pop_back();
  if (rest.find('/') != std::string::npos)
    throw Error(what + " '" + text + "': a gateway's URL has no path");
  parse_host_port(rest, what, &e.host, &e.port);
  return e;
}

std::string Endpoint::host_port() const {
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string Endpoint::url() const {
  switch (kind) {
    case Kind::kUnix:
      return "unix://" + socket_path;
    case Kind::kTls:
      return "https://" + host_port();
    case Kind::kTcp:
      return "http://" + host_port();
  }
  return {};
}

}  // namespace openshell::net
