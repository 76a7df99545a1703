// Port forwards: a listener on the host's BIND:PORT for each forward of the
// sandbox, and every connection it accepts relayed to 127.0.0.1:PORT inside
// the sandbox, whose network namespace has only loopback. The supervisor is
// the relay (the gateway stays out of the data path), so forwards outlive
// the gateway's restarts.
//
// Only host -> sandbox: a listener is on the host and connects, for each
// connection it accepts, to the one fixed port of the sandbox's loopback;
// nothing in the sandbox can open a connection through it.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "base/unique_fd.h"
#include "protocol/supervisor_session.h"

namespace openshell::supervisor {

namespace asio = boost::asio;

class ForwardSet {
 public:
  // Gives `done` an unconnected TCP socket of the sandbox's network
  // namespace, or an invalid fd and why there is none (the sandbox has
  // ended, say).
  using SocketMaker = std::function<void(std::function<void(UniqueFd, const std::string&)> done)>;

  ForwardSet(asio::io_context& io, SocketMaker make_socket)
      : io_(io), make_socket_(std::move(make_socket)) {}
  ~ForwardSet();
  ForwardSet(const ForwardSet&) = delete;
  ForwardSet& operator=(const ForwardSet&) = delete;

  // The whole set: listeners of forwards that stay keep running (and their
  // connections); the others close with their connections; new ones bind.
  void apply(const std::vector<protocol::session::Forward>& wanted);
  // Each forward's state, in the order apply() was given them.
  std::vector<protocol::session::ForwardState> states() const;
  // Every listener and connection closed (the sandbox has ended).
  void close_all() { apply({}); }

  struct Listener;

 private:
  asio::io_context& io_;
  SocketMaker make_socket_;
  std::vector<protocol::session::Forward> order_;
  std::map<protocol::session::Forward, std::shared_ptr<Listener>> listeners_;
};

// "127.0.0.1:8080", "[::1]:8080".
std::string forward_address(const protocol::session::Forward& forward);

}  // namespace openshell::supervisor
