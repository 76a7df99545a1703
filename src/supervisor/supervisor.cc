#include "supervisor/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <map>
#include <memory>
#include <utility>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "auth/launch.h"
#include "auth/peer.h"
#include "auth/secrets.h"
#include "base/error.h"
#include "base/event_loop.h"
#include "base/files.h"
#include "base/json_text.h"
#include "base/log.h"
#include "base/logfile.h"
#include "base/paths.h"
#include "base/process_name.h"
#include "egress/identity.h"
#include "egress/proxy.h"
#include "egress/rules.h"
#include "net/http.h"
#include "policy/policy.h"
#include "runtime/container.h"
#include "runtime/init_protocol.h"
#include "spec/container_spec.h"
#include "spec/sandbox_spec.h"

namespace openshell::supervisor {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

constexpr size_t kMaxQueued = 1 << 20;  // output waiting for a slow reader
constexpr int kDefaultGraceMs = 10000;

class Supervisor;

// One `sandbox exec`: a WebSocket from the command line (handed over by the
// gateway), a process the init started, and the bytes between them.
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
  // From the init.
  void started(int pty_master);
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
  void end(json message);

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
  asio::steady_timer drain_timer_;
};

class Supervisor {
 public:
  Supervisor(asio::io_context& io, std::string launch_file)
      : io_(io),
        launch_file_(std::move(launch_file)),
        paths_(Paths::resolve()),
        pidfd_(io),
        out_(io),
        err_(io),
        control_(io),
        listener_(io),
        signals_(io, SIGTERM, SIGINT, SIGHUP),
        reconnect_timer_(io),
        stop_timer_(io),
        exit_timer_(io) {}

  int run();
  // For exec sessions.
  bool send_exec(const runtime::ExecRequest& request, const int* fds, int count);
  void kill_exec(uint64_t id, int sig);
  void forget(uint64_t id) { execs_.erase(id); }
  const runtime::ContainerSpec& container_spec() const { return container_spec_; }

 private:
  void load();
  void start_container();
  void read_output(asio::posix::stream_descriptor& stream, const std::string& name);
  void watch_exit();
  void watch_control();
  void listen_for_exec();
  void accept_exec();
  void connect_session();
  void on_session_message(const std::string& data);
  void report_status();
  void stop(int grace_ms);
  void container_ended(int status);
  void write_exit_file();
  void finish_soon();
  void maybe_exit();
  void fail_start(int code, const std::string& why);
  void take_environment(const json& welcome);
  void start_egress();
  void apply_policy(const std::string& text, int64_t revision);
  void audit(const std::string& line);

  asio::io_context& io_;
  std::string launch_file_;
  Paths paths_;
  auth::LaunchSpec launch_;
  SandboxSpec spec_;
  runtime::ContainerSpec container_spec_;
  std::unique_ptr<runtime::Container> container_;
  std::unique_ptr<logfile::Writer> log_;
  asio::posix::stream_descriptor pidfd_, out_, err_, control_, listener_;
  asio::signal_set signals_;
  asio::steady_timer reconnect_timer_, stop_timer_, exit_timer_;
  std::shared_ptr<net::WebSocket> session_;
  bool session_welcome_ = false;
  int reconnect_ms_ = 20;
  std::map<uint64_t, std::shared_ptr<ExecSession>> execs_;
  uint64_t next_exec_ = 1;
  std::string socket_path_;
  std::string spec_error_;  // why the spec cannot become a container
  std::unique_ptr<egress::Proxy> proxy_;
  std::unique_ptr<logfile::RotatingFile> network_log_;  // the proxy's decisions

  // What happened to the main process.
  enum class State { kRunning, kStopping, kEnded } state_ = State::kRunning;
  bool stopped_ = false;  // ended by a stop, not by itself
  int exit_code_ = 0;
  std::string reason_, message_;
  int streams_open_ = 0;
  bool final_sent_ = false;
  bool refused_ = false;  // the gateway refused our launch file
  bool exit_reported_ = false;
  int result_ = 0;
};

// ---- ExecSession ------------------------------------------------------------

void ExecSession::start() {
  auto self = shared_from_this();
  ws_->start([self](std::string data, bool binary) { self->on_message(std::move(data), binary); },
             [self](const std::string&) {
               // The caller is gone: so is what it ran.
               if (self->running_ && !self->status_) self->owner_.kill_exec(self->id_, SIGKILL);
               self->ended_ = true;
               self->owner_.forget(self->id_);
             });
}

void ExecSession::on_message(std::string data, bool binary) {
  if (binary) {
    // Kept until the process has its input (a pty comes with "started").
    stdin_pending_ += data;
    write_stdin();
    return;
  }
  json m = json::parse(data, nullptr, false);
  if (!m.is_object()) return;
  std::string type = m.value("type", "");
  if (type == "start" && !requested_) {
    requested_ = true;
    runtime::ExecRequest request;
    request.id = id_;
    request.tty = m.value("tty", false);
    request.rows = static_cast<uint16_t>(m.value("rows", 24));
    request.cols = static_cast<uint16_t>(m.value("cols", 80));
    request.workdir = m.value("workdir", owner_.container_spec().fs.workdir);
    request.argv = m.value("argv", std::vector<std::string>{});
    // The sandbox's environment, then the caller's additions.
    request.env = owner_.container_spec().env;
    for (const auto& entry : m.value("env", std::vector<std::string>{})) {
      std::string key = entry.substr(0, entry.find('='));
      bool replaced = false;
      for (auto& existing : request.env)
        if (existing.compare(0, key.size() + 1, key + "=") == 0) existing = entry, replaced = true;
      if (!replaced) request.env.push_back(entry);
    }
    if (request.argv.empty())
      return end({{"type", "error"}, {"code", 125}, {"message", "no command"}});
    tty_ = request.tty;
    int fds[3] = {-1, -1, -1};
    int ours[3] = {-1, -1, -1};
    if (!tty_) {
      for (int i = 0; i < 3; ++i) {
        int p[2];
        if (::pipe2(p, O_CLOEXEC) != 0)
          return end({{"type", "error"}, {"code", 125}, {"message", errno_message("pipe", errno)}});
        // stdin: the process reads p[0]; stdout/stderr: it writes p[1].
        fds[i] = i == 0 ? p[0] : p[1];
        ours[i] = i == 0 ? p[1] : p[0];
      }
      stdin_.assign(ours[0]);
      out_.assign(ours[1]);
      err_.assign(ours[2]);
    }
    bool sent = owner_.send_exec(request, tty_ ? nullptr : fds, tty_ ? 0 : 3);
    for (int fd : fds)
      if (fd >= 0) ::close(fd);
    if (!sent)
      return end({{"type", "error"}, {"code", 125}, {"message", "the sandbox is not running"}});
  } else if (type == "eof") {
    stdin_eof_ = true;
    write_stdin();
  } else if (type == "resize" && tty_ && pty_.is_open()) {
    winsize size{static_cast<unsigned short>(m.value("rows", 24)),
                 static_cast<unsigned short>(m.value("cols", 80)), 0, 0};
    ::ioctl(pty_.native_handle(), TIOCSWINSZ, &size);
  } else if (type == "signal" && running_) {
    owner_.kill_exec(id_, m.value("signal", SIGTERM));
  }
}

void ExecSession::started(int pty_master) {
  running_ = true;
  if (tty_) {
    if (pty_master < 0) return failed(exit_code::kFailure, "no pseudo-terminal");
    pty_.assign(pty_master);
    open_streams_ = 1;
    read_stream(pty_, 1);
  } else {
    open_streams_ = 2;
    read_stream(out_, 1);
    read_stream(err_, 2);
  }
  ws_->send(json_text(json{{"type", "started"}}), false);
  write_stdin();
}

void ExecSession::failed(int exit_code, const std::string& why) {
  end({{"type", "error"}, {"code", exit_code}, {"message", why}});
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
      stdin_pending_ = "\x04";
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
    drain(pty_, 1);
  } else {
    drain(out_, 1);
    drain(err_, 2);
  }
  end({{"type", "exit"}, {"code", status_.value_or(128 + SIGKILL)}});
}

void ExecSession::end(json message) {
  if (ended_) return;
  ended_ = true;
  ws_->send(json_text(message), false);
  ws_->close();
  boost::system::error_code ignored;
  stdin_.close(ignored);
  out_.close(ignored);
  err_.close(ignored);
  pty_.close(ignored);
  owner_.forget(id_);
}

// ---- Supervisor -------------------------------------------------------------

void Supervisor::load() {
  std::string bytes;
  if (int err = files::read_into(launch_file_, &bytes)) throw_errno("read " + launch_file_, err);
  launch_ = auth::decode(bytes);
  log_ = std::make_unique<logfile::Writer>(paths_.sandbox(launch_.sandbox_id) + "/logs/main.log");
  // A spec that cannot become a container (an unknown user, say) is a
  // failed start to report, not a supervisor that vanishes.
  try {
    spec_ = SandboxSpec::from_json(launch_.spec);
    spec::prepare_root(spec_, launch_.sandbox_id, paths_);
    container_spec_ = spec::container_spec_for(
        spec_, spec::sandbox_placement(launch_.sandbox_id, launch_.sandbox_name, paths_));
  } catch (const Error& e) {
    spec_error_ = e.what();
  }
}

// The launch file names the environment by its digest; the gateway's
// welcome carries the values, which must be the ones it signed.
void Supervisor::take_environment(const json& welcome) {
  const std::string want = auth::launch_env_digest(launch_.spec);
  if (want.empty() || !spec_error_.empty()) return;
  std::vector<std::string> env;
  if (welcome.contains("env") && welcome["env"].is_array())
    for (const auto& e : welcome["env"])
      if (e.is_string()) env.push_back(e.get<std::string>());
  if (auth::env_digest(env) != want) {
    spec_error_ = "the environment from the gateway does not match the launch file";
    return;
  }
  spec_.env = std::move(env);
  try {
    container_spec_ = spec::container_spec_for(
        spec_, spec::sandbox_placement(launch_.sandbox_id, launch_.sandbox_name, paths_));
  } catch (const Error& e) {
    spec_error_ = e.what();
  }
}

void Supervisor::fail_start(int code, const std::string& why) {
  state_ = State::kEnded;
  exit_code_ = code;
  reason_ = code == exit_code::kFailure ? "StartFailed" : "MainProcessFailed";
  message_ = why;
  log_->write("stderr", "openshell: " + why + "\n", logfile::now_ns());
  write_exit_file();
  finish_soon();
}

int Supervisor::run() {
  load();
  socket_path_ = paths_.supervisor_socket(launch_.sandbox_id, launch_.generation);
  listen_for_exec();
  signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (!ec) stop(kDefaultGraceMs);
  });
  // The sandbox starts once the gateway has accepted our launch file: a
  // superseded launch never runs anything.
  connect_session();
  // What a sandbox sends its proxy and DNS stub is served on this loop: a
  // handler that throws must not take the supervisor, and the sandbox, down.
  run_handling_exceptions(io_, "supervisor");
  ::unlink(socket_path_.c_str());
  return result_;
}

void Supervisor::start_container() {
  // Output goes to pipes we read into the log; input is empty.
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  container_spec_.stdin_fd = null.get();
  container_spec_.stdout_fd = out[1];
  container_spec_.stderr_fd = err[1];
  try {
    container_ = runtime::Container::start(container_spec_);
  } catch (const Error& e) {
    ::close(out[0]), ::close(out[1]), ::close(err[0]), ::close(err[1]);
    // The main process could not start: that is its exit.
    fail_start(e.exit_code(), e.what());
    return;
  }
  ::close(out[1]);
  ::close(err[1]);
  out_.assign(out[0]);
  err_.assign(err[0]);
  streams_open_ = 2;
  read_output(out_, "stdout");
  read_output(err_, "stderr");
  pidfd_.assign(::dup(container_->pidfd()));
  control_.assign(::dup(container_->control_fd()));
  watch_exit();
  watch_control();
  start_egress();
}

// The sandbox's egress proxy and DNS stub, with the network part of its policy.
void Supervisor::start_egress() {
  network_log_ = std::make_unique<logfile::RotatingFile>(paths_.sandbox(launch_.sandbox_id) +
                                                         "/logs/network.log");
  egress::Proxy::Options options;
  options.sandbox = launch_.sandbox_name;
  options.init_pid = container_->pid();
  options.audit = [this](const std::string& line) { audit(line); };
  proxy_ = std::make_unique<egress::Proxy>(io_, options);
  apply_policy(spec_.policy, launch_.policy_revision);
  proxy_->serve(container_->take_proxy_listener(), container_->take_dns_socket(),
                container_->take_diag_socket(), container_->take_connect_listener());
}

void Supervisor::apply_policy(const std::string& text, int64_t revision) {
  policy::Policy policy = text.empty() ? policy::default_policy() : policy::parse(text, "policy");
  const pid_t init = container_->pid();
  auto rules = std::make_shared<egress::NetworkRules>(egress::NetworkRules::compile(
      policy, [init](const std::string& path) { return egress::resolve_in_sandbox(init, path); }));
  proxy_->set_rules(std::move(rules), revision);
  log::debug("network policy revision " + std::to_string(revision) + " applied");
}

void Supervisor::audit(const std::string& line) {
  if (network_log_) network_log_->append(line + "\n");
}

void Supervisor::read_output(asio::posix::stream_descriptor& stream, const std::string& name) {
  auto buffer = std::make_shared<std::array<char, 16384>>();
  stream.async_read_some(asio::buffer(*buffer), [this, &stream, name, buffer](
                                                    const boost::system::error_code& ec, size_t n) {
    if (ec) {
      log_->flush_partial(name, logfile::now_ns());
      --streams_open_;
      maybe_exit();
      return;
    }
    log_->write(name, std::string_view(buffer->data(), n), logfile::now_ns());
    read_output(stream, name);
  });
}

void Supervisor::watch_exit() {
  pidfd_.async_wait(asio::posix::descriptor_base::wait_read,
                    [this](const boost::system::error_code& ec) {
                      if (ec) return;
                      container_ended(container_->wait());
                    });
}

void Supervisor::container_ended(int status) {
  state_ = State::kEnded;
  exit_code_ = status;
  if (stopped_) {
    reason_ = "Stopped";
    message_ = "stopped";
  } else if (status == 0) {
    reason_ = "MainProcessCompleted";
  } else {
    reason_ = "MainProcessFailed";
    message_ = container_->oom_kills() > 0
                   ? "killed at the memory limit"
                   : "the main process exited with status " + std::to_string(status);
  }
  if (container_->oom_kills() > 0)
    log_->write("stderr", "openshell: the sandbox ran out of memory at its --memory limit\n",
                logfile::now_ns());
  for (auto& [id, session] : std::map(execs_)) session->sandbox_gone();
  boost::system::error_code ignored;
  control_.close(ignored);
  write_exit_file();
  finish_soon();
}

void Supervisor::write_exit_file() {
  if (refused_) return;
  json record = {{"generation", launch_.generation},
                 {"state", stopped_ ? "stopped" : "exited"},
                 {"exit_code", exit_code_},
                 {"reason", reason_},
                 {"message", message_}};
  try {
    auth::write_file_atomically(paths_.sandbox(launch_.sandbox_id) + "/exit.json",
                                json_text(record));
  } catch (const Error& e) {
    log::error(e.what());
  }
}

void Supervisor::finish_soon() {
  // Report and go once the output is in the log; the exit file is the record
  // if the gateway cannot hear us (give it a few seconds to come back).
  report_status();
  exit_timer_.expires_after(std::chrono::milliseconds(3000));
  exit_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) io_.stop();
  });
  maybe_exit();
}

void Supervisor::maybe_exit() {
  if (state_ == State::kEnded && exit_reported_ && streams_open_ <= 0) io_.stop();
}

void Supervisor::watch_control() {
  control_.async_wait(
      asio::posix::descriptor_base::wait_read, [this](const boost::system::error_code& ec) {
        if (ec) return;
        std::string packet;
        int fds[3];
        long n = runtime::receive_packet(control_.native_handle(), &packet, fds);
        if (n <= 0 && n != -EAGAIN && n != -EINTR) return;  // the init is gone
        runtime::InitMessage m = runtime::parse_message(packet);
        uint64_t id = m.fields.empty() ? 0 : std::strtoull(m.fields[0].c_str(), nullptr, 10);
        auto it = execs_.find(id);
        if (it == execs_.end()) {
          for (int fd : fds)
            if (fd >= 0) ::close(fd);
        } else if (m.kind == runtime::InitMessage::Kind::kStarted) {
          it->second->started(fds[0]);
        } else if (m.kind == runtime::InitMessage::Kind::kFailed && m.fields.size() >= 4) {
          int code = std::atoi(m.fields[1].c_str());
          int err = std::atoi(m.fields[2].c_str());
          it->second->failed(code, m.fields[3] + ": " + std::strerror(err));
        } else if (m.kind == runtime::InitMessage::Kind::kExited && m.fields.size() >= 2) {
          it->second->exited(std::atoi(m.fields[1].c_str()));
        }
        watch_control();
      });
}

bool Supervisor::send_exec(const runtime::ExecRequest& request, const int* fds, int count) {
  if (state_ != State::kRunning || !control_.is_open()) return false;
  return runtime::send_packet(control_.native_handle(), runtime::encode_exec(request), fds,
                              count) == 0;
}

void Supervisor::kill_exec(uint64_t id, int sig) {
  if (!control_.is_open()) return;
  runtime::send_packet(control_.native_handle(),
                       runtime::make_message({"kill", std::to_string(id), std::to_string(sig)}),
                       nullptr, 0);
}

// The gateway hands exec connections over through a socket of ours.
void Supervisor::listen_for_exec() {
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) throw_errno("socket");
  UniqueFd sock(fd);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (socket_path_.size() >= sizeof addr.sun_path) throw Error(socket_path_ + ": path too long");
  std::strcpy(addr.sun_path, socket_path_.c_str());
  ::unlink(socket_path_.c_str());
  mode_t old = ::umask(0077);
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::umask(old);
  if (rc != 0) throw_errno("bind " + socket_path_);
  if (::listen(fd, 64) != 0) throw_errno("listen " + socket_path_);
  listener_.assign(sock.release());
  accept_exec();
}

void Supervisor::accept_exec() {
  listener_.async_wait(
      asio::posix::descriptor_base::wait_read, [this](const boost::system::error_code& ec) {
        if (ec) return;
        for (;;) {
          UniqueFd conn(::accept4(listener_.native_handle(), nullptr, nullptr, SOCK_CLOEXEC));
          if (!conn) break;
          // Only our own user (the gateway runs as us) may hand us connections.
          ucred cred{};
          socklen_t len = sizeof cred;
          if (::getsockopt(conn.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 ||
              cred.uid != ::geteuid())
            continue;
          // A sandbox of our uid could reach this socket too: only host processes hand over.
          if (std::string why = auth::peer_in_sandbox(conn.get()); !why.empty()) {
            log::error("exec handover refused (uid " + std::to_string(cred.uid) + "): " + why);
            continue;
          }
          std::string packet;
          int fds[3];
          long n = runtime::receive_packet(conn.get(), &packet, fds);
          for (int i = 1; i < 3; ++i)
            if (fds[i] >= 0) ::close(fds[i]);
          if (n <= 0 || fds[0] < 0) {
            if (fds[0] >= 0) ::close(fds[0]);
            continue;
          }
          runtime::InitMessage m = runtime::parse_message(packet);
          if (m.fields.size() != 1 || packet.rfind("handoff", 0) != 0) {
            ::close(fds[0]);
            continue;
          }
          std::string error;
          auto ws = net::WebSocket::accept_handed_over(io_, fds[0], m.fields[0], &error);
          if (!ws) {
            log::error("exec handover: " + error);
            continue;
          }
          uint64_t id = next_exec_++;
          auto session = std::make_shared<ExecSession>(io_, *this, ws, id);
          execs_[id] = session;
          session->start();
          if (state_ != State::kRunning) session->sandbox_gone();
        }
        accept_exec();
      });
}

void Supervisor::connect_session() {
  net::WebSocket::connect(
      io_, launch_.gateway_socket, "/v1/supervisor/session",
      [this](std::shared_ptr<net::WebSocket> ws, std::string) {
        if (!ws) {
          // The gateway is down or restarting: try again, a little slower each time.
          reconnect_timer_.expires_after(std::chrono::milliseconds(reconnect_ms_));
          reconnect_ms_ = std::min(reconnect_ms_ * 2, 1000);
          reconnect_timer_.async_wait([this](const boost::system::error_code& ec) {
            if (!ec) connect_session();
          });
          return;
        }
        reconnect_ms_ = 20;
        session_ = ws;
        session_welcome_ = false;
        std::weak_ptr<net::WebSocket> weak = ws;
        ws->start([this](std::string data, bool) { on_session_message(data); },
                  [this, weak](const std::string&) {
                    if (session_ == weak.lock()) session_.reset();
                    if (refused_) return;
                    if (state_ != State::kEnded) {
                      connect_session();
                    } else if (final_sent_) {
                      // The close went out after the final status: it was heard.
                      exit_reported_ = true;
                      maybe_exit();
                    } else {
                      connect_session();
                    }
                  });
        // The launch file is read afresh on every connection: it is our identity.
        std::string bytes;
        files::read_into(launch_file_, &bytes);
        ws->send(json_text(json{{"type", "hello"}, {"launch", bytes}, {"pid", ::getpid()}}), false);
      });
}

void Supervisor::on_session_message(const std::string& data) {
  json m = json::parse(data, nullptr, false);
  if (!m.is_object()) return;
  std::string type = m.value("type", "");
  if (type == "welcome") {
    session_welcome_ = true;
    if (!container_ && state_ == State::kRunning) {
      take_environment(m);
      if (spec_error_.empty())
        start_container();
      else
        fail_start(exit_code::kFailure, spec_error_);
    }
    report_status();
  } else if (type == "superseded" || type == "rejected") {
    // Another launch of this sandbox is current, or ours is not valid: end,
    // claiming nothing (the gateway has recorded why).
    log::error("the gateway refused this supervisor: " + m.value("message", type));
    result_ = exit_code::kFailure;
    refused_ = true;
    io_.stop();
  } else if (type == "stop") {
    stop(m.value("grace_ms", kDefaultGraceMs));
  } else if (type == "policy") {
    // A live update of the network part: the next connection sees it.
    int64_t revision = m.value("revision", int64_t{0});
    json ack = {{"type", "policy_applied"}, {"revision", revision}};
    try {
      if (proxy_) apply_policy(m.value("text", std::string()), revision);
      spec_.policy = m.value("text", std::string());
    } catch (const std::exception& e) {
      ack["error"] = e.what();
    }
    if (session_) session_->send(json_text(ack), false);
  }
}

void Supervisor::report_status() {
  if (!session_ || !session_welcome_) return;
  json status = {{"type", "status"}, {"generation", launch_.generation}};
  if (state_ == State::kEnded) {
    status["state"] = stopped_ ? "stopped" : "exited";
    status["exit_code"] = exit_code_;
    status["reason"] = reason_;
    status["message"] = message_;
    final_sent_ = true;
    session_->send(json_text(status), false);
    session_->close();
  } else {
    status["state"] = "running";
    // The gateway waits for it to be gone before it removes the sandbox.
    status["init_pid"] = container_ ? container_->pid() : 0;
    session_->send(json_text(status), false);
  }
}

void Supervisor::stop(int grace_ms) {
  if (state_ == State::kEnded) {
    finish_soon();
    return;
  }
  if (state_ == State::kStopping) return;
  if (!container_) {
    // Stopped before it ever started.
    stopped_ = true;
    state_ = State::kEnded;
    reason_ = "Stopped";
    write_exit_file();
    finish_soon();
    return;
  }
  state_ = State::kStopping;
  stopped_ = true;
  container_->signal(SIGTERM);
  stop_timer_.expires_after(std::chrono::milliseconds(grace_ms));
  stop_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && state_ != State::kEnded) container_->signal(SIGKILL);
  });
}

}  // namespace

int main(const std::string& launch_file) {
  // A write to a peer that has gone (a reset tunnel: splice() does not take
  // MSG_NOSIGNAL) is an error for that connection, never the end of the
  // supervisor. The sandbox's processes get their signals' defaults back.
  ::signal(SIGPIPE, SIG_IGN);
  process_name::set_comm(process_name::kSupervisorComm);
  try {
    asio::io_context io;
    Supervisor supervisor(io, launch_file);
    return supervisor.run();
  } catch (const std::exception& e) {
    log::error(std::string("supervisor: ") + e.what());
    return exit_code::kFailure;
  }
}

}  // namespace openshell::supervisor
