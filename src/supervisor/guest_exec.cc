#include "supervisor/guest_exec.h"

#include <signal.h>
#include <sys/socket.h>

#include <utility>

#include "base/error.h"
#include "base/json_text.h"
#include "base/text.h"
#include "net/http.h"
#include "runtime/init_protocol.h"

namespace openshell::supervisor {

namespace asio = boost::asio;
namespace frames = runtime::guest;

namespace guest_exec {

namespace {

constexpr size_t kMaxQueued = 1 << 20;  // output waiting for a slow reader, as exec_session's

// A status or a code the guest sent as text: a whole number from 0 to 255.
std::optional<int> status_text(std::string_view text) {
  auto value = text::parse_uint(text, 255);
  if (!value) return std::nullopt;
  return static_cast<int>(*value);
}

}  // namespace

std::variant<std::string, exec::Failure> exec_frame(const exec::Start& start, uint64_t id,
                                                    const ExecDefaults& sandbox) {
  runtime::ExecRequest request;
  try {
    request = exec_request(start, id, sandbox);
  } catch (const Error& e) {
    return exec::Failure{exit_code::kFailure, e.what()};
  }
  std::string bytes = runtime::encode_exec(request);
  if (bytes.size() > frames::kMaxFrame)
    return exec::Failure{exit_code::kFailure, "exec: the command and its environment take " +
                                                  std::to_string(bytes.size()) +
                                                  " bytes (the most is " +
                                                  std::to_string(frames::kMaxFrame) + ")"};
  return frames::encode_frame(frames::FrameType::kExec, bytes);
}

std::string stdin_frames(std::string_view bytes) {
  std::string out;
  while (!bytes.empty()) {
    std::string_view part = bytes.substr(0, frames::kMaxFrame);
    out += frames::encode_frame(frames::FrameType::kStdin, part);
    bytes.remove_prefix(part.size());
  }
  return out;
}

std::string frame_for(const exec::ClientMessage& message) {
  if (std::holds_alternative<exec::Eof>(message))
    return frames::encode_frame(frames::FrameType::kEof, "");
  if (auto* signal = std::get_if<exec::Signal>(&message))
    return frames::encode_frame(frames::FrameType::kKill, std::to_string(signal->signal));
  if (auto* resize = std::get_if<exec::Resize>(&message))
    return frames::encode_frame(frames::FrameType::kResize,
                                frames::encode_size(resize->rows, resize->cols));
  return {};
}

ToClient to_client(const frames::Frame& frame) {
  ToClient out;
  switch (frame.type) {
    case frames::FrameType::kStarted:
      out.text = exec::Started{};
      return out;
    case frames::FrameType::kStdout:
    case frames::FrameType::kStderr:
      out.binary = std::string(1, static_cast<char>(frame.type == frames::FrameType::kStdout
                                                        ? exec::kStdout
                                                        : exec::kStderr)) +
                   frame.bytes;
      return out;
    case frames::FrameType::kExited: {
      out.last = true;
      if (auto status = status_text(frame.bytes))
        out.text = exec::Exit{*status};
      else
        out.text =
            exec::Failure{exit_code::kFailure,
                          "guest stream: an exit status that is not one: " + clip(frame.bytes, 64)};
      return out;
    }
    case frames::FrameType::kFailed: {
      out.last = true;
      // CODE "\n" MESSAGE
      const size_t newline = frame.bytes.find('\n');
      auto code = status_text(std::string_view(frame.bytes).substr(0, newline));
      if (newline == std::string::npos || !code || *code == 0)
        out.text = exec::Failure{exit_code::kFailure, "guest stream: a failure that is not one: " +
                                                          clip(frame.bytes, 256)};
      else
        out.text = exec::Failure{*code, frame.bytes.substr(newline + 1)};
      return out;
    }
    case frames::FrameType::kExec:
    case frames::FrameType::kStdin:
    case frames::FrameType::kEof:
    case frames::FrameType::kKill:
    case frames::FrameType::kResize:
      break;
  }
  out.last = true;
  out.text = exec::Failure{exit_code::kFailure, "guest stream: a frame of type " +
                                                    std::to_string(static_cast<int>(frame.type)) +
                                                    " from the guest, which only the host sends"};
  return out;
}

}  // namespace guest_exec

GuestExec::GuestExec(asio::io_context& io, std::shared_ptr<net::WebSocket> ws, UniqueFd guest,
                     ExecDefaults sandbox, uint64_t id)
    : io_(io), ws_(std::move(ws)), guest_(io), sandbox_(std::move(sandbox)), id_(id) {
  int domain = AF_UNIX;  // the vsock device's host ends are Unix socket pairs
  socklen_t size = sizeof domain;
  (void)::getsockopt(guest.get(), SOL_SOCKET, SO_DOMAIN, &domain, &size);
  boost::system::error_code ec;
  guest_.assign(asio::generic::stream_protocol(domain, 0), guest.get(), ec);
  if (!ec) (void)guest.release();  // else closed here; the first read fails, and says so
}

GuestExec::~GuestExec() = default;

void GuestExec::start(std::function<void(uint64_t id)> on_end) {
  on_end_ = std::move(on_end);
  auto self = shared_from_this();
  ws_->start([self](std::string data, bool binary) { self->on_message(std::move(data), binary); },
             [self](const std::string&) {
               // The caller is gone: so is what it ran, when the guest's
               // connection closes (the guest init kills the command then).
               self->ended_ = true;
               self->finish();
             });
  read_guest();
}

void GuestExec::sandbox_gone() { end(guest_exec::exec::Exit{128 + SIGKILL}); }

void GuestExec::on_message(std::string data, bool binary) {
  namespace exec = guest_exec::exec;
  if (ended_) return;
  if (binary) {
    // Kept until the exec frame has gone first.
    if (!requested_)
      stdin_early_ += data;
    else
      to_guest(guest_exec::stdin_frames(data));
    return;
  }
  exec::ClientMessage message;
  try {
    message = exec::decode_client(data);
  } catch (const protocol::ProtocolError& e) {
    // A client that speaks the stream wrong gets told, and what it ran ends
    // (with the guest's connection).
    return end(exec::Failure{exit_code::kFailure, e.what()});
  }
  if (auto* start = std::get_if<exec::Start>(&message)) {
    if (requested_) return;
    if (sandbox_.refuse)
      if (std::string why = sandbox_.refuse(start->argv, start->tty); !why.empty())
        return end(exec::Failure{exit_code::kFailure, why});
    auto frame = guest_exec::exec_frame(*start, id_, sandbox_);
    if (auto* failure = std::get_if<exec::Failure>(&frame)) return end(*failure);
    requested_ = true;
    to_guest(std::get<std::string>(std::move(frame)) +
             guest_exec::stdin_frames(std::exchange(stdin_early_, {})));
    return;
  }
  // Eof and Signal mean something only for a command asked for.
  if (requested_) to_guest(guest_exec::frame_for(message));
}

void GuestExec::to_guest(std::string frames) {
  if (frames.empty() || !guest_.is_open()) return;
  out_ += frames;
  write_guest();
}

void GuestExec::write_guest() {
  if (writing_ || out_.empty() || !guest_.is_open()) return;
  writing_ = true;
  auto self = shared_from_this();
  auto data = std::make_shared<std::string>(std::exchange(out_, {}));
  asio::async_write(guest_, asio::buffer(*data),
                    [self, data](const boost::system::error_code& ec, size_t) {
                      self->writing_ = false;
                      // A guest that stopped reading has ended the command or
                      // is gone: what it says (or its silence) ends the session.
                      if (ec) return self->out_.clear();
                      self->write_guest();
                    });
}

void GuestExec::read_guest() {
  auto self = shared_from_this();
  guest_.async_read_some(asio::buffer(buffer_), [self](const boost::system::error_code& ec,
                                                       size_t n) {
    if (self->ended_) return self->finish();
    if (ec || n == 0)
      return self->end(guest_exec::exec::Failure{
          exit_code::kFailure, "exec: the guest closed the connection before the command ended"});
    self->in_.append(self->buffer_.data(), n);
    try {
      while (auto frame = frames::take_frame(&self->in_)) {
        self->from_guest(*frame);
        if (self->ended_) return;
      }
    } catch (const Error& e) {
      return self->end(guest_exec::exec::Failure{exit_code::kFailure, e.what()});
    }
    if (self->ws_->queued_bytes() > guest_exec::kMaxQueued) {
      // Let the reader catch up before reading more.
      auto timer = std::make_shared<asio::steady_timer>(self->io_, std::chrono::milliseconds(5));
      timer->async_wait([self, timer](const boost::system::error_code&) { self->read_guest(); });
      return;
    }
    self->read_guest();
  });
}

void GuestExec::from_guest(const frames::Frame& frame) {
  guest_exec::ToClient out = guest_exec::to_client(frame);
  if (out.binary) ws_->send(std::move(*out.binary), true);
  if (out.last) return end(*out.text);
  if (out.text)
    ws_->send(std::visit([](const auto& m) { return protocol::encode(m); }, *out.text), false);
}

void GuestExec::end(const guest_exec::exec::ServerMessage& message) {
  if (ended_) return;
  ended_ = true;
  ws_->send(std::visit([](const auto& m) { return protocol::encode(m); }, message), false);
  ws_->close();
  finish();
}

void GuestExec::finish() {
  if (finished_) return;
  finished_ = true;
  boost::system::error_code ignored;
  guest_.close(ignored);
  if (on_end_) std::exchange(on_end_, {})(id_);
}

}  // namespace openshell::supervisor
