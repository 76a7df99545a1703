// The supervisor's state, shared by its jobs: each job (the lifecycle, the
// session to the gateway, the exec relay, log capture, the egress proxy)
// lives in a file of its own and works on this one object.
#pragma once

#include <signal.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "auth/launch.h"
#include "base/logfile.h"
#include "base/paths.h"
#include "base/unique_fd.h"
#include "egress/proxy.h"
#include "egress/tls.h"
#include "protocol/supervisor_session.h"
#include "runtime/container.h"
#include "runtime/init_protocol.h"
#include "spec/sandbox_spec.h"
#include "supervisor/console.h"
#include "supervisor/forwards.h"
#include "supervisor/guest_vm.h"

namespace openshell::net {
class WebSocket;
}

namespace openshell::supervisor {

namespace asio = boost::asio;

inline constexpr int kDefaultGraceMs = 10000;

class ExecSession;
class GuestExec;

class Supervisor {
 public:
  // copy: a copy supervisor (see supervisor.h), not the sandbox's own.
  Supervisor(asio::io_context& io, std::string launch_file, bool copy = false, int ready_fd = -1)
      : io_(io),
        launch_file_(std::move(launch_file)),
        copy_(copy),
        ready_fd_(ready_fd),
        paths_(Paths::resolve()),
        pidfd_(io),
        out_(io),
        err_(io),
        control_(io),
        listener_(io),
        signals_(io, SIGTERM, SIGINT, SIGHUP),
        reconnect_timer_(io),
        stop_timer_(io),
        exit_timer_(io),
        idle_timer_(io),
        console_(io, [this] { maybe_exit(); }) {}

  int run();
  // A copy supervisor's life (copy.cc).
  int run_copy();
  // For exec sessions.
  bool send_exec(const runtime::ExecRequest& request, const int* fds, int count);
  void kill_exec(uint64_t id, int sig);
  void forget(uint64_t id) { execs_.erase(id); }
  // An exec's WebSocket has closed (copy.cc: a copy supervisor's ends then).
  void exec_closed();
  // A copy supervisor serves only the tar of a download or an upload.
  bool copy_only() const { return copy_; }
  // Why a copy supervisor does not run this (copy.cc); "" when it does.
  std::string copy_refusal(const std::vector<std::string>& argv, bool tty) const;
  const runtime::ContainerSpec& container_spec() const { return container_spec_; }
  // The CA this start of the sandbox trusts, for the proxy to sign with;
  // null for a micro-VM, or when the spec could not become a container.
  egress::tls::SandboxCa* sandbox_ca() const { return ca_.get(); }
  // exec --user: the ids it names, by the sandbox's rule (spec::exec_user);
  // none when they are the sandbox's own. Throws Error naming what is wrong.
  std::optional<runtime::ExecUser> exec_user(const std::string& user) const;
  // The latest credentials of the sandbox's providers, from the gateway's
  // welcome or its credentials message (for the proxy's substitution). Held
  // in memory only, never logged.
  const std::vector<protocol::session::Credential>& credentials() const { return credentials_; }

 private:
  // supervisor.cc: the lifecycle.
  void load();
  void start_container();
  void watch_exit();
  void stop(int grace_ms);
  void container_ended(int status);
  void write_exit_file();
  void finish_soon();
  void maybe_exit();
  void fail_start(int code, const std::string& why);
  void take_environment(const std::vector<std::string>& env);
  void take_ca(std::string cert_pem, std::string key_pem);
  // output.cc: log capture.
  void read_output(asio::posix::stream_descriptor& stream, const std::string& name);
  // exec_relay.cc: handed-over exec connections and the init's control channel.
  void watch_control();
  long read_control();  // one report from the init: receive_packet's result
  void listen_for_exec();
  void accept_exec();
  // gateway_session.cc: the session to the gateway.
  void connect_session();
  void on_session_message(const std::string& data);
  void report_status();
  protocol::session::Status status() const;
  // port_forwards.cc: port forwards (forwards.h), relayed by this process.
  void apply_forwards(const std::vector<protocol::session::Forward>& forwards);
  void report_forwards();
  // An unconnected TCP socket of the sandbox's network namespace, made by
  // its init (runtime/init_protocol.h), to `done`; or none and why.
  void sandbox_socket(std::function<void(UniqueFd, const std::string&)> done);
  void socket_made(const runtime::InitMessage& message, PacketFds& fds);
  void fail_socket_requests(const std::string& why);
  // egress.cc: the sandbox's proxy and DNS stub.
  void start_egress();
  void apply_policy(const std::string& text, int64_t revision);
  // The providers' credentials to the proxy (credentials_), for the next
  // request it inspects.
  void apply_credentials();
  void audit(const std::string& line);

  // vm_lifecycle.cc: a --vm sandbox's VM, in place of the container.
  void start_vm();
  void start_guest_exec(std::shared_ptr<net::WebSocket> ws);
  void vm_ended(int vmm_status, const std::string& last_line);
  // egress.cc: a VM's proxy, served through the guest's vsock connections.
  void start_vm_egress();
  void guest_connection(uint32_t host_port, UniqueFd fd);

  // copy.cc: a copy supervisor's start and end.
  void start_copy_container();
  void copy_ready(const std::string& line);
  void copy_container_gone();
  // vm_lifecycle.cc: a micro-VM's copy, its VM booted without a main
  // process or a network.
  void start_copy_vm();

  asio::io_context& io_;
  std::string launch_file_;
  const bool copy_;
  int ready_fd_;        // a copy supervisor's report to the gateway: "ready", or "error WHY"
  UniqueFd copy_lock_;  // sandboxes/<id>/copy.lock, held while a copy supervisor lives
  int open_execs_ = 0;  // a copy supervisor's exec WebSockets not yet closed
  Paths paths_;
  auth::LaunchSpec launch_;
  SandboxSpec spec_;
  runtime::ContainerSpec container_spec_;
  // The gateway's image of the init's program (runtime/init_image.h), handed
  // down at the spawn; else one of our own, else none (this binary).
  UniqueFd init_image_;
  // Made at each start, before the container; its key never leaves this
  // process (only its certificate goes into the sandbox's CA bundle).
  std::unique_ptr<egress::tls::SandboxCa> ca_;
  std::unique_ptr<runtime::Container> container_;
  std::unique_ptr<GuestVm> vm_;      // a --vm sandbox's, in place of container_
  bool vm_ready_ = false;            // the guest's init said `ready`
  std::optional<int> guest_status_;  // the main process's, as the guest's init reported it
  std::optional<std::pair<int, std::string>> guest_failure_;  // why it could not start
  std::unique_ptr<logfile::Writer> log_;
  asio::posix::stream_descriptor pidfd_, out_, err_, control_, listener_;
  asio::signal_set signals_;
  asio::steady_timer reconnect_timer_, stop_timer_, exit_timer_, idle_timer_;
  std::shared_ptr<net::WebSocket> session_;
  bool session_welcome_ = false;
  std::vector<protocol::session::Credential> credentials_;
  int reconnect_ms_ = 20;
  std::map<uint64_t, std::shared_ptr<ExecSession>> execs_;
  std::map<uint64_t, std::shared_ptr<GuestExec>> guest_execs_;  // a --vm sandbox's
  uint64_t next_exec_ = 1;
  std::string socket_path_;
  std::string spec_error_;  // why the spec cannot become a container
  std::unique_ptr<egress::Proxy> proxy_;
  std::vector<protocol::session::Forward> forwards_wanted_;  // the gateway's latest set
  std::unique_ptr<ForwardSet> forwards_;
  std::map<uint64_t, std::function<void(UniqueFd, const std::string&)>> socket_requests_;
  uint64_t next_socket_ = 1;
  std::unique_ptr<logfile::RotatingFile> network_log_;  // the proxy's decisions
  // The main process's output for `sandbox connect`, and its terminal.
  Console console_;

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

}  // namespace openshell::supervisor
