#include "supervisor/forwards.h"

#include <fcntl.h>

#include <algorithm>
#include <chrono>
#include <set>

#include "base/log.h"

namespace openshell::supervisor {

namespace {

using tcp = asio::ip::tcp;
using boost::system::error_code;
using protocol::session::Forward;

constexpr size_t kRelayBuffer = 64 * 1024;
// How long a refused connection's unread request is drained before it
// closes (a close with unread bytes would be a reset, not an end).
constexpr auto kDrainTime = std::chrono::seconds(5);
// A failed accept (out of descriptors, say) is tried again after this.
constexpr auto kAcceptRetry = std::chrono::milliseconds(100);

// Not into what the supervisor may start later (a micro-VM's VMM).
void close_on_exec(int fd) { ::fcntl(fd, F_SETFD, FD_CLOEXEC); }

// One forwarded connection: bytes both ways. Each direction ends on its
// own: the end of one side's writes becomes a shutdown of our writes to the
// other (a half-close), and the connection closes once both have ended. A
// reset or a failed write on either side ends both.
class Relay : public std::enable_shared_from_this<Relay> {
 public:
  Relay(tcp::socket host, tcp::socket inside)
      : host_(std::move(host)), inside_(std::move(inside)) {}

  void start() {
    pump(host_, inside_, to_inside_);
    pump(inside_, host_, to_host_);
  }

  void close() {
    error_code ignored;
    host_.close(ignored);
    inside_.close(ignored);
  }

 private:
  struct Direction {
    std::vector<char> buffer = std::vector<char>(kRelayBuffer);
    bool ended = false;
  };

  void pump(tcp::socket& from, tcp::socket& to, Direction& d) {
    auto self = shared_from_this();
    from.async_read_some(
        asio::buffer(d.buffer), [this, self, &from, &to, &d](const error_code& ec, size_t n) {
          if (ec == asio::error::eof) {
            error_code ignored;
            to.shutdown(tcp::socket::shutdown_send, ignored);
            d.ended = true;
            if (to_inside_.ended && to_host_.ended) close();
            return;
          }
          if (ec) return close();
          asio::async_write(to, asio::buffer(d.buffer.data(), n),
                            [this, self, &from, &to, &d](const error_code& ec, size_t) {
                              if (ec) return close();
                              pump(from, to, d);
                            });
        });
  }

  tcp::socket host_, inside_;
  Direction to_inside_, to_host_;
};

// A host connection that cannot be relayed (nothing listens inside, the
// sandbox has ended): our end of the writes now, then what the client
// already sent is read and dropped until it closes too, so that it reads an
// end of stream rather than a reset.
void refuse(std::shared_ptr<tcp::socket> host) {
  error_code ignored;
  host->shutdown(tcp::socket::shutdown_send, ignored);
  auto timer = std::make_shared<asio::steady_timer>(host->get_executor(), kDrainTime);
  timer->async_wait([host](const error_code& ec) {
    error_code ignored;
    if (!ec) host->close(ignored);
  });
  auto buffer = std::make_shared<std::vector<char>>(4096);
  auto drain = std::make_shared<std::function<void()>>();
  *drain = [host, timer, buffer, drain] {
    host->async_read_some(asio::buffer(*buffer),
                          [host, timer, drain](const error_code& ec, size_t) {
                            if (!ec) return (*drain)();
                            error_code ignored;
                            host->close(ignored);
                            timer->cancel();
                            *drain = nullptr;  // the cycle of the lambda and itself, broken
                          });
  };
  (*drain)();
}

}  // namespace

struct ForwardSet::Listener {
  Listener(asio::io_context& io, Forward f) : acceptor(io), retry(io), forward(std::move(f)) {}
  tcp::acceptor acceptor;
  asio::steady_timer retry;
  Forward forward;
  std::string error;  // why it does not listen; "" when it does
  bool closed = false;
  std::vector<std::weak_ptr<Relay>> relays;
};

std::string forward_address(const Forward& forward) {
  const bool v6 = forward.bind.find(':') != std::string::npos;
  return (v6 ? "[" + forward.bind + "]" : forward.bind) + ":" + std::to_string(forward.port);
}

namespace {

using Listener = ForwardSet::Listener;

// "" once it listens, else why not: "127.0.0.1:8080: Address already in use".
std::string bind_listener(Listener& l) {
  const std::string where = forward_address(l.forward);
  error_code ec;
  const asio::ip::address address = asio::ip::make_address(l.forward.bind, ec);
  if (ec) return where + ": not an IP address";
  const tcp::endpoint endpoint(address, l.forward.port);
  error_code ignored;
  l.acceptor.close(ignored);
  l.acceptor.open(endpoint.protocol(), ec);
  if (ec) return where + ": socket: " + ec.message();
  close_on_exec(l.acceptor.native_handle());
  // A forward stopped and started again finds its port's old connections
  // in TIME_WAIT; SO_REUSEADDR never lets two listeners share a port.
  l.acceptor.set_option(tcp::acceptor::reuse_address(true), ignored);
  if (address.is_v6()) l.acceptor.set_option(asio::ip::v6_only(true), ignored);
  l.acceptor.bind(endpoint, ec);
  if (!ec) l.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    l.acceptor.close(ignored);
    return where + ": " + ec.message();
  }
  return "";
}

void connect_inside(const std::shared_ptr<Listener>& l, std::shared_ptr<tcp::socket> host,
                    UniqueFd fd) {
  auto inside = std::make_shared<tcp::socket>(host->get_executor());
  error_code ec;
  inside->assign(tcp::v4(), fd.get(), ec);
  if (ec) {
    log::error("forward " + forward_address(l->forward) + ": " + ec.message());
    return refuse(host);
  }
  fd.release();
  const tcp::endpoint target(asio::ip::address_v4::loopback(), l->forward.port);
  inside->async_connect(target, [l, host, inside](const error_code& ec) {
    if (l->closed) return;
    // Nothing listens there (yet): the host's side ends, as a refused
    // connection's would, never left hanging.
    if (ec) {
      log::debug("forward " + forward_address(l->forward) + ": 127.0.0.1:" +
                 std::to_string(l->forward.port) + " in the sandbox: " + ec.message());
      return refuse(host);
    }
    auto relay = std::make_shared<Relay>(std::move(*host), std::move(*inside));
    std::erase_if(l->relays, [](const std::weak_ptr<Relay>& r) { return r.expired(); });
    l->relays.push_back(relay);
    relay->start();
  });
}

void accept_next(const std::shared_ptr<Listener>& l, const ForwardSet::SocketMaker& make_socket) {
  l->acceptor.async_accept([l, make_socket](const error_code& ec, tcp::socket accepted) {
    if (l->closed || ec == asio::error::operation_aborted) return;
    if (ec) {
      log::error("forward " + forward_address(l->forward) + ": accept: " + ec.message());
      l->retry.expires_after(kAcceptRetry);
      l->retry.async_wait([l, make_socket](const error_code& ec) {
        if (!ec && !l->closed) accept_next(l, make_socket);
      });
      return;
    }
    close_on_exec(accepted.native_handle());
    auto host = std::make_shared<tcp::socket>(std::move(accepted));
    make_socket([l, host](UniqueFd fd, const std::string& why) {
      if (l->closed) return;
      if (!fd) {
        log::debug("forward " + forward_address(l->forward) + ": " + why);
        return refuse(host);
      }
      connect_inside(l, host, std::move(fd));
    });
    accept_next(l, make_socket);
  });
}

void close_listener(Listener& l) {
  l.closed = true;
  error_code ignored;
  l.acceptor.close(ignored);
  l.retry.cancel();
  for (auto& weak : l.relays)
    if (auto relay = weak.lock()) relay->close();
  l.relays.clear();
}

}  // namespace

ForwardSet::~ForwardSet() { close_all(); }

void ForwardSet::apply(const std::vector<Forward>& wanted) {
  const std::set<Forward> want(wanted.begin(), wanted.end());
  for (auto it = listeners_.begin(); it != listeners_.end();) {
    if (want.count(it->first)) {
      ++it;
      continue;
    }
    close_listener(*it->second);
    log::debug("forward " + forward_address(it->first) + " closed");
    it = listeners_.erase(it);
  }
  order_.clear();
  for (const Forward& f : wanted) {
    if (std::find(order_.begin(), order_.end(), f) != order_.end()) continue;
    order_.push_back(f);
    auto& l = listeners_[f];
    if (l && l->error.empty()) continue;  // listening: its connections go on
    // New, or one that could not bind before: try (again).
    if (!l) l = std::make_shared<Listener>(io_, f);
    l->error = bind_listener(*l);
    if (!l->error.empty()) {
      log::error("forward: " + l->error);
      continue;
    }
    log::debug("forward " + forward_address(f) + " listening");
    accept_next(l, make_socket_);
  }
}

std::vector<protocol::session::ForwardState> ForwardSet::states() const {
  std::vector<protocol::session::ForwardState> out;
  for (const Forward& f : order_) {
    const Listener& l = *listeners_.at(f);
    out.push_back({f.bind, f.port, l.error.empty() ? "listening" : "error", l.error});
  }
  return out;
}

}  // namespace openshell::supervisor
