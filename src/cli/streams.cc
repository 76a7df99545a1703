#include "cli/streams.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/logfile.h"
#include "base/text.h"
#include "base/time.h"
#include "cli/gateway_client.h"
#include "cli/terminal.h"
#include "net/http.h"
#include "protocol/exec_stream.h"

namespace openshell::cli {

namespace asio = boost::asio;
namespace exec_stream = protocol::exec;
using nlohmann::json;

std::shared_ptr<net::WebSocket> open_stream(asio::io_context& io, const GatewayClient& client,
                                            const std::string& target,
                                            net::WebSocket::Headers headers) {
  std::shared_ptr<net::WebSocket> result;
  std::string error;
  bool done = false;
  client.check_before_connecting();
  net::WebSocket::connect(io, client.gateway().endpoint, target, std::move(headers),
                          [&](std::shared_ptr<net::WebSocket> ws, std::string why) {
                            result = std::move(ws);
                            error = std::move(why);
                            done = true;
                          });
  while (!done && io.run_one()) {
  }
  if (!result && error.rfind("WebSocket upgrade at ", 0) == 0)
    throw StreamRefused("connect to the gateway: " + error);
  if (!result) throw StreamUnreachable("connect to the gateway: " + error);
  return result;
}

size_t print_records(const std::string& text, bool timestamps, std::string* carry) {
  carry->append(text);
  size_t count = 0, start = 0;
  for (;;) {
    size_t nl = carry->find('\n', start);
    if (nl == std::string::npos) break;
    auto record = logfile::parse(std::string_view(*carry).substr(start, nl - start));
    start = nl + 1;
    if (!record) continue;
    std::string out = timestamps ? time::format_ns(record->time_ns) + " " : "";
    out += record->text;
    if (!record->partial) out += '\n';
    files::write_all(record->stream == "stderr" ? STDERR_FILENO : STDOUT_FILENO, out);
    ++count;
  }
  carry->erase(0, start);
  return count;
}

egress::ocsf::Format network_format(const std::string& name) {
  if (name == "ocsf") return egress::ocsf::Format::kOcsf;
  if (name == "text") return egress::ocsf::Format::kText;
  return egress::ocsf::Format::kJson;
}

LogEnd follow_logs(const GatewayClient& client, const std::string& name,
                   const LogOptions& options) {
  asio::io_context io;
  std::string target =
      "/v1/sandboxes/" + net::percent_encode(name) + "/logs?follow=1&source=" + options.source;
  if (options.tail != "all") target += "&tail=" + options.tail;
  if (options.since_ns) target += "&since=" + std::to_string(*options.since_ns);
  auto ws = open_stream(io, client, target);
  LogEnd end;
  std::string carry;
  const egress::ocsf::Format format = network_format(options.format);
  bool ended = false;
  std::string closed_why;
  ws->start(
      [&](std::string data, bool binary) {
        if (binary) {
          if (options.source == "network")
            files::write_all(STDOUT_FILENO, egress::ocsf::convert(data, format, &carry));
          else
            print_records(data, options.timestamps, &carry);
          return;
        }
        json m = json::parse(data, nullptr, false);
        if (m.is_object() && m.value("type", "") == "end") {
          ended = true;
          end.phase = m.value("phase", "");
          if (m.contains("exit_code")) end.exit_code = m["exit_code"].get<int>();
        }
      },
      [&](const std::string& why) {
        closed_why = why;
        io.stop();
      });
  io.run();
  if (!ended)
    throw Error("the log stream ended early" + (closed_why.empty() ? "" : ": " + closed_why));
  return end;
}

int exec(const GatewayClient& client, const std::string& name, const ExecOptions& options) {
  asio::io_context io;
  // Signals are caught from before the command starts: one sent as soon as
  // it runs is passed on, never fatal to this process.
  asio::signal_set signals(io, SIGINT, SIGTERM, SIGHUP);
  signals.add(SIGWINCH);
  signals.add(SIGQUIT);
  const bool tty = options.tty;
  unsigned short rows = 24, cols = 80;
  if (tty) terminal_size(&rows, &cols);
  exec_stream::Start start;
  start.argv = options.argv;
  start.env = options.env;
  if (!options.workdir.empty()) start.workdir = options.workdir;
  if (!options.user.empty()) start.user = options.user;
  start.tty = tty;
  start.rows = rows;
  start.cols = cols;
  // The start rides in the upgrade request where it fits; a supervisor
  // that took it from there says so, else it is sent as a message.
  net::WebSocket::Headers headers;
  if (auto value = exec_stream::start_header(start))
    headers.emplace_back(exec_stream::kStartHeader, std::move(*value));
  auto ws = open_stream(
      io, client,
      "/v1/sandboxes/" + net::percent_encode(name) + "/exec" + (options.copy ? "?copy=1" : ""),
      std::move(headers));
  if (ws->response_header(exec_stream::kStartHeader) != exec_stream::kStartAccepted)
    ws->send(protocol::encode(start), false);
  const std::string eof = protocol::encode(exec_stream::Eof{});

  std::optional<int> status;
  std::string error;
  int error_code = 0;
  RawMode raw(tty ? options.stdin_fd : -1);

  // Input: pollable stdin streams as it comes; a regular file is sent whole.
  asio::posix::stream_descriptor input(io);
  struct stat st;
  bool pollable =
      ::fstat(options.stdin_fd, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
  if (pollable) {
    int fd = ::dup(options.stdin_fd);
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    input.assign(fd);
  } else {
    std::string all;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(options.stdin_fd, buf, sizeof buf)) > 0)
      all.append(buf, static_cast<size_t>(n));
    if (!all.empty()) ws->send(all, true);
    ws->send(eof, false);
  }
  std::array<char, 32768> in_buf;
  std::function<void()> read_input = [&]() {
    input.async_read_some(asio::buffer(in_buf), [&](const boost::system::error_code& ec, size_t n) {
      if (ec) {
        ws->send(eof, false);
        return;
      }
      ws->send(std::string(in_buf.data(), n), true);
      read_input();
    });
  };
  if (pollable) read_input();

  // Signals: a terminal's go through the pty; otherwise they are passed on.
  std::function<void()> wait_signal = [&]() {
    signals.async_wait([&](const boost::system::error_code& ec, int sig) {
      if (ec) return;
      if (sig == SIGWINCH) {
        if (tty) {
          unsigned short r, c;
          terminal_size(&r, &c);
          ws->send(protocol::encode(exec_stream::Resize{r, c}), false);
        }
      } else {
        ws->send(protocol::encode(exec_stream::Signal{sig}), false);
      }
      wait_signal();
    });
  };
  wait_signal();

  asio::steady_timer timeout(io);
  bool timed_out = false;
  if (options.timeout_s > 0) {
    timeout.expires_after(std::chrono::seconds(options.timeout_s));
    timeout.async_wait([&](const boost::system::error_code& ec) {
      if (ec) return;
      timed_out = true;
      ws->send(protocol::encode(exec_stream::Signal{SIGKILL}), false);
    });
  }

  ws->start(
      [&](std::string data, bool binary) {
        if (binary) {
          if (data.empty()) return;
          files::write_all(data[0] == exec_stream::kStderr ? options.stderr_fd : options.stdout_fd,
                           std::string_view(data).substr(1));
          return;
        }
        try {
          auto message = exec_stream::decode_server(data);
          if (auto* exit = std::get_if<exec_stream::Exit>(&message)) status = exit->code;
          if (auto* failure = std::get_if<exec_stream::Failure>(&message)) {
            error = failure->message;
            error_code = failure->code;
          }
        } catch (const protocol::ProtocolError& e) {
          // A supervisor that speaks the stream wrong: say so, and stop.
          error = e.what();
          error_code = exit_code::kFailure;
          io.stop();
        }
      },
      [&](const std::string&) { io.stop(); });
  io.run();
  if (!error.empty()) throw Error(error, error_code ? error_code : 125);
  if (timed_out)
    throw Error("exec: timed out after " + std::to_string(options.timeout_s) + " s", 124);
  if (!status) throw Error("the exec stream ended before the command did");
  return *status;
}

}  // namespace openshell::cli
