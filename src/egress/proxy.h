// A sandbox's only way out: an HTTP proxy (CONNECT, and plain HTTP with an
// absolute URL) listening on the sandbox's 127.0.0.1:3128, dialling out from
// the host side after the policy allows the connection, and a DNS stub on
// the sandbox's 127.0.0.1:53. Both sockets are made inside the sandbox's
// network namespace and served here, so no veth, tun or privilege is needed.
//
// Every decision is one JSON line (time, sandbox, binary, pid, host, port,
// decision, rule, reason) handed to the audit callback.
#pragma once

#include <sys/types.h>

#include <utility>  // before Asio with GCC 12 in C++20

#include <boost/asio/io_context.hpp>
#include <functional>
#include <memory>
#include <string>

#include "base/unique_fd.h"
#include "egress/dns.h"
#include "egress/rules.h"

namespace openshell::egress {

class Proxy {
 public:
  struct Options {
    std::string sandbox;  // its name, for the audit
    pid_t init_pid = 0;   // its PID 1 (host pid): whose /proc identifies callers
    std::function<void(const std::string& json_line)> audit;
  };

  Proxy(boost::asio::io_context& io, Options options, ResolverConfig resolver = ResolverConfig::from_environment());
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  // The policy's network part; takes effect for the next connection or query.
  void set_rules(std::shared_ptr<const NetworkRules> rules);

  // Serves the proxy's listening socket and the DNS stub's socket.
  void serve(UniqueFd listener, UniqueFd dns_socket);
  // Stops accepting; open connections go on until they end.
  void close();

  // Bytes relayed, connections allowed and refused so far (for status).
  struct Counters {
    uint64_t allowed = 0, denied = 0, bytes = 0;
  };
  Counters counters() const;

  struct Impl;  // public so that the connections (in proxy.cc) may hold it

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace openshell::egress
