// The main process's console, for `sandbox connect`: its latest output kept
// for the next attach to replay (protocol::attach::kReplayBytes), the one
// client attached at a time, and, with a terminal, that client's input and
// window size. A second client takes over from the first, which is told.
// The main process runs on whether anyone is attached or not.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "base/unique_fd.h"

namespace openshell::net {
class WebSocket;
}

namespace openshell::supervisor {

namespace asio = boost::asio;

class Console {
 public:
  // on_idle: the last message to a client has gone (the supervisor may end).
  Console(asio::io_context& io, std::function<void()> on_idle)
      : io_(io), terminal_(io), drain_timer_(io), on_idle_(std::move(on_idle)) {}

  // The main process's terminal (the master side: a duplicate is kept), for
  // input and the window size; never called without --tty.
  void set_terminal(int master_fd);
  // Why nothing can be attached ("" once a main process runs).
  void set_refusal(std::string why) { refusal_ = std::move(why); }
  // Output of the main process: stream is protocol::exec::kStdout or kStderr.
  void output(uint8_t stream, std::string_view bytes);
  // A client's attach stream (its handshake under way).
  void attach(std::shared_ptr<net::WebSocket> ws);
  // The main process ended with status; output_done: all its output read
  // (otherwise what still comes within 200 ms is sent first).
  void ended(int status, bool output_done);
  void output_done();
  // Nothing left to send to a client.
  bool idle() const { return !client_ && closing_.empty(); }
  size_t kept_bytes() const { return kept_bytes_; }
  // The kept output's bytes, all streams in order (for tests).
  std::string kept() const {
    std::string out;
    for (const auto& chunk : kept_) out.append(chunk, 1);
    return out;
  }

 private:
  void on_message(const std::shared_ptr<net::WebSocket>& ws, std::string data, bool binary);
  void begin(const std::shared_ptr<net::WebSocket>& ws, uint16_t rows, uint16_t cols, bool replay);
  void resize(uint16_t rows, uint16_t cols);
  void write_input();
  void send_end();
  void drop(const std::shared_ptr<net::WebSocket>& ws, const std::string& message);
  // Sends ws its last message and closes it.
  void finish(const std::shared_ptr<net::WebSocket>& ws, const std::string& last,
              const std::string& reason = {});

  asio::io_context& io_;
  asio::posix::stream_descriptor terminal_;  // a duplicate of the master, for writes
  asio::steady_timer drain_timer_;
  std::function<void()> on_idle_;
  std::string refusal_ = "the sandbox's main process has not started";
  // Each entry: a stream byte, then bytes; kept_bytes_ counts the bytes.
  std::deque<std::string> kept_;
  size_t kept_bytes_ = 0;
  std::shared_ptr<net::WebSocket> client_;  // attached (its first message read)
  std::string input_;                       // for the terminal, not yet written
  bool writing_ = false;
  std::optional<int> status_;  // the main process's, once it ended
  bool end_sent_ = false;
  // Streams not yet attached (their first message to come), and those being
  // sent their last message: held here, as the client is, until they close.
  std::vector<std::shared_ptr<net::WebSocket>> pending_, closing_;
};

}  // namespace openshell::supervisor
