// The supervisor's lifecycle: its launch file read, the container started,
// its end recorded and reported, and the process's main loop.
#include "supervisor/supervisor.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <map>

#include "auth/secrets.h"
#include "base/error.h"
#include "base/event_loop.h"
#include "base/files.h"
#include "base/log.h"
#include "base/process_name.h"
#include "base/time.h"
#include "runtime/init_image.h"
#include "spec/container_spec.h"
#include "spec/sandbox_spec.h"
#include "supervisor/exec_session.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

namespace {

// The image of the init the gateway handed down (its fd's number in the
// environment), kept from here on close-on-exec; invalid if none came.
UniqueFd adopt_init_image() {
  const char* value = std::getenv(runtime::kInitImageFdVariable);
  if (!value) return {};
  const int fd = std::atoi(value);
  ::unsetenv(runtime::kInitImageFdVariable);
  if (fd > 2 && runtime::is_init_image(fd) && ::fcntl(fd, F_SETFD, FD_CLOEXEC) == 0)
    return UniqueFd(fd);
  log::warn("fd " + std::string(value) +
            " from the gateway is no image of the init: the sandbox gets one of its own");
  return {};
}

}  // namespace

void Supervisor::load() {
  std::string bytes;
  if (int err = files::read_into(launch_file_, &bytes)) throw_errno("read " + launch_file_, err);
  launch_ = auth::decode(bytes);
  log_ = std::make_unique<logfile::Writer>(paths_.sandbox(launch_.sandbox_id) + "/logs/main.log");
  // A spec that cannot become a container (an unknown user, say) is a
  // failed start to report, not a supervisor that vanishes.
  try {
    spec_ = SandboxSpec::from_json(launch_.spec);
    // The CA and its bundle come with the welcome (take_ca).
    spec::prepare_root(spec_, launch_.sandbox_id, paths_);
    container_spec_ = spec::container_spec_for(
        spec_, spec::sandbox_placement(launch_.sandbox_id, launch_.sandbox_name, paths_));
  } catch (const Error& e) {
    spec_error_ = e.what();
  }
}

// The launch file names the environment by its digest; the gateway's
// welcome carries the values, which must be the ones it signed.
void Supervisor::take_environment(const std::vector<std::string>& env) {
  const std::string want = auth::launch_env_digest(launch_.spec);
  if (want.empty() || !spec_error_.empty()) return;
  if (auth::env_digest(env) != want) {
    spec_error_ = "the environment from the gateway does not match the launch file";
    return;
  }
  spec_.env = env;
  try {
    container_spec_ = spec::container_spec_for(
        spec_, spec::sandbox_placement(launch_.sandbox_id, launch_.sandbox_name, paths_));
  } catch (const Error& e) {
    spec_error_ = e.what();
  }
}

// The sandbox's CA for this start: the gateway's, from the welcome (it has
// written the bundle), or, from a gateway that sent none, one made here with
// its bundle. A micro-VM's guest does not get the bundle yet: no CA for it.
void Supervisor::take_ca(std::string cert_pem, std::string key_pem) {
  if (spec_.vm || !spec_error_.empty()) return;
  try {
    if (!key_pem.empty()) {
      ca_ = std::make_unique<egress::tls::SandboxCa>(std::move(cert_pem), std::move(key_pem));
      return;
    }
    ca_ = std::make_unique<egress::tls::SandboxCa>(launch_.sandbox_name);
    spec::write_ca_bundle(spec_, paths_.sandbox(launch_.sandbox_id), ca_->cert_pem());
  } catch (const Error& e) {
    spec_error_ = e.what();
  }
}

void Supervisor::fail_start(int code, const std::string& why) {
  state_ = State::kEnded;
  exit_code_ = code;
  reason_ = code == exit_code::kFailure ? "StartFailed" : "MainProcessFailed";
  message_ = why;
  log_->write("stderr", "openshell: " + why + "\n", time::now_ns());
  write_exit_file();
  finish_soon();
}

int Supervisor::run() {
  init_image_ = adopt_init_image();
  load();
  socket_path_ = paths_.supervisor_socket(launch_.sandbox_id, launch_.generation);
  signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (!ec) stop(kDefaultGraceMs);
  });
  // The sandbox starts, and its exec socket listens, once the gateway has
  // accepted our launch file: a superseded launch never runs anything, nor
  // touches the socket's path, which is the current supervisor's.
  connect_session();
  // What a sandbox sends its proxy and DNS stub is served on this loop: a
  // handler that throws must not take the supervisor, and the sandbox, down.
  run_handling_exceptions(io_, "supervisor");
  if (listener_.is_open()) ::unlink(socket_path_.c_str());
  return result_;
}

void Supervisor::start_container() {
  if (spec_.vm) return start_vm();
  // Output goes to pipes we read into the log, or with --tty to the
  // terminal's master side, which `sandbox connect` writes the input to;
  // without a terminal input is empty.
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!init_image_) init_image_ = runtime::make_init_image();
  container_spec_.init_image_fd = init_image_.get();
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
  if (container_->tty_master() >= 0) {
    ::close(out[0]);
    ::close(err[0]);
    const int master = container_->tty_master();
    out_.assign(::fcntl(master, F_DUPFD_CLOEXEC, 3));
    console_.set_terminal(master);
    streams_open_ = 1;
    read_output(out_, "stdout");
  } else {
    out_.assign(out[0]);
    err_.assign(err[0]);
    streams_open_ = 2;
    read_output(out_, "stdout");
    read_output(err_, "stderr");
  }
  console_.set_refusal(container_spec_.argv.empty()
                           ? "sandbox '" + launch_.sandbox_name +
                                 "' has no main process (it was created without a command and "
                                 "without --tty): run one with 'openshell sandbox exec " +
                                 launch_.sandbox_name + " -- sh'"
                           : "");
  pidfd_.assign(::dup(container_->pidfd()));
  control_.assign(::dup(container_->control_fd()));
  watch_exit();
  watch_control();
  start_egress();
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
  if (copy_) return copy_container_gone();
  if (stopped_) {
    reason_ = "Stopped";
    message_ = "stopped";
  } else if (status == 0) {
    reason_ = "MainProcessCompleted";
  } else {
    reason_ = "MainProcessFailed";
    message_ = container_ && container_->oom_kills() > 0
                   ? "killed at the memory limit"
                   : "the main process exited with status " + std::to_string(status);
  }
  if (container_->oom_kills() > 0)
    log_->write("stderr", "openshell: the sandbox ran out of memory at its --memory limit\n",
                time::now_ns());
  // What the init reported before it ended (an exec's exit, say) may still
  // wait in the channel, behind the end this handler saw first.
  if (control_.is_open()) {
    const int fd = control_.native_handle();
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    while (read_control() > 0) {
    }
  }
  for (auto& [id, session] : std::map(execs_)) session->sandbox_gone();
  console_.ended(status, streams_open_ <= 0);
  // Its forwards' listeners close with it: a connection to one is refused
  // by the host's kernel, not accepted and dropped.
  fail_socket_requests("the sandbox has ended");
  if (forwards_) forwards_->close_all();
  boost::system::error_code ignored;
  control_.close(ignored);
  write_exit_file();
  finish_soon();
}

void Supervisor::write_exit_file() {
  if (refused_) return;
  try {
    files::write_atomically(paths_.sandbox(launch_.sandbox_id) + "/exit.json",
                            protocol::session::encode_exit_file(status()));
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
  // An attached client is sent the main process's status first.
  if (state_ == State::kEnded && exit_reported_ && streams_open_ <= 0 && console_.idle())
    io_.stop();
}

void Supervisor::stop(int grace_ms) {
  if (state_ == State::kEnded) {
    finish_soon();
    return;
  }
  if (state_ == State::kStopping) return;
  if (vm_) {
    state_ = State::kStopping;
    stopped_ = true;
    vm_->stop(grace_ms);
    return;
  }
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
