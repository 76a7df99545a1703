// The main process's console: replay, the attached client, its input.
#include "supervisor/console.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <chrono>

#include "base/log.h"
#include "net/http.h"
#include "protocol/attach_stream.h"
#include "protocol/exec_stream.h"

namespace openshell::supervisor {

namespace attach = protocol::attach;

namespace {

// Output queued for a client that does not read: beyond it, the client is
// let go (its terminal would only ever fall further behind), and the main
// process is never slowed by it.
constexpr size_t kMaxQueued = 8 << 20;
// Input waiting for the terminal, which the main process does not read.
constexpr size_t kMaxInput = 1 << 20;

}  // namespace

void Console::set_terminal(int master_fd) {
  int fd = ::fcntl(master_fd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0) {
    log::error(errno_message("duplicate the main process's terminal", errno));
    return;
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  terminal_.assign(fd);
}

void Console::output(uint8_t stream, std::string_view bytes) {
  if (bytes.empty()) return;
  std::string chunk(1, static_cast<char>(stream));
  chunk.append(bytes);
  if (client_) {
    if (client_->queued_bytes() > kMaxQueued)
      drop(client_, "the terminal did not keep up with the output");
    else
      client_->send(chunk, true);
  }
  // Keep exactly the latest kReplayBytes: the oldest chunk is cut, not
  // dropped whole.
  kept_bytes_ += bytes.size();
  kept_.push_back(std::move(chunk));
  while (kept_bytes_ > attach::kReplayBytes) {
    std::string& front = kept_.front();
    const size_t over = kept_bytes_ - attach::kReplayBytes;
    if (front.size() - 1 <= over) {
      kept_bytes_ -= front.size() - 1;
      kept_.pop_front();
    } else {
      front.erase(1, over);
      kept_bytes_ -= over;
    }
  }
}

void Console::attach(std::shared_ptr<net::WebSocket> ws) {
  std::weak_ptr<net::WebSocket> weak = ws;
  ws->start(
      [this, weak](std::string data, bool binary) {
        if (auto ws = weak.lock()) on_message(ws, std::move(data), binary);
      },
      [this, weak](const std::string&) {
        auto ws = weak.lock();
        if (!ws) return;
        if (ws == client_) client_.reset();
        std::erase(pending_, ws);
        std::erase(closing_, ws);
        if (idle()) on_idle_();
      });
  // Held by its handlers until the first message makes it the client.
  pending_.push_back(std::move(ws));
}

void Console::on_message(const std::shared_ptr<net::WebSocket>& ws, std::string data, bool binary) {
  const bool attached = ws == client_;
  if (binary) {
    // Input from a client that was taken over is not the terminal's.
    if (!attached || !terminal_.is_open()) return;
    if (input_.size() + data.size() > kMaxInput) {
      log::warn("connect: input dropped: the main process does not read its terminal");
      return;
    }
    input_ += data;
    write_input();
    return;
  }
  attach::ClientMessage message;
  try {
    message = attach::decode_client(data);
  } catch (const protocol::ProtocolError& e) {
    return drop(ws, e.what());
  }
  if (auto* a = std::get_if<attach::Attach>(&message)) {
    if (!attached) begin(ws, a->rows, a->cols, a->replay);
  } else if (auto* r = std::get_if<attach::Resize>(&message)) {
    if (attached) resize(r->rows, r->cols);
  } else if (std::holds_alternative<attach::Detach>(message)) {
    if (attached) {
      client_.reset();
      closing_.push_back(ws);
      ws->close("detached");
    }
  }
}

void Console::begin(const std::shared_ptr<net::WebSocket>& ws, uint16_t rows, uint16_t cols,
                    bool replay) {
  std::erase(pending_, ws);
  // After the main process's end too, the client gets its output, then
  // its status.
  if (!refusal_.empty() && !status_)
    return finish(ws, protocol::encode(attach::Failure{125, refusal_}));
  if (client_) {
    // One terminal at a time: the newest wins, and the one before is told.
    finish(client_, protocol::encode(attach::TakenOver{}), "taken over");
    client_.reset();
  }
  client_ = ws;
  if (terminal_.is_open()) resize(rows, cols);
  attach::Attached hello;
  hello.tty = terminal_.is_open();
  hello.replay = replay ? kept_bytes_ : 0;
  ws->send(protocol::encode(hello), false);
  if (replay)
    for (const auto& chunk : kept_) ws->send(chunk, true);
  if (status_) send_end();
}

void Console::resize(uint16_t rows, uint16_t cols) {
  if (rows == 0 || cols == 0) return;
  winsize size{rows, cols, 0, 0};
  // The terminal's foreground process group gets SIGWINCH from the kernel.
  if (::ioctl(terminal_.native_handle(), TIOCSWINSZ, &size) != 0)
    log::debug(errno_message("resize the main process's terminal", errno));
}

void Console::write_input() {
  if (writing_ || input_.empty() || !terminal_.is_open()) return;
  writing_ = true;
  auto data = std::make_shared<std::string>(std::move(input_));
  input_.clear();
  asio::async_write(terminal_, asio::buffer(*data),
                    [this, data](const boost::system::error_code& ec, size_t) {
                      writing_ = false;
                      if (ec) {
                        // The terminal has closed: the main process is ending.
                        input_.clear();
                        return;
                      }
                      write_input();
                    });
}

void Console::ended(int status, bool done) {
  status_ = status;
  if (done) return output_done();
  drain_timer_.expires_after(std::chrono::milliseconds(200));
  drain_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) output_done();
  });
}

void Console::output_done() {
  if (!status_ || end_sent_) return;
  drain_timer_.cancel();
  end_sent_ = true;
  send_end();
}

void Console::send_end() {
  if (!end_sent_ || !client_) return;
  finish(client_, protocol::encode(attach::Exit{*status_}));
  client_.reset();
}

void Console::drop(const std::shared_ptr<net::WebSocket>& ws, const std::string& message) {
  if (ws == client_) client_.reset();
  finish(ws, protocol::encode(attach::Failure{125, message}));
}

void Console::finish(const std::shared_ptr<net::WebSocket>& ws, const std::string& last,
                     const std::string& reason) {
  std::erase(pending_, ws);
  closing_.push_back(ws);
  ws->send(last, false);
  ws->close(reason);
}

}  // namespace openshell::supervisor
