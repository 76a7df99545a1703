// What the egress proxy's unit tests share: loopback sockets, and a proxy
// served on a thread of its own whose audit lines are kept.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <boost/asio.hpp>
#include <gtest/gtest.h>

#include "base/unique_fd.h"
#include "egress/proxy.h"

namespace openshell::egress::testing {

// A listening TCP socket on 127.0.0.1 and its port.
inline UniqueFd loopback_listener(uint16_t* port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::listen(fd.get(), 64), 0);
  socklen_t len = sizeof addr;
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

inline UniqueFd connect_loopback(uint16_t port) {
  UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  return fd;
}

// A proxy served on a thread, with its audit lines. `listen`: on a
// loopback listener of its own (port()); without, it takes only the
// connections handed to it, as a micro-VM's sandbox's does.
class ProxyHarness {
 public:
  explicit ProxyHarness(Proxy::Options options, bool listen = true) {
    options.audit = [this](const std::string& line) {
      std::lock_guard<std::mutex> lock(mutex_);
      audit_ += line + "\n";
    };
    proxy_ = std::make_unique<Proxy>(io_, options);
    if (listen) proxy_->serve(loopback_listener(&port_), UniqueFd(), UniqueFd());
    work_.emplace(io_.get_executor());
    thread_ = std::thread([this] { io_.run(); });
  }
  ~ProxyHarness() {
    on_thread([this] { proxy_->close(); });
    work_.reset();
    io_.stop();
    thread_.join();
  }
  ProxyHarness(const ProxyHarness&) = delete;
  ProxyHarness& operator=(const ProxyHarness&) = delete;

  uint16_t port() const { return port_; }
  std::string audit() {
    std::lock_guard<std::mutex> lock(mutex_);
    return audit_;
  }
  // Runs f on the proxy's thread, and waits for it.
  void on_thread(std::function<void()> f) {
    std::promise<void> done;
    boost::asio::post(io_, [&] {
      f();
      done.set_value();
    });
    done.get_future().wait();
  }
  Proxy& proxy() { return *proxy_; }

 private:
  boost::asio::io_context io_;
  std::optional<boost::asio::executor_work_guard<boost::asio::io_context::executor_type>> work_;
  std::unique_ptr<Proxy> proxy_;
  uint16_t port_ = 0;
  std::mutex mutex_;
  std::string audit_;
  std::thread thread_;
};

}  // namespace openshell::egress::testing
