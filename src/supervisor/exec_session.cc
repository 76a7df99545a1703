// The exec relay's per-command half: start, stdio, resize, signals, exit.
#include "supervisor/exec_session.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <array>
#include <cerrno>

#include "base/error.h"
#include "base/unique_fd.h"
#include "net/http.h"
#include "supervisor/exec_request.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

namespace {

constexpr size_t kMaxQueued = 1 << 20;  // output waiting for a slow reader

}  // namespace

void ExecSession::start() {
  auto self = shared_from_this();
  ws_->start([self](std::string data, bool binary) { self->on_message(std::move(data), binary); },
             [self](const std::string&) {
               // The caller is gone: so is what it ran (or is about to run: the
               // kill follows the request on the init's channel).
               if (self->requested_ && !self->status_) self->owner_.kill_exec(self->id_, SIGKILL);
               self->ended_ = true;
               self->owner_.forget(self->id_);
               self->owner_.exec_closed();
             });
}

void ExecSession::on_message(std::string data, bool binary) {
  if (binary) {
    // Kept until the process has its input (a pty comes with "started").
    stdin_pending_ += data;
    write_stdin();
    return;
  }
  exec::ClientMessage message;
  try {
    message = exec::decode_client(data);
  } catch (const protocol::ProtocolError& e) {
    // A client that speaks the stream wrong gets told, and what it ran ends.
    if (requested_ && !status_) owner_.kill_exec(id_, SIGKILL);
    return end(exec::Failure{exit_code::kFailure, e.what()});
  }
  if (auto* start = std::get_if<exec::Start>(&message)) {
    if (!requested_) begin(*start);
  } else if (std::holds_alternative<exec::Eof>(message)) {
    stdin_eof_ = true;
    write_stdin();
  } else if (auto* resize = std::get_if<exec::Resize>(&message)) {
    // One that comes before the terminal exists is applied once it does.
    pending_size_ = {resize->rows, resize->cols};
    if (tty_ && pty_.is_open()) apply_size();
  } else if (auto* signal = std::get_if<exec::Signal>(&message)) {
    if (running_) owner_.kill_exec(id_, signal->signal);
  }
}

void ExecSession::begin(const exec::Start& start) {
  requested_ = true;
  if (owner_.copy_only())
    if (std::string why = owner_.copy_refusal(start.argv, start.tty); !why.empty())
      return end(exec::Failure{exit_code::kFailure, why});
  runtime::ExecRequest request;
  try {
    request = exec_request(
        start, id_,
        ExecDefaults{owner_.container_spec().env,
                     owner_.container_spec().fs.workdir,
                     [this](const std::string& user) { return owner_.exec_user(user); },
                     {}});
  } catch (const Error& e) {
    return end(exec::Failure{exit_code::kFailure, e.what()});
  }
  tty_ = request.tty;
  UniqueFd theirs[3];
  if (!tty_) {
    for (int i = 0; i < 3; ++i) {
      int p[2];
      if (::pipe2(p, O_CLOEXEC) != 0)
        return end(exec::Failure{exit_code::kFailure, errno_message("pipe", errno)});
      // stdin: the process reads p[0]; stdout/stderr: it writes p[1].
      theirs[i].reset(i == 0 ? p[0] : p[1]);
      int ours = i == 0 ? p[1] : p[0];
      (i == 0 ? stdin_ : i == 1 ? out_ : err_).assign(ours);
    }
  }
  const int fds[3] = {theirs[0].get(), theirs[1].get(), theirs[2].get()};
  if (!owner_.send_exec(request, tty_ ? nullptr : fds, tty_ ? 0 : 3))
    return end(exec::Failure{exit_code::kFailure, "the sandbox is not running"});
}

void ExecSession::started(UniqueFd pty_master) {
  running_ = true;
  if (tty_) {
    if (!pty_master) return failed(exit_code::kFailure, "no pseudo-terminal");
    pty_.assign(pty_master.release());
    if (pending_size_) apply_size();
    open_streams_ = 1;
    read_stream(pty_, exec::kStdout);
  } else {
    open_streams_ = 2;
    read_stream(out_, exec::kStdout);
    read_stream(err_, exec::kStderr);
  }
  ws_->send(protocol::encode(exec::Started{}), false);
  write_stdin();
}

void ExecSession::apply_size() {
  winsize size{pending_size_->first, pending_size_->second, 0, 0};
  ::ioctl(pty_.native_handle(), TIOCSWINSZ, &size);
  pending_size_.reset();
}

void ExecSession::failed(int exit_code, const std::string& why) {
  end(exec::Failure{exit_code, why});
}

void ExecSession::exited(int status) {
  status_ = status;
  // The process is gone; what it wrote may still be in the pipes (or held
  // open by something it left running): read on briefly, then finish.
  auto self = shared_from_this();
  drain_timer_.expires_after(std::chrono::milliseconds(200));
  drain_timer_.async_wait([self](const boost::system::error_code& ec) {
    if (!ec) self->finish();
  });
  if (open_streams_ == 0) finish();
}

void ExecSession::sandbox_gone() {
  if (!status_) status_ = 128 + SIGKILL;
  finish();
}

void ExecSession::read_stream(asio::posix::stream_descriptor& stream, uint8_t tag) {
  auto self = shared_from_this();
  auto buffer = std::make_shared<std::array<char, 32768>>();
  stream.async_read_some(
      asio::buffer(buffer->data() + 1, buffer->size() - 1),
      [self, &stream, tag, buffer](const boost::system::error_code& ec, size_t n) {
        if (ec || n == 0) {
          // EOF, or EIO once a pty's last writer is gone.
          if (--self->open_streams_ == 0 && self->status_) self->finish();
          return;
        }
        (*buffer)[0] = static_cast<char>(tag);
        self->ws_->send(std::string(buffer->data(), n + 1), true);
        if (self->ws_->queued_bytes() > kMaxQueued) {
          // Let the reader catch up before reading more.
          auto timer =
              std::make_shared<asio::steady_timer>(self->io_, std::chrono::milliseconds(5));
          timer->async_wait([self, &stream, tag, timer](const boost::system::error_code&) {
            self->read_stream(stream, tag);
          });
          return;
        }
        self->read_stream(stream, tag);
      });
}

void ExecSession::write_stdin() {
  asio::posix::stream_descriptor& target = tty_ ? pty_ : stdin_;
  if (stdin_writing_ || !target.is_open()) return;
  if (stdin_pending_.empty()) {
    if (stdin_eof_ && !tty_ && stdin_.is_open()) stdin_.close();
    if (stdin_eof_ && tty_) {
      // End of input on a terminal: its end-of-file character.
      stdin_eof_ = false;
      stdin_pending_.assign(1, '\x04');  // (not = "\x04": GCC 12 -Wrestrict false positive)
    } else {
      return;
    }
  }
  stdin_writing_ = true;
  auto self = shared_from_this();
  auto data = std::make_shared<std::string>(std::move(stdin_pending_));
  stdin_pending_.clear();
  asio::async_write(target, asio::buffer(*data),
                    [self, data](const boost::system::error_code& ec, size_t) {
                      self->stdin_writing_ = false;
                      if (ec) {
                        self->stdin_pending_.clear();
                        return;
                      }
                      self->write_stdin();
                    });
}

void ExecSession::finish() {
  if (ended_) return;
  drain_timer_.cancel();
  // What the process wrote before it exited is in the pipes already, even
  // when this supervisor was too busy to read it before the drain timer
  // fired: send it all before the exit status.
  auto drain = [this](asio::posix::stream_descriptor& stream, uint8_t tag) {
    if (!stream.is_open()) return;
    const int fd = stream.native_handle();
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    std::array<char, 32768> buffer;
    for (;;) {
      ssize_t n = ::read(fd, buffer.data() + 1, buffer.size() - 1);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      buffer[0] = static_cast<char>(tag);
      ws_->send(std::string(buffer.data(), static_cast<size_t>(n) + 1), true);
    }
  };
  if (tty_) {
    drain(pty_, exec::kStdout);
  } else {
    drain(out_, exec::kStdout);
    drain(err_, exec::kStderr);
  }
  end(exec::Exit{status_.value_or(128 + SIGKILL)});
}

void ExecSession::end(const exec::ServerMessage& message) {
  if (ended_) return;
  ended_ = true;
  ws_->send(std::visit([](const auto& m) { return protocol::encode(m); }, message), false);
  ws_->close();
  boost::system::error_code ignored;
  stdin_.close(ignored);
  out_.close(ignored);
  err_.close(ignored);
  pty_.close(ignored);
  owner_.forget(id_);
}

}  // namespace openshell::supervisor
