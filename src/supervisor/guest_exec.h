// One `sandbox exec` in a micro-VM: the exec WebSocket from the command line
// (protocol/exec_stream.h) and a connection to the guest init's exec port
// (runtime/guest_init.h's frames), and the translation between them:
//
//   client -> guest   Start: the exec frame (the request built as for a
//                     container, exec_request.h, its tty and size included);
//                     stdin bytes: stdin frames; Eof: eof; Signal: kill;
//                     Resize: resize
//   guest -> client   started: Started; stdout, stderr: binary messages with
//                     their stream byte; exited: Exit; failed: Failure
//
// With tty the guest runs the command on a pseudo-terminal of its own: all
// it shows comes as stdout, Eof types the terminal's end-of-file character,
// and Resize sets its size (the guest ignores a Resize without tty). The
// translation is pure (guest_exec::) so that it is tested alone; GuestExec
// moves the bytes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include <boost/asio.hpp>

#include "base/unique_fd.h"
#include "protocol/exec_stream.h"
#include "runtime/guest_init.h"
#include "supervisor/exec_request.h"

namespace openshell::net {
class WebSocket;
}

namespace openshell::supervisor {

namespace guest_exec {

namespace exec = protocol::exec;

// Start's exec frame, or the Failure the client gets instead (a user the
// sandbox refuses, a request over a frame's size).
std::variant<std::string, exec::Failure> exec_frame(const exec::Start& start, uint64_t id,
                                                    const ExecDefaults& sandbox);
// Stdin bytes as stdin frames (as many as kMaxFrame needs).
std::string stdin_frames(std::string_view bytes);
// The frame for a message after Start: Eof, Signal, Resize; "" for a
// second Start.
std::string frame_for(const exec::ClientMessage& message);

// What the client gets for one frame from the guest.
struct ToClient {
  std::optional<std::string> binary;        // a stream byte, then the bytes
  std::optional<exec::ServerMessage> text;  // Started, Exit, Failure
  bool last = false;                        // Exit or Failure: the end
};
ToClient to_client(const runtime::guest::Frame& frame);

}  // namespace guest_exec

class GuestExec : public std::enable_shared_from_this<GuestExec> {
 public:
  // guest: a connected stream socket to the guest init's exec port (one
  // connection serves one command); GuestExec owns it.
  GuestExec(boost::asio::io_context& io, std::shared_ptr<net::WebSocket> ws, UniqueFd guest,
            ExecDefaults sandbox, uint64_t id);
  ~GuestExec();
  GuestExec(const GuestExec&) = delete;
  GuestExec& operator=(const GuestExec&) = delete;

  // Starts the relay. on_end runs once, on the loop, when the session is
  // over: the client has its last message (or is gone) and the guest's
  // connection is closed (which ends the command, if it still runs: the
  // guest init kills it when its host goes).
  void start(std::function<void(uint64_t id)> on_end);
  // The sandbox ended under it: the client gets Exit 137, as a container's do.
  void sandbox_gone();
  uint64_t id() const { return id_; }

 private:
  void on_message(std::string data, bool binary);
  void to_guest(std::string frames);
  void write_guest();
  void read_guest();
  void from_guest(const runtime::guest::Frame& frame);
  void end(const guest_exec::exec::ServerMessage& message);
  void finish();

  boost::asio::io_context& io_;
  std::shared_ptr<net::WebSocket> ws_;
  // A socket, not a plain descriptor: its writes never raise SIGPIPE.
  boost::asio::generic::stream_protocol::socket guest_;
  ExecDefaults sandbox_;
  const uint64_t id_;
  std::function<void(uint64_t)> on_end_;
  bool requested_ = false;   // the exec frame is queued
  bool ended_ = false;       // the client has its last message, or is gone
  bool finished_ = false;    // on_end ran
  std::string stdin_early_;  // stdin that came before Start
  std::string out_;          // frames for the guest, not yet written
  bool writing_ = false;
  std::string in_;  // bytes from the guest, not yet whole frames
  std::array<char, 65536> buffer_{};
};

}  // namespace openshell::supervisor
