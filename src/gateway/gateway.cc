#include "gateway/gateway.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "auth/launch.h"
#include "auth/peer.h"
#include "auth/secrets.h"
#include "base/directory.h"
#include "base/error.h"
#include "base/event_loop.h"
#include "base/files.h"
#include "base/json_text.h"
#include "base/log.h"
#include "base/paths.h"
#include "base/process_name.h"
#include "base/random.h"
#include "base/sandbox_limits.h"
#include "base/text.h"
#include "base/time.h"
#include "gateway/config.h"
#include "gateway/log_window.h"
#include "gateway/restart_policy.h"
#include "gateway/selector.h"
#include "gateway/store.h"
#include "image/store.h"
#include "net/http.h"
#include "policy/edit.h"
#include "policy/policy.h"
#include "protocol/exec_handoff.h"
#include "protocol/supervisor_session.h"
#include "runtime/cleanup.h"
#include "runtime/host_ids.h"
#include "spec/container_spec.h"
#include "spec/sandbox_spec.h"

extern char** environ;

namespace openshell::gateway {

namespace asio = boost::asio;
using nlohmann::json;

namespace {

constexpr int kStopGraceMs = 10000;
constexpr auto kWaitTimeout = std::chrono::seconds(60);

using time::now_ms;

// ---- processes --------------------------------------------------------------

// Start time of a process (clock ticks since boot, /proc/PID/stat field 22),
// 0 when it does not exist or has ended (a zombie: killed while its parent,
// a gateway, was gone, and not yet reaped).
uint64_t start_time(pid_t pid) {
  auto stat = files::try_read("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return 0;
  size_t paren = stat->rfind(')');
  if (paren == std::string::npos) return 0;
  auto fields = text::split(std::string_view(*stat).substr(paren + 2), ' ');
  // After ") ": field 3 (state) is index 0, so field 22 is index 19.
  if (fields.size() < 20 || fields[0] == "Z" || fields[0] == "X") return 0;
  return text::parse_uint(fields[19]).value_or(0);
}

bool alive(int64_t pid, uint64_t started) {
  return pid > 0 && started != 0 && start_time(static_cast<pid_t>(pid)) == started;
}

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

json error_body(const std::string& code, const std::string& message) {
  return json{{"error", {{"code", code}, {"message", message}}}};
}

net::Response error_response(int status, const std::string& code, const std::string& message) {
  return net::Response{status, json_text(error_body(code, message)) + "\n", "application/json"};
}

net::Response json_response(int status, const json& body) {
  return net::Response{status, json_text(body) + "\n", "application/json"};
}

// An error the API answers with a status and a code.
struct ApiError : Error {
  int status;
  std::string code;
  ApiError(int s, std::string c, const std::string& message)
      : Error(message), status(s), code(std::move(c)) {}
};

// The configuration file's identity before it is read (a change after that
// is read again), and what it says.
GatewayConfig load_config_noting(const std::string& path, struct stat* st) {
  if (::stat(path.c_str(), st) != 0) *st = {};
  return load_config(path, std::getenv);
}

bool finished(Phase phase) {
  return phase == Phase::kCompleted || phase == Phase::kError || phase == Phase::kStopped;
}

// ---- the gateway ------------------------------------------------------------

class Gateway {
 public:
  // A bad configuration stops the gateway here, saying what is wrong.
  Gateway(asio::io_context& io, Paths paths)
      : io_(io),
        paths_(std::move(paths)),
        config_(load_config_noting(config_path(paths_, ::geteuid(), std::getenv), &config_stat_)),
        signals_(io, SIGTERM, SIGINT),
        server_(
            io, [this](std::shared_ptr<net::Exchange> e) { handle(std::move(e)); },
            config_.api_limits()) {}

  void start();

 private:
  struct Waiter {
    std::function<bool(const SandboxRecord*)> done;  // nullptr record: the sandbox is gone
    std::function<void(const SandboxRecord*)> callback;
    std::shared_ptr<asio::steady_timer> timer;
  };

  struct Supervised {
    int64_t pid = 0;
    std::shared_ptr<asio::posix::stream_descriptor> pidfd;
    std::shared_ptr<net::WebSocket> session;
    int64_t generation = 0;
    bool final_status = false;  // the supervisor reported the end
    int64_t init_pid = 0;       // the sandbox's PID 1, as the supervisor reported it
    uint64_t init_start = 0;
  };

  // API
  void handle(std::shared_ptr<net::Exchange> exchange);
  void route(const std::shared_ptr<net::Exchange>& exchange);
  json view(const SandboxRecord& record) const;
  void release_id_range(const SandboxRecord& record) const;
  SandboxRecord find(const std::string& name) const;

  void create(const std::shared_ptr<net::Exchange>& exchange);
  void start_sandbox(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void stop_sandbox(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void delete_sandbox(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void wait_exit(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void logs(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void exec(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void session(const std::shared_ptr<net::Exchange>& exchange);
  void watch(const std::shared_ptr<net::Exchange>& exchange);
  void get_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void list_policies(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void set_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);

  // Lifecycle
  void save(SandboxRecord& record);
  void set_phase(SandboxRecord& record, Phase phase, const std::string& reason = "",
                 const std::string& message = "");
  void launch(SandboxRecord& record);
  void mint_launch_file(const SandboxRecord& record, const std::string& file);
  pid_t spawn_supervisor(const SandboxRecord& record, const std::string& launch_file,
                         const std::vector<std::string>& extra, int report_fd);
  // Hands an exec's connection to the supervisor listening at socket_path.
  void hand_exec_over(const std::shared_ptr<net::Exchange>& exchange,
                      const std::string& socket_path, const std::string& name);
  // Downloads and uploads of a sandbox that is not running: a copy
  // supervisor each (supervisor/supervisor.h), one at a time; while one
  // lives (ours, or one a gateway before us started: its lock tells) the
  // sandbox is not started, deleted or copied again.
  void copy_exec(const std::shared_ptr<net::Exchange>& exchange, const SandboxRecord& record);
  bool copy_in_progress(const std::string& id) const;
  // Throws ApiError 409 "busy" while a copy is in progress (one a gateway
  // before us started: ours are waited for, below).
  void refuse_if_copying(const SandboxRecord& record, const std::string& verb) const;
  // While a copy supervisor of ours lives: the request is handled again
  // once it has ended (true); false when there is none.
  bool after_copy(const std::shared_ptr<net::Exchange>& exchange, const std::string& id);
  // A new generation of a sandbox whose run is over: the old supervisor
  // gone, the launch recorded (Starting, with this reason), then done.
  void relaunch(SandboxRecord& record, const std::string& reason = "",
                const std::string& message = "");
  // At the gateway's start: a sandbox meant to run whose supervisor was
  // gone, settled now, starts again if its restart policy says so.
  void restart_if_meant_to(const std::string& id);
  void watch_supervisor(const std::string& id, int64_t pid, int64_t generation);
  void supervisor_exited(const std::string& id, int64_t generation);
  // Runs `then` once the sandbox's own processes are gone too (its init dies
  // with its supervisor, a moment later).
  void after_sandbox_gone(int64_t init_pid, uint64_t init_start, std::function<void()> then);
  void apply_final(SandboxRecord& record, const protocol::session::Status& status);
  void on_hello(const std::shared_ptr<net::WebSocket>& ws, const protocol::session::Hello& hello,
                std::string* sandbox_id);
  void on_session_message(const std::string& id, const protocol::session::ToGateway& message);
  void request_stop(SandboxRecord& record);
  void finish_delete(const std::string& id);
  // An image reference in spec->from: its layers and config (command,
  // environment) into the spec. Throws ApiError (404 for an unknown image).
  void resolve_image(SandboxSpec* spec);
  // Overlayfs, or a copy of the root where overlayfs cannot stack it here.
  void choose_storage(SandboxSpec* spec, const std::string& id);
  void cleanup_host(const SandboxRecord& record);
  void reconcile();
  void wait_for(const std::string& id, std::function<bool(const SandboxRecord*)> done,
                std::function<void(const SandboxRecord*)> callback);
  void notify(const std::string& id);
  void shutdown();

  // The settings (gateway/config.h), read again when the file changes.
  const GatewayConfig& config();

  asio::io_context& io_;
  Paths paths_;
  struct stat config_stat_ {};  // the file as it was read (zeros: absent)
  GatewayConfig config_;        // before server_: the API's limits are its settings
  bool config_broken_ = false;  // the file changed and does not parse
  asio::signal_set signals_;
  net::Server server_;
  std::unique_ptr<Store> store_;
  bool overlay_checked_ = false;  // overlayfs worked for a sandbox's root here
  std::optional<auth::SigningKey> key_;
  std::optional<auth::SecretBox> secrets_;  // the env at rest (auth/secrets.h)
  void seal_secrets_at_rest();
  std::string gateway_id_;
  int64_t started_ms_ = now_ms();
  UniqueFd lock_;
  std::map<std::string, Supervised> supervised_;  // by sandbox id
  std::map<std::string, pid_t> copies_;           // copy supervisors, by sandbox id
  std::map<std::string, std::vector<std::function<void()>>> copy_waiters_;
  std::map<std::string, std::vector<Waiter>> waiters_;
  std::vector<std::weak_ptr<net::WebSocket>> watchers_;
  // The last view of recently deleted sandboxes (--no-keep ones vanish while
  // their creator still waits for the exit status).
  std::map<std::string, json> gone_;
  // Log followers by sandbox id: woken by a phase change, not only by their timer.
  std::map<std::string, std::vector<std::weak_ptr<std::function<void()>>>> followers_;
  // Policy updates waiting for their supervisor's acknowledgement, by
  // sandbox id and revision (two `policy set`s may be in flight at once).
  std::map<std::pair<std::string, int64_t>,
           std::function<void(const protocol::session::PolicyApplied&)>>
      policy_acks_;
};

// The sandboxes' env sealed in the store, and out of the launch files,
// including what an older gateway left in plain text.
void Gateway::seal_secrets_at_rest() {
  secrets_.emplace(auth::SecretBox::for_gateway(*key_));
  const auth::SecretBox* box = &*secrets_;
  auto seal = [box](const std::string& id, const std::string& spec) {
    return auth::seal_spec_env(*box, id, spec);
  };
  auto open = [box](const std::string& id, const std::string& spec) {
    try {
      return auth::open_spec_env(*box, id, spec);
    } catch (const Error& e) {
      // Sealed under another key (keys/ was replaced) or changed: the
      // sandbox stays usable, without its environment.
      log::warn("sandbox " + id + ": its environment is lost: " + e.what());
      json j = json::parse(spec, nullptr, false);
      if (!j.is_object()) return spec;
      j.erase("env_sealed");
      return j.dump();
    }
  };
  store_->set_spec_codec({seal, open, auth::spec_env_in_plain});
  if (size_t n = store_->reseal_specs())
    log::warn("sealed the environment of " + std::to_string(n) + " sandboxes at rest");
  for (const auto& record : store_->list()) {
    try {
      auth::strip_launch_file_env(paths_.launch_file(record.id), *key_);
    } catch (const Error& e) {
      log::warn("sandbox " + record.id + ": " + e.what());
    }
  }
}

void Gateway::start() {
  paths_.ensure();
  // One gateway per state directory.
  lock_.reset(::open(paths_.lock().c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600));
  if (!lock_) throw_errno("open " + paths_.lock());
  if (::flock(lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) throw Error("another gateway is running for " + paths_.state_dir);
    throw_errno("lock " + paths_.lock());
  }
  store_ = Store::open(paths_.db());
  key_.emplace(auth::SigningKey::load_or_create(paths_.key()));
  gateway_id_ = key_->id();
  seal_secrets_at_rest();
  store_->set_meta("gateway_id", gateway_id_);
  reconcile();
  // A sandbox running as our uid passes the socket's mode: the pid namespace tells.
  server_.set_admission([](int fd, const net::PeerCredentials&) -> std::optional<net::Refusal> {
    std::string why = auth::peer_in_sandbox(fd);
    if (why.empty()) return std::nullopt;
    return net::Refusal{403, "peer_in_sandbox",
                        "the gateway serves no process inside a sandbox: " + why};
  });
  server_.listen(paths_.socket(), 0600);
  signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (!ec) shutdown();
  });
  log::error("gateway " + gateway_id_ + " serving on " + paths_.socket() + " (pid " +
             std::to_string(::getpid()) + ")");
}

void Gateway::shutdown() {
  // Supervisors keep running; they reconnect to the next gateway.
  server_.close();
  for (auto& [id, s] : supervised_) {
    if (s.session) s.session->close("gateway stopping");
    if (s.pidfd) s.pidfd->cancel();
  }
  for (auto& [id, list] : waiters_)
    for (auto& w : list)
      if (w.timer) w.timer->cancel();
  signals_.cancel();
  asio::post(io_, [this] { io_.stop(); });
}

// ---- state ------------------------------------------------------------------

const GatewayConfig& Gateway::config() {
  struct stat now {};
  if (::stat(config_.path.c_str(), &now) != 0) now = {};
  if (config_broken_ || now.st_ino != config_stat_.st_ino || now.st_dev != config_stat_.st_dev ||
      now.st_size != config_stat_.st_size || now.st_mtim.tv_sec != config_stat_.st_mtim.tv_sec ||
      now.st_mtim.tv_nsec != config_stat_.st_mtim.tv_nsec) {
    GatewayConfig fresh;
    try {
      fresh = load_config_noting(config_.path, &config_stat_);
    } catch (const Error& e) {
      config_broken_ = true;  // read it again next time
      // Until the file is right again, what needs it fails, saying why.
      throw ApiError(500, "bad_config", e.what());
    }
    // The API's limits hold from the gateway's start.
    fresh.header_timeout_ms = config_.header_timeout_ms;
    fresh.body_timeout_ms = config_.body_timeout_ms;
    fresh.idle_timeout_ms = config_.idle_timeout_ms;
    fresh.max_connections_per_uid = config_.max_connections_per_uid;
    config_ = std::move(fresh);
    config_broken_ = false;
  }
  return config_;
}

void Gateway::save(SandboxRecord& record) {
  record.updated_ms = now_ms();
  store_->update(record);
  notify(record.id);
}

void Gateway::set_phase(SandboxRecord& record, Phase phase, const std::string& reason,
                        const std::string& message) {
  const int64_t now = now_ms();
  auto condition = [&](const std::string& type, const std::string& status, const std::string& why,
                       const std::string& text) {
    for (auto& c : record.conditions)
      if (c.type == type) {
        if (c.status != status || c.reason != why || c.message != text)
          c = Condition{type, status, why, text, c.status != status ? now : c.last_transition_ms};
        return;
      }
    record.conditions.push_back(Condition{type, status, why, text, now});
  };
  record.phase = phase;
  switch (phase) {
    case Phase::kReady:
      condition("Ready", "True", "SupervisorConnected", "");
      break;
    case Phase::kProvisioning:
    case Phase::kStarting:
      condition("Ready", "False", reason.empty() ? "SupervisorNotConnected" : reason, message);
      break;
    default:
      condition("Ready", "False", reason, message);
      break;
  }
  store_->append_event(record.id, "Phase",
                       std::string(phase_name(phase)) +
                           (reason.empty() ? "" : " (" + reason + ")") +
                           (message.empty() ? "" : ": " + message),
                       now);
  save(record);
}

json Gateway::view(const SandboxRecord& r) const {
  json conditions = json::array();
  for (const auto& c : r.conditions)
    conditions.push_back({{"type", c.type},
                          {"status", c.status},
                          {"reason", c.reason},
                          {"message", c.message},
                          {"last_transition_time", time::format_ms(c.last_transition_ms)}});
  SandboxSpec spec = SandboxSpec::from_json(r.spec);
  json j = {{"name", r.name},
            {"id", r.id},
            {"phase", std::string(phase_name(r.phase))},
            {"generation", r.generation},
            {"conditions", conditions},
            {"created_at", time::format_ms(r.created_ms)},
            {"labels", r.labels},
            {"from", spec.from},
            {"command", spec.command}};
  if (spec.image)
    j["image"] = {
        {"name", spec.image->name}, {"id", spec.image->id}, {"digest", spec.image->digest}};
  j["storage"] = spec.from == "host" ? "host" : spec.storage.empty() ? "overlay" : spec.storage;
  if (!spec.storage_note.empty()) j["storage_note"] = spec.storage_note;
  j["limits"] = json::parse(spec.limits_json());
  j["restart"] = spec.restart.empty() ? "unless-stopped" : spec.restart;
  // What create was given that the sandbox keeps across its starts.
  json binds = json::array();
  for (const auto& b : spec.binds)
    binds.push_back({{"source", b.source}, {"target", b.target}, {"read_only", b.read_only}});
  j["binds"] = binds;
  if (!spec.user.empty()) j["user"] = spec.user;
  if (!spec.ca_certs.empty()) j["ca_certs"] = spec.ca_certs.size();
  if (r.exit_code) j["exit_code"] = *r.exit_code;
  return j;
}

// Once its files are gone, the sandbox's host ids may go to another.
void Gateway::release_id_range(const SandboxRecord& record) const {
  SandboxSpec spec = SandboxSpec::from_json(record.spec);
  if (spec.host_uid_start)
    runtime::release_sandbox_ids(*spec.host_uid_start, paths_.sandbox(record.id));
}

SandboxRecord Gateway::find(const std::string& name) const {
  auto record = store_->find_by_name(name);
  if (!record) throw ApiError(404, "not_found", "no sandbox named '" + name + "'");
  return *record;
}

void Gateway::wait_for(const std::string& id, std::function<bool(const SandboxRecord*)> done,
                       std::function<void(const SandboxRecord*)> callback) {
  auto current = store_->find_by_id(id);
  if (done(current ? &*current : nullptr)) return callback(current ? &*current : nullptr);
  Waiter waiter{std::move(done), std::move(callback), std::make_shared<asio::steady_timer>(io_)};
  waiter.timer->expires_after(kWaitTimeout);
  auto timer = waiter.timer;
  waiter.timer->async_wait([this, id, timer](const boost::system::error_code& ec) {
    if (ec) return;
    auto& list = waiters_[id];
    for (auto it = list.begin(); it != list.end(); ++it)
      if (it->timer == timer) {
        auto cb = std::move(it->callback);
        list.erase(it);
        auto record = store_->find_by_id(id);
        cb(record ? &*record : nullptr);  // the callback sees the state as it is
        return;
      }
  });
  waiters_[id].push_back(std::move(waiter));
}

void Gateway::notify(const std::string& id) {
  auto record = store_->find_by_id(id);
  // Watchers first: they see every change.
  json event = record ? json{{"type", "phase"}, {"sandbox", view(*record)}}
                      : json{{"type", "deleted"}, {"id", id}};
  std::string text = json_text(event);
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (auto ws = it->lock()) {
      ws->send(text, false);
      ++it;
    } else {
      it = watchers_.erase(it);
    }
  }
  if (auto f = followers_.find(id); f != followers_.end()) {
    for (auto& weak : f->second)
      if (auto poll = weak.lock())
        asio::post(io_, [poll] {
          if (*poll) (*poll)();
        });
    std::erase_if(f->second, [](const auto& weak) { return weak.expired(); });
    if (f->second.empty()) followers_.erase(f);
  }
  auto found = waiters_.find(id);
  if (found == waiters_.end()) return;
  std::vector<Waiter> ready;
  auto& list = found->second;
  for (auto it = list.begin(); it != list.end();) {
    if (it->done(record ? &*record : nullptr)) {
      ready.push_back(std::move(*it));
      it = list.erase(it);
    } else {
      ++it;
    }
  }
  if (list.empty()) waiters_.erase(found);
  for (auto& w : ready) {
    w.timer->cancel();
    w.callback(record ? &*record : nullptr);
  }
}

// ---- launching --------------------------------------------------------------

// Mints a launch file for the record's generation, at `file`.
void Gateway::mint_launch_file(const SandboxRecord& record, const std::string& file) {
  auth::LaunchSpec spec;
  spec.sandbox_id = record.id;
  spec.sandbox_name = record.name;
  spec.generation = record.generation;
  spec.nonce = random_hex(32);
  spec.auth_epoch = 1;
  spec.issued_at = now_ms() / 1000;
  auto current = store_->policy(record.id, 0);
  spec.policy_revision = current ? current->revision : 0;
  spec.gateway_id = gateway_id_;
  spec.gateway_socket = paths_.socket();
  spec.spec = auth::spec_for_launch_file(record.spec);  // the env's digest, not its values
  files::write_atomically(file, auth::encode(spec, *key_));
}

// Starts `openshell-supervisor NAME --launch FILE [extra...]`: a process of
// its own session, in nobody's process group, its output in the sandbox's
// log directory; report_fd (or -1) becomes its fd 3. Returns its pid.
pid_t Gateway::spawn_supervisor(const SandboxRecord& record, const std::string& launch_file,
                                const std::vector<std::string>& extra, int report_fd) {
  // This very binary, even if a newer one replaced it on disk since.
  std::string self = "/proc/self/exe";
  // Named for ps: "openshell-supervisor NAME" (base/process_name.h).
  std::vector<std::string> args = {std::string(process_name::kSupervisor), record.name, "--launch",
                                   launch_file};
  args.insert(args.end(), extra.begin(), extra.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin"};
  // Where state lives (as the gateway's own), and how the sandbox's DNS
  // resolves on the host (the gateway's configuration, its environment
  // over its file).
  for (const char* name : {"OPENSHELL_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "HOME"})
    if (const char* value = std::getenv(name))
      env_strings.push_back(std::string(name) + "=" + value);
  for (const auto& entry : config().supervisor_env()) env_strings.push_back(entry);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::string log_path = paths_.sandbox(record.id) + "/logs/supervisor.log";
  posix_spawn_file_actions_addopen(&actions, 1, log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND,
                                   0600);
  posix_spawn_file_actions_adddup2(&actions, 1, 2);
  if (report_fd >= 0) posix_spawn_file_actions_adddup2(&actions, report_fd, 3);
  // Nothing else of the gateway's (a descriptor someone forgot to mark
  // close-on-exec would keep a pipe or socket of the gateway open as long
  // as the sandbox lives).
  posix_spawn_file_actions_addclosefrom_np(&actions, report_fd >= 0 ? 4 : 3);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  pid_t pid;
  int err = ::posix_spawn(&pid, self.c_str(), &actions, &attr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  posix_spawnattr_destroy(&attr);
  if (err) throw_errno("start the supervisor", err);
  return pid;
}

// Mints the launch file for the record's generation and starts a supervisor.
void Gateway::launch(SandboxRecord& record) {
  const std::string file = paths_.launch_file(record.id);
  mint_launch_file(record, file);
  pid_t pid = spawn_supervisor(record, file, {}, -1);
  record.supervisor_pid = pid;
  record.supervisor_start = start_time(pid);
  save(record);
  watch_supervisor(record.id, pid, record.generation);
}

void Gateway::watch_supervisor(const std::string& id, int64_t pid, int64_t generation) {
  int fd = pidfd_open(static_cast<pid_t>(pid));
  Supervised& s = supervised_[id];
  if (s.pidfd) s.pidfd->cancel();
  s.pid = pid;
  s.generation = generation;
  s.final_status = false;
  if (fd < 0) {
    // Already gone.
    asio::post(io_, [this, id, generation] { supervisor_exited(id, generation); });
    return;
  }
  auto desc = std::make_shared<asio::posix::stream_descriptor>(io_, fd);
  s.pidfd = desc;
  desc->async_wait(asio::posix::descriptor_base::wait_read,
                   [this, id, generation, pid, desc](const boost::system::error_code& ec) {
                     if (ec) return;
                     // Reap it if it is our child (it is not after a gateway restart).
                     int status;
                     ::waitpid(static_cast<pid_t>(pid), &status, WNOHANG);
                     supervisor_exited(id, generation);
                   });
}

void Gateway::after_sandbox_gone(int64_t init_pid, uint64_t init_start,
                                 std::function<void()> then) {
  if (!alive(init_pid, init_start)) return then();
  int fd = pidfd_open(static_cast<pid_t>(init_pid));
  if (fd < 0) return then();
  auto desc = std::make_shared<asio::posix::stream_descriptor>(io_, fd);
  desc->async_wait(asio::posix::descriptor_base::wait_read,
                   [desc, then](const boost::system::error_code&) { then(); });
}

void Gateway::supervisor_exited(const std::string& id, int64_t generation) {
  auto it = supervised_.find(id);
  if (it != supervised_.end() && it->second.generation == generation && it->second.init_pid) {
    // First let the sandbox's processes finish dying.
    int64_t pid = it->second.init_pid;
    uint64_t start = it->second.init_start;
    it->second.init_pid = 0;
    return after_sandbox_gone(pid, start,
                              [this, id, generation] { supervisor_exited(id, generation); });
  }
  bool reported = it != supervised_.end() && it->second.final_status;
  if (it != supervised_.end() && it->second.generation == generation) supervised_.erase(it);
  auto record = store_->find_by_id(id);
  if (!record || record->generation != generation) return;
  if (record->intent == "delete") return finish_delete(id);
  record->supervisor_pid = 0;
  record->supervisor_start = 0;
  cleanup_host(*record);
  if (reported && finished(record->phase)) {
    save(*record);
    return;
  }
  if (record->intent == "stop" || record->phase == Phase::kStopping) {
    record->intent = "";
    set_phase(*record, Phase::kStopped, "Stopped");
    return;
  }
  // It ended without telling us: its exit file may say why.
  std::string text;
  if (files::read_into(paths_.sandbox(id) + "/exit.json", &text) == 0) {
    try {
      auto status = protocol::session::decode_exit_file(text);
      if (status.generation == generation && !status.running()) {
        apply_final(*record, status);
        return;
      }
    } catch (const protocol::ProtocolError& e) {
      log::error(paths_.sandbox(id) + "/exit.json: " + e.what());
    }
  }
  if (finished(record->phase)) {
    save(*record);
    return;
  }
  record->intent = "";
  set_phase(*record, Phase::kError, "SupervisorLost", "the sandbox's supervisor is gone");
}

void Gateway::apply_final(SandboxRecord& record, const protocol::session::Status& status) {
  const bool stopped_by_user = record.intent == "stop" || record.phase == Phase::kStopping;
  record.intent = "";
  if (status.state == "stopped") {
    // A stop that did not come through the gateway: a signal to the
    // supervisor, the host shutting down (gateway/restart_policy.h).
    if (!stopped_by_user)
      set_phase(record, Phase::kStopped, std::string(kStoppedBySignal),
                "its supervisor was stopped by a signal, not by 'sandbox stop'");
    else
      set_phase(record, Phase::kStopped, "Stopped");
    return;
  }
  int code = status.exit_code.value_or(0);
  record.exit_code = code;
  set_phase(record, code == 0 ? Phase::kCompleted : Phase::kError, status.reason, status.message);
  SandboxSpec spec = SandboxSpec::from_json(record.spec);
  if (spec.no_keep) {
    // Delete it once its supervisor is gone.
    record.intent = "delete";
    set_phase(record, Phase::kDeleting, "NoKeep");
    if (!supervised_.count(record.id)) finish_delete(record.id);
  }
}

// What a sandbox leaves on the host once its supervisor is gone.
void Gateway::cleanup_host(const SandboxRecord& record) {
  runtime::remove_cgroups("openshell-" + record.id);
  // Every generation's socket up to this one: a supervisor that died while
  // the gateway was down left its own behind.
  const std::string dir = paths_.run_dir + "/s";
  const std::string prefix = record.id + ".";
  std::vector<std::string> names;
  try {
    names = files::list_directory(dir);
  } catch (const Error&) {
    return;  // no socket directory: no socket
  }
  for (const auto& name : names) {
    if (!name.starts_with(prefix) || !name.ends_with(".sock")) continue;
    if (name.size() < prefix.size() + 5) continue;
    const auto generation = text::parse_uint(
        std::string_view(name).substr(prefix.size(), name.size() - prefix.size() - 5));
    if (generation && *generation <= static_cast<uint64_t>(record.generation))
      ::unlink((dir + "/" + name).c_str());
  }
}

void Gateway::request_stop(SandboxRecord& record) {
  auto it = supervised_.find(record.id);
  if (it != supervised_.end() && it->second.session) {
    it->second.session->send(protocol::encode(protocol::session::Stop{kStopGraceMs}), false);
    return;
  }
  // No session: the supervisor stops the sandbox on SIGTERM as well.
  if (alive(record.supervisor_pid, record.supervisor_start))
    ::kill(static_cast<pid_t>(record.supervisor_pid), SIGTERM);
  else
    asio::post(io_, [this, id = record.id, g = record.generation] { supervisor_exited(id, g); });
}

void Gateway::finish_delete(const std::string& id) {
  auto record = store_->find_by_id(id);
  if (!record) return;
  if (alive(record->supervisor_pid, record->supervisor_start)) {
    // Killing the supervisor ends its sandbox: its init's lifeline closes.
    ::kill(static_cast<pid_t>(record->supervisor_pid), SIGKILL);
    if (!supervised_.count(id)) watch_supervisor(id, record->supervisor_pid, record->generation);
    return;  // finish_delete runs again when it is gone
  }
  auto sup = supervised_.find(id);
  if (sup != supervised_.end() && sup->second.init_pid) {
    int64_t pid = sup->second.init_pid;
    uint64_t start = sup->second.init_start;
    sup->second.init_pid = 0;
    return after_sandbox_gone(pid, start, [this, id] { finish_delete(id); });
  }
  cleanup_host(*record);
  try {
    runtime::remove_tree(paths_.sandbox(id));
    image::Store(paths_.images()).release(id);
    release_id_range(*record);
  } catch (const Error& e) {
    log::error(e.what());
  }
  if (gone_.size() > 256) gone_.erase(gone_.begin());
  gone_[id] = view(*record);
  store_->remove(id);
  supervised_.erase(id);
  notify(id);
}

void Gateway::relaunch(SandboxRecord& record, const std::string& reason,
                       const std::string& message) {
  // A supervisor of an older generation must be gone before the new one.
  if (alive(record.supervisor_pid, record.supervisor_start)) {
    ::kill(static_cast<pid_t>(record.supervisor_pid), SIGKILL);
    record.supervisor_pid = 0;
  }
  supervised_.erase(record.id);
  record.generation += 1;
  record.exit_code.reset();
  record.intent = "launch";
  record.supervisor_pid = 0;
  record.supervisor_start = 0;
  set_phase(record, Phase::kStarting, reason, message);  // on disk before the launch
  ::unlink((paths_.sandbox(record.id) + "/exit.json").c_str());
  try {
    launch(record);
  } catch (const Error& e) {
    record.intent = "";
    set_phase(record, Phase::kError, "LaunchFailed", e.what());
  }
}

void Gateway::restart_if_meant_to(const std::string& id) {
  auto record = store_->find_by_id(id);
  if (!record || !finished(record->phase) || !record->intent.empty()) return;
  SandboxSpec spec = SandboxSpec::from_json(record->spec);
  RestartPolicy policy = parse_restart_policy(spec.restart).value_or(RestartPolicy::kUnlessStopped);
  const std::string reason = ready_reason(*record);
  if (!restarts(policy, record->phase, reason)) return;
  if (copy_in_progress(record->id)) {
    log::warn("sandbox " + record->name +
              ": not started again while a copy into or out of it is in progress");
    return;
  }
  const std::string why = "restart policy " + std::string(restart_policy_name(policy)) +
                          ": generation " + std::to_string(record->generation) + " ended " +
                          std::string(phase_name(record->phase)) + " (" + reason +
                          ") while the gateway was away";
  store_->append_event(record->id, "Restart", why, now_ms());
  log::warn("sandbox " + record->name + ": " + why + "; starting it again");
  relaunch(*record, "Restarted", why);
}

// After a restart: every sandbox settles in a consistent phase, and what was
// under way is finished.
void Gateway::reconcile() {
  // Overlay probes of a gateway that died during one.
  std::vector<std::string> stale;
  files::for_each_entry(paths_.sandboxes(), [&](const char* name, unsigned char) {
    if (std::strncmp(name, ".probe-", 7) == 0) stale.push_back(paths_.sandboxes() + "/" + name);
    return true;
  });
  for (const auto& path : stale) {
    try {
      runtime::remove_tree(path);
    } catch (const Error& e) {
      log::warn(e.what());
    }
  }
  for (SandboxRecord record : store_->list()) {
    if (record.intent == "delete" || record.phase == Phase::kDeleting) {
      record.intent = "delete";
      finish_delete(record.id);
      continue;
    }
    if (alive(record.supervisor_pid, record.supervisor_start)) {
      // It reconnects on its own; until then the sandbox keeps its phase.
      watch_supervisor(record.id, record.supervisor_pid, record.generation);
      if (record.intent == "stop") request_stop(record);
      continue;
    }
    if (record.intent == "launch" && record.supervisor_pid == 0) {
      // The launch was recorded but never carried out: carry it out.
      try {
        launch(record);
      } catch (const Error& e) {
        record.intent = "";
        set_phase(record, Phase::kError, "LaunchFailed", e.what());
      }
      continue;
    }
    const bool restart_candidate = meant_to_run(record);
    if (record.supervisor_pid != 0 || !finished(record.phase))
      supervisor_exited(record.id, record.generation);
    if (restart_candidate) restart_if_meant_to(record.id);
  }
}

// ---- supervisor sessions ----------------------------------------------------

void Gateway::session(const std::shared_ptr<net::Exchange>& exchange) {
  auto ws = exchange->upgrade();
  auto sandbox_id = std::make_shared<std::string>();
  ws->start(
      [this, ws, sandbox_id](std::string data, bool) {
        namespace session = protocol::session;
        session::ToGateway message;
        try {
          message = session::decode_to_gateway(data);
        } catch (const protocol::ProtocolError& e) {
          log::error("supervisor (pid " + std::to_string(ws->peer().pid) + "): " + e.what());
          if (sandbox_id->empty()) {
            ws->send(protocol::encode(session::Rejected{e.what()}), false);
            ws->close();
          }
          return;
        }
        if (auto* hello = std::get_if<session::Hello>(&message))
          on_hello(ws, *hello, sandbox_id.get());
        else if (!sandbox_id->empty())
          on_session_message(*sandbox_id, message);
      },
      [this, ws, sandbox_id](const std::string&) {
        auto it = supervised_.find(*sandbox_id);
        if (it != supervised_.end() && it->second.session == ws) it->second.session.reset();
      });
}

// The first message of every session: the supervisor's launch file.
void Gateway::on_hello(const std::shared_ptr<net::WebSocket>& ws,
                       const protocol::session::Hello& hello, std::string* sandbox_id) {
  namespace session = protocol::session;
  auto refuse = [&](auto message) {
    ws->send(protocol::encode(message), false);
    ws->close();
  };
  auth::LaunchSpec launch;
  try {
    launch = auth::decode_verified(hello.launch, *key_);
  } catch (const auth::LaunchFileError& e) {
    // Whose is it? Only the supervisor we started may fail its sandbox.
    std::string claimed;
    try {
      claimed = auth::decode(hello.launch).sandbox_id;
    } catch (const Error&) {
    }
    if (auto record = store_->find_by_id(claimed);
        record && record->supervisor_pid == ws->peer().pid && !finished(record->phase) &&
        record->phase != Phase::kDeleting) {
      record->intent = "";
      set_phase(*record, Phase::kError, "LaunchFileInvalid", e.what());
    }
    return refuse(session::Rejected{e.what()});
  }
  auto record = store_->find_by_id(launch.sandbox_id);
  if (!record || record->phase == Phase::kDeleting)
    return refuse(session::Rejected{"no such sandbox"});
  if (finished(record->phase)) {
    // Its run is over (stopped, or its supervisor was given up for lost).
    return refuse(session::Rejected{"sandbox '" + record->name + "' is " +
                                    std::string(phase_name(record->phase))});
  }
  if (launch.generation != record->generation) {
    return refuse(session::Superseded{"launch generation " + std::to_string(launch.generation) +
                                      " is superseded by generation " +
                                      std::to_string(record->generation)});
  }
  *sandbox_id = launch.sandbox_id;
  Supervised& s = supervised_[launch.sandbox_id];
  if (s.session && s.session != ws) s.session->close("superseded by a new session");
  s.session = ws;
  if (!s.pidfd) {
    // A supervisor we did not start (this gateway restarted): learn it.
    record->supervisor_pid = ws->peer().pid;
    record->supervisor_start = start_time(ws->peer().pid);
    save(*record);
    watch_supervisor(record->id, record->supervisor_pid, record->generation);
    supervised_[launch.sandbox_id].session = ws;
  }
  // The environment, which the launch file names only by its digest.
  ws->send(protocol::encode(session::Welcome{SandboxSpec::from_json(record->spec).env}), false);
}

void Gateway::on_session_message(const std::string& id,
                                 const protocol::session::ToGateway& message) {
  namespace session = protocol::session;
  if (auto* ack = std::get_if<session::PolicyApplied>(&message)) {
    auto waiting = policy_acks_.find({id, ack->revision});
    if (waiting != policy_acks_.end()) {
      auto callback = std::move(waiting->second);
      policy_acks_.erase(waiting);
      callback(*ack);
    }
    return;
  }
  const auto* status = std::get_if<session::Status>(&message);
  auto record = store_->find_by_id(id);
  if (!record || !status || status->generation != record->generation) return;
  if (status->running()) {
    auto s = supervised_.find(id);
    if (s != supervised_.end()) {
      s->second.init_pid = status->init_pid.value_or(0);
      s->second.init_start = start_time(static_cast<pid_t>(s->second.init_pid));
    }
    if (record->phase == Phase::kProvisioning || record->phase == Phase::kStarting) {
      record->intent = "";
      set_phase(*record, Phase::kReady);
    }
    return;
  }
  auto it = supervised_.find(id);
  if (it != supervised_.end()) it->second.final_status = true;
  if (record->intent == "delete") return;
  apply_final(*record, *status);
}

// ---- the API ----------------------------------------------------------------

void Gateway::handle(std::shared_ptr<net::Exchange> exchange) {
  try {
    route(exchange);
  } catch (const ApiError& e) {
    exchange->respond(error_response(e.status, e.code, e.what()));
  } catch (const NameTaken& e) {
    exchange->respond(error_response(409, "name_taken", e.what()));
  } catch (const Error& e) {
    exchange->respond(error_response(500, "internal", e.what()));
  } catch (const std::exception& e) {
    exchange->respond(error_response(400, "bad_request", e.what()));
  }
}

void Gateway::route(const std::shared_ptr<net::Exchange>& exchange) {
  const net::Request& req = exchange->request();
  auto parts = text::split(req.path, '/');  // "", "v1", ...
  if (parts.size() < 2 || parts[1] != "v1")
    throw ApiError(404, "not_found", "no such API path: " + req.path);
  std::vector<std::string> p(parts.begin() + 2, parts.end());
  const std::string& m = req.method;

  if (p == std::vector<std::string>{"health"} && m == "GET")
    return exchange->respond(
        json_response(200, {{"status", "ok"}, {"version", OPENSHELL_VERSION}}));
  if (p == std::vector<std::string>{"gateway"} && m == "GET") {
    json info = {{"version", OPENSHELL_VERSION},      {"pid", ::getpid()},
                 {"gateway_id", gateway_id_},         {"started_at", time::format_ms(started_ms_)},
                 {"state_dir", paths_.state_dir},     {"socket", paths_.socket()},
                 {"sandboxes", store_->list().size()}};
    try {
      info["config"] = config().view();
    } catch (const ApiError& e) {
      info["config"] = config_.view();  // what holds until the file is right again
      info["config"]["error"] = e.what();
    }
    return exchange->respond(json_response(200, info));
  }
  if (p == std::vector<std::string>{"gateway", "stop"} && m == "POST") {
    exchange->respond(json_response(202, {{"stopping", true}}));
    asio::post(io_, [this] { shutdown(); });
    return;
  }
  if (p == std::vector<std::string>{"supervisor", "session"} && req.websocket)
    return session(exchange);
  if (p == std::vector<std::string>{"watch"} && req.websocket) return watch(exchange);
  if (!p.empty() && p[0] == "sandboxes") {
    if (p.size() == 1 && m == "GET") {
      json list = json::array();
      std::vector<SelectorTerm> terms;
      try {
        terms = parse_selector(req.query.count("selector") ? req.query.at("selector") : "");
      } catch (const Error& e) {
        throw ApiError(400, "bad_request", e.what());
      }
      for (const auto& r : store_->list())
        if (matches(terms, r.labels)) list.push_back(view(r));
      return exchange->respond(json_response(200, {{"sandboxes", list}}));
    }
    if (p.size() == 1 && m == "POST") return create(exchange);
    if (p.size() >= 2) {
      const std::string& name = p[1];
      if (p.size() == 2 && m == "GET")
        return exchange->respond(json_response(200, view(find(name))));
      if (p.size() == 2 && m == "DELETE") return delete_sandbox(exchange, name);
      if (p.size() == 3 && p[2] == "start" && m == "POST") return start_sandbox(exchange, name);
      if (p.size() == 3 && p[2] == "stop" && m == "POST") return stop_sandbox(exchange, name);
      if (p.size() == 3 && p[2] == "wait" && m == "GET") return wait_exit(exchange, name);
      if (p.size() == 3 && p[2] == "logs" && m == "GET") return logs(exchange, name);
      if (p.size() == 3 && p[2] == "exec" && req.websocket) return exec(exchange, name);
      if (p.size() == 3 && p[2] == "policy" && m == "GET") return get_policy(exchange, name);
      if (p.size() == 3 && p[2] == "policy" && m == "PUT") return set_policy(exchange, name);
      if (p.size() == 3 && p[2] == "policies" && m == "GET") return list_policies(exchange, name);
      if (p.size() == 3 && p[2] == "events" && m == "GET") {
        // The newest `limit` (default 100, at most the 1000 kept), oldest first.
        SandboxRecord record = find(name);
        const std::string limit_text = req.query.count("limit") ? req.query.at("limit") : "100";
        auto limit = text::parse_uint(limit_text, 1000);
        if (!limit || *limit < 1)
          throw ApiError(400, "bad_request",
                         "limit must be a number from 1 to 1000, not '" + limit_text + "'");
        json events = json::array();
        for (const auto& e : store_->events(record.id, *limit))
          events.push_back(
              {{"time", time::format_ms(e.time_ms)}, {"type", e.type}, {"message", e.message}});
        return exchange->respond(
            json_response(200, {{"sandbox", record.name}, {"events", events}}));
      }
    }
  }
  throw ApiError(404, "not_found", "no such API path: " + m + " " + req.path);
}

void Gateway::resolve_image(SandboxSpec* spec) {
  std::optional<image::ImageRecord> record;
  try {
    record = image::Store(paths_.images()).find(spec->from);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_spec", std::string("--from: ") + e.what());
  }
  if (!record) {
    std::string hint = spec->from == "base" || spec->from == "base:latest"
                           ? "build it with rootfs-tools/build-base, or choose another with --from"
                           : "pull it first: openshell image pull " + spec->from;
    throw ApiError(404, "image_not_found",
                   "image " + spec->from + " is not in the image store (" + hint + ")");
  }
  spec::resolve_image(spec, *record);
}

// The storage is the gateway's to choose, not its clients': a copy costs
// the gateway's disk a whole root per sandbox, and a sandbox's own copy is
// a root the sandbox can rewrite. A client's "copy" is accepted only where
// every root is a copy anyway (storage.mode = "copy", OPENSHELL_STORAGE=copy).
static void check_client_storage(const SandboxSpec& spec, const std::string& mode) {
  if (spec.storage.empty()) return;
  if (spec.storage == "copy" && mode == "copy") return;
  throw Error("storage '" + spec.storage +
              "': chosen by the gateway, not by its clients (a gateway whose storage.mode is "
              "copy gives every sandbox a copy)");
}

void Gateway::choose_storage(SandboxSpec* spec, const std::string& id) {
  const Setting& mode = config().storage;
  const std::string setting = mode.value;
  if (setting == "overlay") return;
  std::string problem;
  if (setting == "copy") {
    problem = mode.source == "environment" ? "OPENSHELL_STORAGE=copy"
                                           : "storage.mode = \"copy\" in " + config().path;
  } else if (!overlay_checked_) {
    // Once per gateway: whether overlayfs stacks on this file system here.
    std::vector<std::string> lowers;
    if (spec->image) {
      image::Store store(paths_.images());
      for (auto it = spec->image->layers.rbegin(); it != spec->image->layers.rend(); ++it)
        lowers.push_back(store.layer_root(*it));
    } else {
      lowers.push_back(spec->from);
    }
    const std::string scratch = paths_.sandboxes() + "/.probe-" + id;
    if (::mkdir(scratch.c_str(), 0700) != 0) throw_errno("create " + scratch);
    problem = runtime::overlay_problem(lowers, scratch);
    try {
      runtime::remove_tree(scratch);
    } catch (const Error& e) {
      log::warn(e.what());
    }
    if (problem.empty()) overlay_checked_ = true;
  }
  if (problem.empty()) return;
  spec->storage = "copy";
  spec->storage_note = "overlayfs cannot stack the root here (" + problem +
                       "): the sandbox's root is a copy of its image";
  log::warn("sandbox " + id + ": " + spec->storage_note);
}

void Gateway::create(const std::shared_ptr<net::Exchange>& exchange) {
  const net::Request& req = exchange->request();
  json body = json::parse(req.body, nullptr, false);
  if (!body.is_object()) throw ApiError(400, "bad_request", "the body must be a JSON object");
  std::string name = body.value("name", "");
  SandboxSpec spec;
  const std::string storage_mode = config().storage.value;
  try {
    spec = SandboxSpec::from_json(body.contains("spec") ? body["spec"].dump() : "{}");
    spec.validate();
    check_client_storage(spec, storage_mode);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_spec", e.what());
  }
  // What the gateway itself decides: which image --from names (its layers
  // are what the supervisor mounts) and why the root is a copy.
  spec.image.reset();
  spec.storage_note.clear();
  std::string id = random_hex(6);
  if (name.empty()) name = "sandbox-" + id.substr(0, 6);
  if (!text::is_dns_label(name))
    throw ApiError(400, "invalid_name",
                   "sandbox name '" + name +
                       "': must be a DNS label (a-z, 0-9 and '-', at most 63, not starting or "
                       "ending with '-')");
  // What the sandbox did not ask for, the gateway's defaults decide: fixed
  // now, so that `sandbox get` shows what holds.
  try {
    spec.apply_limit_defaults(config().sandbox_defaults, limits::memory_total());
  } catch (const ApiError&) {
    throw;
  } catch (const Error& e) {
    throw ApiError(500, "bad_config", e.what());
  }
  const bool directory = spec.from[0] == '/' && files::is_directory(spec.from);
  if (spec.from != "host" && !directory) resolve_image(&spec);
  if (spec.from != "host") choose_storage(&spec, id);
  // --user is refused now, not at the launch, where the policy or the root
  // has no such user.
  if (!spec.user.empty()) try {
      spec::exec_user(spec, spec::sandbox_placement(id, name, paths_), spec.user);
    } catch (const Error& e) {
      throw ApiError(400, "invalid_spec", e.what());
    }
  // As root, the sandbox's own host ids, never a client's choice: claimed
  // host-wide (other gateways' sandboxes and runs too) until its delete.
  spec.host_uid_start.reset();
  spec.host_gid_start.reset();
  if (::geteuid() == 0) {
    try {
      const runtime::SandboxIds ids = runtime::claim_sandbox_ids(paths_.sandbox(id));
      spec.host_uid_start = ids.uid_start;
      spec.host_gid_start = ids.gid_start;
    } catch (const Error& e) {
      throw ApiError(503, "no_id_range", e.what());
    }
  }

  SandboxRecord record;
  record.id = id;
  record.name = name;
  record.phase = Phase::kProvisioning;
  record.generation = 1;
  record.spec = spec.to_json();
  record.labels = spec.labels;
  record.intent = "launch";
  record.created_ms = record.updated_ms = now_ms();
  record.conditions.push_back(
      Condition{"Ready", "False", "SupervisorNotConnected", "", record.created_ms});
  try {
    store_->insert(record);  // the intent is on disk before anything is done
  } catch (...) {
    release_id_range(record);  // no record, no sandbox: its ids are free again
    throw;
  }
  store_->add_policy(id, spec.policy, record.created_ms);  // revision 1
  store_->append_event(
      id, "Created",
      "from " + spec.from + (spec.image ? " (image " + spec.image->id.substr(7, 12) + ")" : ""),
      record.created_ms);

  // The sandbox's directory: launch file, logs, and its writable layer.
  const std::string dir = paths_.sandbox(id);
  try {
    std::vector<std::string> subdirs = {"", "/logs"};
    const bool overlay = spec.from != "host" && spec.storage.empty();
    if (spec.from == "host")
      subdirs.push_back("/workspace");
    else if (overlay)
      subdirs.insert(subdirs.end(),
                     {"/layer", "/layer/upper", "/layer/work", "/layer/upper/sandbox"});
    // The upper layer's root reads as the sandbox's /: 0755. Its /sandbox,
    // the workspace, is the sandbox user's whatever the image says (the
    // launch hands it to another user the sandbox runs as: an image's User,
    // the policy's run_as_user).
    for (const auto& sub : subdirs) {
      mode_t mode = sub == "/layer/upper" || sub == "/layer/upper/sandbox" ? 0755 : 0700;
      if (::mkdir((dir + sub).c_str(), mode) != 0 && errno != EEXIST)
        throw_errno("create " + dir + sub);
    }
    // As root the sandbox runs as unprivileged ids: its layer and workspace
    // are theirs.
    if (::geteuid() == 0) {
      const runtime::SandboxIds ids{*spec.host_uid_start, *spec.host_gid_start};
      auto own = [&](const std::string& path, uint32_t inside_uid, uint32_t inside_gid) {
        runtime::chown_to_sandbox(path, ids, inside_uid, inside_gid);
      };
      if (spec.from == "host") {
        own(dir + "/workspace", 1000, 1000);
      } else if (overlay) {
        for (const char* sub : {"/layer", "/layer/upper", "/layer/work"}) own(dir + sub, 0, 0);
        own(dir + "/layer/upper/sandbox", 1000, 1000);
      }
    }
    // The image's layers stay in the store while the sandbox exists.
    if (spec.image) image::Store(paths_.images()).hold(id, spec.image->layers);
    launch(record);
  } catch (const Error& e) {
    record.intent = "";
    set_phase(record, Phase::kError, "LaunchFailed", e.what());
  }
  std::string wait = req.query.count("wait") ? req.query.at("wait") : "ready";
  if (wait == "none") return exchange->respond(json_response(201, view(record)));
  wait_for(
      id,
      [](const SandboxRecord* r) {
        return !r || (r->phase != Phase::kProvisioning && r->phase != Phase::kStarting);
      },
      [this, exchange, id](const SandboxRecord* r) {
        if (r) return exchange->respond(json_response(201, view(*r)));
        auto last = gone_.find(id);
        if (last != gone_.end()) return exchange->respond(json_response(201, last->second));
        exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
      });
}

void Gateway::start_sandbox(const std::shared_ptr<net::Exchange>& exchange,
                            const std::string& name) {
  SandboxRecord record = find(name);
  if (!finished(record.phase))
    throw ApiError(409, "wrong_phase",
                   "sandbox '" + name + "' is " + std::string(phase_name(record.phase)) +
                       " (start works from Stopped, Completed or Error)");
  if (after_copy(exchange, record.id)) return;
  refuse_if_copying(record, "start");
  relaunch(record);
  wait_for(
      record.id,
      [](const SandboxRecord* r) {
        return !r || (r->phase != Phase::kStarting && r->phase != Phase::kProvisioning);
      },
      [this, exchange](const SandboxRecord* r) {
        if (!r) return exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
        exchange->respond(json_response(200, view(*r)));
      });
}

void Gateway::stop_sandbox(const std::shared_ptr<net::Exchange>& exchange,
                           const std::string& name) {
  SandboxRecord record = find(name);
  if (record.phase != Phase::kReady && record.phase != Phase::kProvisioning &&
      record.phase != Phase::kStarting && record.phase != Phase::kStopping)
    throw ApiError(409, "wrong_phase",
                   "sandbox '" + name + "' is " + std::string(phase_name(record.phase)) +
                       " (stop works on a running sandbox)");
  if (record.phase != Phase::kStopping) {
    record.intent = "stop";
    set_phase(record, Phase::kStopping, "StopRequested");
    request_stop(record);
  }
  wait_for(
      record.id, [](const SandboxRecord* r) { return !r || r->phase != Phase::kStopping; },
      [this, exchange](const SandboxRecord* r) {
        if (!r) return exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
        exchange->respond(json_response(200, view(*r)));
      });
}

void Gateway::delete_sandbox(const std::shared_ptr<net::Exchange>& exchange,
                             const std::string& name) {
  SandboxRecord record = find(name);
  std::string id = record.id;
  if (after_copy(exchange, id)) return;
  refuse_if_copying(record, "delete");
  if (record.phase != Phase::kDeleting) {
    record.intent = "delete";
    set_phase(record, Phase::kDeleting, "DeleteRequested");
  }
  wait_for(
      id, [](const SandboxRecord* r) { return !r; },
      [exchange, name](const SandboxRecord* r) {
        if (r)
          return exchange->respond(
              error_response(504, "timeout", "deleting '" + name + "' takes too long"));
        exchange->respond(json_response(200, {{"deleted", name}}));
      });
  finish_delete(id);
}

void Gateway::wait_exit(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  SandboxRecord record = find(name);
  wait_for(
      record.id, [](const SandboxRecord* r) { return !r || finished(r->phase); },
      [this, exchange](const SandboxRecord* r) {
        if (!r) return exchange->respond(error_response(410, "gone", "the sandbox was deleted"));
        exchange->respond(json_response(200, view(*r)));
      });
}

// Log records as they are in the file; with follow, a WebSocket that stays
// open until the main process has ended and its output is all sent.
void Gateway::logs(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  const net::Request& req = exchange->request();
  SandboxRecord record = find(name);
  // source=sandbox (the main process's output, the default) or network (the
  // egress proxy's decisions, one JSON object a line).
  std::string source = req.query.count("source") ? req.query.at("source") : "sandbox";
  if (source != "sandbox" && source != "network")
    throw ApiError(400, "bad_request",
                   "source must be 'sandbox' or 'network', not '" + source + "'");
  std::string path =
      paths_.sandbox(record.id) + (source == "network" ? "/logs/network.log" : "/logs/main.log");
  std::optional<size_t> tail;
  if (auto n = text::parse_uint(req.query.count("tail") ? req.query.at("tail") : "", 1u << 30))
    tail = static_cast<size_t>(*n);
  // since: nanoseconds since the epoch; only records from then on.
  std::optional<int64_t> since;
  if (req.query.count("since")) {
    auto ns = text::parse_uint(req.query.at("since"), INT64_MAX);
    if (!ns)
      throw ApiError(
          400, "bad_request",
          "since must be nanoseconds since the epoch, not '" + req.query.at("since") + "'");
    since = static_cast<int64_t>(*ns);
  }
  std::string content;
  files::read_into(path + ".1", &content);  // the older part, if the log rotated
  size_t older = content.size();
  files::read_into(path, &content);
  const size_t start = log_window_start(
      content, source == "network" ? LogKind::kNetwork : LogKind::kRecords, since, tail);
  std::string initial = content.substr(start);
  if (!req.websocket) return exchange->respond(net::Response{200, initial, "text/plain"});

  auto ws = exchange->upgrade();
  ws->start([](std::string, bool) {}, [](const std::string&) {});
  if (!initial.empty()) ws->send(initial, true);
  // Follow: poll the file (cheap, and it works across the supervisor's
  // rotation); end once the sandbox is finished and nothing more is written.
  struct Follow {
    UniqueFd fd;
    off_t offset;
    std::shared_ptr<asio::steady_timer> timer;
  };
  auto follow = std::make_shared<Follow>(Follow{
      UniqueFd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)),
      static_cast<off_t>(content.size() - older), std::make_shared<asio::steady_timer>(io_)});
  std::string id = record.id;
  auto poll = std::make_shared<std::function<void()>>();
  *poll = [this, ws, follow, id, path, poll]() {
    if (!follow->fd) follow->fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    std::string more;
    auto drain = [&]() {
      char buf[65536];
      ssize_t n;
      while ((n = ::pread(follow->fd.get(), buf, sizeof buf, follow->offset)) > 0) {
        more.append(buf, static_cast<size_t>(n));
        follow->offset += n;
      }
    };
    if (follow->fd) {
      drain();
      // The supervisor rotated the log: finish the old file, go on with the new.
      struct stat open_st, path_st;
      if (::fstat(follow->fd.get(), &open_st) == 0 && ::stat(path.c_str(), &path_st) == 0 &&
          (open_st.st_ino != path_st.st_ino || open_st.st_dev != path_st.st_dev)) {
        drain();
        follow->fd.reset(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
        follow->offset = 0;
        if (follow->fd) drain();
      }
    }
    if (!more.empty()) ws->send(more, true);
    auto record = store_->find_by_id(id);
    bool over = !record || finished(record->phase) || record->phase == Phase::kDeleting;
    // The supervisor writes the last output before it reports the end.
    if (over && more.empty()) {
      json end = {{"type", "end"}};
      if (record) {
        end["phase"] = std::string(phase_name(record->phase));
        if (record->exit_code) end["exit_code"] = *record->exit_code;
      } else if (auto last = gone_.find(id); last != gone_.end()) {
        end["phase"] = last->second.value("phase", "");
        if (last->second.contains("exit_code")) end["exit_code"] = last->second["exit_code"];
      }
      ws->send(json_text(end), false);
      ws->close();
      *poll = nullptr;  // break the cycle
      return;
    }
    // Re-arming cancels the wait a wake-up by notify() overtook.
    follow->timer->expires_after(std::chrono::milliseconds(more.empty() ? 10 : 0));
    follow->timer->async_wait([poll](const boost::system::error_code& ec) {
      if (!ec && *poll) (*poll)();
    });
  };
  followers_[id].push_back(poll);
  (*poll)();
}

// exec: the connection goes to the sandbox's supervisor as it is (before the
// WebSocket handshake), so the gateway stays out of the data path.
void Gateway::exec(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  SandboxRecord record = find(name);
  // A download or an upload (?copy=1) reaches a sandbox that is not running
  // too, through a copy supervisor of its own.
  const bool copy = exchange->request().query.count("copy") > 0;
  if (copy && finished(record.phase)) return copy_exec(exchange, record);
  if (record.phase != Phase::kReady)
    throw ApiError(409, "wrong_phase",
                   "sandbox '" + name + "' is " + std::string(phase_name(record.phase)) +
                       (copy ? " (a copy needs a Ready, Stopped, Completed or Error sandbox)"
                             : " (exec needs a Ready sandbox)"));
  hand_exec_over(exchange, paths_.supervisor_socket(record.id, record.generation), name);
}

void Gateway::hand_exec_over(const std::shared_ptr<net::Exchange>& exchange,
                             const std::string& socket_path, const std::string& name) {
  UniqueFd sock(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof addr.sun_path - 1);
  if (!sock || ::connect(sock.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw ApiError(503, "unavailable",
                   errno_message("the supervisor of '" + name + "' does not answer", errno));
  std::string raw = exchange->request().raw;
  UniqueFd connection(exchange->release());
  int err = protocol::send_exec_handoff(sock.get(), raw, connection.get());
  if (err) log::error(errno_message("hand exec over to the supervisor of " + name, -err));
}

// ---- copies into and out of sandboxes that are not running ------------------

bool Gateway::copy_in_progress(const std::string& id) const {
  if (copies_.count(id)) return true;
  // A copy supervisor that a gateway before us started holds the lock.
  UniqueFd lock(::open(paths_.copy_lock(id).c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!lock) return false;
  return ::flock(lock.get(), LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
}

void Gateway::refuse_if_copying(const SandboxRecord& record, const std::string& verb) const {
  if (copy_in_progress(record.id))
    throw ApiError(409, "busy",
                   "a copy into or out of sandbox '" + record.name + "' is in progress (" + verb +
                       " waits for it: try again when it ends)");
}

bool Gateway::after_copy(const std::shared_ptr<net::Exchange>& exchange, const std::string& id) {
  if (!copies_.count(id)) return false;
  // Ours ends within moments of its copy (at most its idle time): the
  // request is answered as if it came then.
  copy_waiters_[id].push_back([this, exchange] { handle(exchange); });
  return true;
}

void Gateway::copy_exec(const std::shared_ptr<net::Exchange>& exchange,
                        const SandboxRecord& record) {
  if (after_copy(exchange, record.id)) return;
  refuse_if_copying(record, "another copy");
  const std::string id = record.id, name = record.name;
  const std::string file = paths_.sandbox(id) + "/copy.cred";
  mint_launch_file(record, file);
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd report_read(report[0]), report_write(report[1]);
  const pid_t pid = spawn_supervisor(record, file, {"--copy"}, report_write.get());
  report_write.reset();
  copies_[id] = pid;
  // Its end frees the sandbox for a start, a delete or the next copy.
  int fd = pidfd_open(pid);
  if (fd >= 0) {
    auto exited = std::make_shared<asio::posix::stream_descriptor>(io_, fd);
    exited->async_wait(asio::posix::descriptor_base::wait_read,
                       [this, id, pid, exited](const boost::system::error_code& ec) {
                         if (ec) return;
                         int status;
                         ::waitpid(pid, &status, 0);
                         if (auto it = copies_.find(id); it != copies_.end() && it->second == pid)
                           copies_.erase(it);
                         auto waiting = std::move(copy_waiters_[id]);
                         copy_waiters_.erase(id);
                         for (auto& then : waiting) then();
                       });
  }
  // Its report: "ready" once its container runs and its socket listens.
  auto pipe = std::make_shared<asio::posix::stream_descriptor>(io_, report_read.release());
  auto text = std::make_shared<std::string>();
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::seconds(30));
  timer->async_wait([pid, pipe](const boost::system::error_code& ec) {
    if (ec) return;
    ::kill(pid, SIGKILL);
    boost::system::error_code ignored;
    pipe->close(ignored);
  });
  asio::async_read(
      *pipe, asio::dynamic_buffer(*text),
      [this, exchange, pipe, text, timer, id, name](const boost::system::error_code&, size_t) {
        timer->cancel();
        std::string line = text->substr(0, text->find('\n'));
        try {
          if (line == "ready") return hand_exec_over(exchange, paths_.copy_socket(id), name);
          if (line.rfind("error ", 0) == 0) {
            line.erase(0, 6);
            const bool busy = line.find("in progress") != std::string::npos;
            throw ApiError(busy ? 409 : 500, busy ? "busy" : "copy_failed",
                           "copy for sandbox '" + name + "': " + line);
          }
          throw ApiError(500, "copy_failed",
                         "copy for sandbox '" + name +
                             "': its supervisor ended without starting (see " + paths_.sandbox(id) +
                             "/logs/supervisor.log)");
        } catch (const ApiError& e) {
          exchange->respond(error_response(e.status, e.code, e.what()));
        }
      });
}

// ---- policies ---------------------------------------------------------------

json policy_view(const SandboxRecord& record, const PolicyRevision& p, int64_t current) {
  // An empty text is the default policy: show it as such.
  std::string text = p.text.empty() ? policy::to_toml(policy::default_policy()) : p.text;
  return json{{"sandbox", record.name},
              {"revision", p.revision},
              {"current", p.revision == current},
              {"default", p.text.empty()},
              {"created_at", time::format_ms(p.created_ms)},
              {"policy", text}};
}

void Gateway::get_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  SandboxRecord record = find(name);
  const auto& q = exchange->request().query;
  int64_t revision = 0;
  if (q.count("rev")) {
    auto value = text::parse_uint(q.at("rev"), INT32_MAX);
    if (!value || *value == 0) throw ApiError(400, "bad_request", "rev must be a positive number");
    revision = static_cast<int64_t>(*value);
  }
  auto current = store_->policy(record.id, 0);
  auto p = store_->policy(record.id, revision);
  if (!p)
    throw ApiError(404, "not_found",
                   "sandbox '" + name + "' has no policy revision " + std::to_string(revision));
  exchange->respond(json_response(200, policy_view(record, *p, current ? current->revision : 0)));
}

void Gateway::list_policies(const std::shared_ptr<net::Exchange>& exchange,
                            const std::string& name) {
  SandboxRecord record = find(name);
  auto all = store_->policies(record.id);
  json list = json::array();
  for (const auto& p : all) {
    json v = policy_view(record, p, all.empty() ? 0 : all.back().revision);
    v.erase("policy");
    list.push_back(v);
  }
  exchange->respond(json_response(200, {{"sandbox", record.name}, {"revisions", list}}));
}

// The parts fixed at a sandbox's start that a new policy text would change,
// each policy taken as the sandbox would run with it.
std::vector<std::string> static_policy_changes(const SandboxSpec& spec, const std::string& text,
                                               const std::string& source) {
  SandboxSpec next = spec;
  next.policy = text;
  next.policy_source = source;
  policy::Policy now;
  try {
    now = spec::effective_policy(spec, spec::Placement{});
  } catch (const Error&) {
    return {};  // a stored text this version cannot read: nothing to compare, nothing to keep
  }
  return policy::static_differences(now, spec::effective_policy(next, spec::Placement{}));
}

// A new revision: validated, stored, and (the network part) applied to the
// running sandbox before the answer; the rest applies from the next start.
void Gateway::set_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name) {
  SandboxRecord record = find(name);
  json body = json::parse(exchange->request().body, nullptr, false);
  if (!body.is_object() || !body.contains("policy") || !body["policy"].is_string())
    throw ApiError(400, "bad_request", "the body must be {\"policy\": \"TOML text\"}");
  std::string text = body["policy"].get<std::string>();
  std::string source = body.value("source", std::string("policy"));
  try {
    policy::parse(text, source);
  } catch (const Error& e) {
    throw ApiError(400, "invalid_policy", e.what());
  }
  bool at_next_start = body.value("at_next_start", false);
  SandboxSpec spec = SandboxSpec::from_json(record.spec);
  auto live = supervised_.find(record.id);
  bool running = live != supervised_.end() && live->second.session && record.phase == Phase::kReady;
  // What a running sandbox cannot take now is refused unless asked for later.
  std::vector<std::string> pending;
  if (running) pending = static_policy_changes(spec, text, source);
  if (!pending.empty() && !at_next_start)
    throw ApiError(409, "static_change",
                   "sandbox '" + name + "' is running, and its " + text::join(pending, ", ") +
                       " would change, which applies only at its next start: give "
                       "--at-next-start (at_next_start in the API) to store the revision for "
                       "then; its network part applies at once");
  int64_t revision = store_->add_policy(record.id, text, now_ms());
  spec.policy = text;
  spec.policy_source = source;
  record.spec = spec.to_json();
  save(record);
  auto respond = [this, exchange, id = record.id, revision, pending](bool applied,
                                                                     const std::string& error) {
    auto r = store_->find_by_id(id);
    json out = {{"revision", revision}, {"applied", applied}};
    if (!pending.empty()) out["at_next_start"] = pending;
    if (!error.empty()) out["error"] = error;
    if (r) out["sandbox"] = view(*r);
    exchange->respond(json_response(200, out));
  };
  if (!running) return respond(false, "");  // takes effect at the next start
  auto s = live;
  auto timer = std::make_shared<asio::steady_timer>(io_, std::chrono::seconds(5));
  policy_acks_[{record.id, revision}] = [respond,
                                         timer](const protocol::session::PolicyApplied& ack) {
    timer->cancel();
    respond(!ack.error, ack.error.value_or(""));
  };
  timer->async_wait([this, id = record.id, revision, respond](const boost::system::error_code& ec) {
    if (ec) return;
    policy_acks_.erase({id, revision});
    respond(false, "the sandbox's supervisor did not acknowledge the policy");
  });
  s->second.session->send(protocol::encode(protocol::session::Policy{revision, text}), false);
}

void Gateway::watch(const std::shared_ptr<net::Exchange>& exchange) {
  auto ws = exchange->upgrade();
  ws->start([](std::string, bool) {}, [](const std::string&) {});
  watchers_.push_back(ws);
}

}  // namespace

int run(int ready_fd) {
  // A write to a client or pipe that has gone (the CLI that started us,
  // killed before it read our answer) is that peer's end, not ours.
  ::signal(SIGPIPE, SIG_IGN);
  process_name::set_comm(process_name::kGatewayComm);
  // The CLI that started us waits for this pipe's answer, and for its end:
  // no child of ours may hold it.
  if (ready_fd >= 0) ::fcntl(ready_fd, F_SETFD, FD_CLOEXEC);
  auto tell = [&](const std::string& message) {
    if (ready_fd < 0) return;
    std::string line = message + "\n";
    ssize_t ignored = ::write(ready_fd, line.data(), line.size());
    (void)ignored;
    ::close(ready_fd);
    ready_fd = -1;
  };
  try {
    asio::io_context io;
    Gateway gateway(io, Paths::resolve());
    gateway.start();
    tell("ok");
    // A handler that fails (a store write on a full disk, say) fails its
    // own operation, not the gateway: the store rolled its transaction
    // back, and reconciliation settles that sandbox. run() goes on where
    // the failed handler left off.
    run_handling_exceptions(io, "gateway");
    return 0;
  } catch (const std::exception& e) {
    log::error(std::string("gateway: ") + e.what());
    tell(std::string("error: ") + e.what());
    return exit_code::kFailure;
  }
}

}  // namespace openshell::gateway
