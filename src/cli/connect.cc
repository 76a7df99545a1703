#include "cli/connect.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <cctype>
#include <functional>
#include <optional>
#include <utility>

#include <boost/asio.hpp>

#include "base/error.h"
#include "base/files.h"
#include "cli/gateway_client.h"
#include "cli/streams.h"
#include "cli/terminal.h"
#include "net/http.h"
#include "protocol/attach_stream.h"
#include "protocol/exec_stream.h"

namespace openshell::cli {

namespace asio = boost::asio;
namespace attach_stream = protocol::attach;

std::string parse_detach_keys(std::string_view text) {
  const std::string shown = "--detach-keys " + std::string(text);
  std::string keys;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string_view key =
        text.substr(start, comma == std::string_view::npos ? comma : comma - start);
    if (key.size() == 1) {
      keys += key[0];
    } else if (key.size() == 6 && key.substr(0, 5) == "ctrl-") {
      const char c = static_cast<char>(std::tolower(static_cast<unsigned char>(key[5])));
      if (c >= 'a' && c <= 'z')
        keys += static_cast<char>(c - 'a' + 1);
      else if (c == '@')
        keys += '\0';
      else if (c >= '[' && c <= '_')
        keys += static_cast<char>(c - '[' + 27);
      else
        throw Error(shown + ": ctrl-" + std::string(1, key[5]) +
                    " is not a control key (ctrl- takes a letter or one of @ [ \\ ] ^ _)");
    } else {
      throw Error(shown + ": '" + std::string(key) +
                  "' is neither one character nor ctrl-X (e.g. ctrl-p,ctrl-q)");
    }
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return keys;
}

std::string DetachMatcher::feed(std::string_view input, bool* detached) {
  *detached = false;
  std::string out;
  for (char c : input) {
    if (keys_.empty()) {
      out += c;
      continue;
    }
    if (c == keys_[matched_]) {
      if (++matched_ == keys_.size()) {
        *detached = true;
        matched_ = 0;
        return out;
      }
      continue;
    }
    // Broken off: what was held goes on as typed, and this byte may begin
    // the sequence again.
    out.append(keys_, 0, matched_);
    matched_ = 0;
    if (c == keys_[0])
      matched_ = 1;
    else
      out += c;
  }
  return out;
}

namespace {

// Written once the terminal is no longer raw (it adds the CRs), on a line
// of its own.
void say(const std::string& line) {
  files::write_all(STDERR_FILENO, "\nopenshell: " + line + "\n");
}

}  // namespace

int connect_console(const GatewayClient& client, const std::string& name,
                    const ConnectOptions& options) {
  const std::string keys = parse_detach_keys(options.detach_keys);
  asio::io_context io;
  auto ws = open_stream(io, client, "/v1/sandboxes/" + net::percent_encode(name) + "/attach");
  asio::signal_set signals(io, SIGWINCH);
  unsigned short rows = 24, cols = 80;
  terminal_size(&rows, &cols);
  ws->send(protocol::encode(attach_stream::Attach{rows, cols, options.replay}), false);

  std::optional<int> status;
  std::string error;
  bool detached = false, taken_over = false, tty = false;
  std::optional<RawMode> raw;
  DetachMatcher matcher(keys);

  asio::posix::stream_descriptor input(io);
  bool reading = false;
  std::array<char, 16384> in_buf;
  std::function<void()> read_input = [&]() {
    input.async_read_some(asio::buffer(in_buf), [&](const boost::system::error_code& ec, size_t n) {
      if (ec) return;  // no more input: output still shows until the end
      bool typed_detach = false;
      std::string pass = matcher.feed(std::string_view(in_buf.data(), n), &typed_detach);
      if (!pass.empty() && tty) ws->send(std::move(pass), true);
      if (typed_detach) {
        detached = true;
        ws->send(protocol::encode(attach_stream::Detach{}), false);
        ws->close("detached");
        return;
      }
      read_input();
    });
  };
  std::function<void()> wait_resize = [&]() {
    signals.async_wait([&](const boost::system::error_code& ec, int) {
      if (ec) return;
      unsigned short r, c;
      terminal_size(&r, &c);
      ws->send(protocol::encode(attach_stream::Resize{r, c}), false);
      wait_resize();
    });
  };
  wait_resize();
  // Leaving (^C without a terminal in the sandbox, a SIGTERM or SIGHUP
  // here) detaches: the main process runs on.
  asio::signal_set leave(io, SIGINT, SIGTERM, SIGHUP);
  leave.async_wait([&](const boost::system::error_code& ec, int) {
    if (ec) return;
    detached = true;
    ws->send(protocol::encode(attach_stream::Detach{}), false);
    ws->close("detached");
  });

  ws->start(
      [&](std::string data, bool binary) {
        if (binary) {
          if (data.size() > 1)
            files::write_all(data[0] == protocol::exec::kStderr ? STDERR_FILENO : STDOUT_FILENO,
                             std::string_view(data).substr(1));
          return;
        }
        try {
          auto message = attach_stream::decode_server(data);
          if (auto* hello = std::get_if<attach_stream::Attached>(&message)) {
            tty = hello->tty;
            // With a terminal in the sandbox, this one is raw: no line
            // editing here, and ^C is the sandbox's to get. Without one,
            // keys are read only for the detach keys, and ^C detaches.
            raw.emplace(STDIN_FILENO, !tty);
            if (!reading) {
              reading = true;
              int fd = ::fcntl(STDIN_FILENO, F_DUPFD_CLOEXEC, 3);
              if (fd >= 0) {
                ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
                boost::system::error_code ec;
                input.assign(fd, ec);
                if (!ec) read_input();
              }
            }
          } else if (std::holds_alternative<attach_stream::TakenOver>(message)) {
            taken_over = true;
          } else if (auto* exit = std::get_if<attach_stream::Exit>(&message)) {
            status = exit->code;
          } else if (auto* failure = std::get_if<attach_stream::Failure>(&message)) {
            error = failure->message;
          }
        } catch (const protocol::ProtocolError& e) {
          error = e.what();
          io.stop();
        }
      },
      [&](const std::string&) { io.stop(); });
  io.run();
  raw.reset();
  if (!error.empty()) throw Error(error);
  if (detached) {
    say("detached from sandbox '" + name + "'; it runs on ('openshell sandbox connect " + name +
        "' attaches again)");
    return 0;
  }
  if (taken_over) {
    say("another terminal connected to sandbox '" + name + "': this one is detached");
    return 0;
  }
  if (status) return *status;
  throw Error("the connection to sandbox '" + name + "' ended before its main process did");
}

}  // namespace openshell::cli
