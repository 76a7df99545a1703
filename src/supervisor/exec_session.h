// One `sandbox exec`: a WebSocket from the command line (handed over by the
// gateway), a process the init started, and the bytes between them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <boost/asio.hpp>

#include "base/unique_fd.h"
#include "protocol/exec_stream.h"

namespace openshell::net {
class WebSocket;
}

namespace openshell::supervisor {

namespace asio = boost::asio;

class Supervisor;
namespace exec = protocol::exec;

class ExecSession : public std::enable_shared_from_this<ExecSession> {
 public:
  ExecSession(asio::io_context& io, Supervisor& owner, std::shared_ptr<net::WebSocket> ws,
              uint64_t id)
      : io_(io),
        owner_(owner),
        ws_(std::move(ws)),
        id_(id),
        stdin_(io),
        out_(io),
        err_(io),
        pty_(io),
        drain_timer_(io) {}

  void start();
  // The start message the upgrade request carried (exec::kStartHeader):
  // the command starts now, as if the message had come first.
  void start_early(const protocol::exec::Start& start) {
    if (!requested_) begin(start);
  }
  // From the init.
  void started(UniqueFd pty_master);
  void failed(int exit_code, const std::string& why);
  void exited(int status);
  // The sandbox ended under it.
  void sandbox_gone();
  uint64_t id() const { return id_; }

 private:
  void on_message(std::string data, bool binary);
  void read_stream(asio::posix::stream_descriptor& stream, uint8_t tag);
  void write_stdin();
  void finish();
  void begin(const protocol::exec::Start& start);
  void end(const protocol::exec::ServerMessage& message);
  void apply_size();  // pending_size_ to the terminal

  asio::io_context& io_;
  Supervisor& owner_;
  std::shared_ptr<net::WebSocket> ws_;
  uint64_t id_;
  bool tty_ = false;
  bool requested_ = false;
  bool running_ = false;
  bool ended_ = false;
  std::optional<int> status_;
  int open_streams_ = 0;
  asio::posix::stream_descriptor stdin_, out_, err_, pty_;
  std::string stdin_pending_;
  bool stdin_writing_ = false;
  bool stdin_eof_ = false;
  std::optional<std::pair<uint16_t, uint16_t>> pending_size_;  // rows, cols
  asio::steady_timer drain_timer_;
};

}  // namespace openshell::supervisor
