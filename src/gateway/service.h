// The gateway's own class, shared by its files: gateway.cc (its start,
// its state and the changes it announces), api.cc (the route table and who
// may call what), sandboxes.cc, logs.cc, exec.cc, policies.cc (the API's
// handlers by resource), sessions.cc (the supervisors' sessions) and
// launch.cc (launching supervisors, their end, reconciliation). Not a door:
// nothing outside src/gateway includes it (the room's door is gateway.h).
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "auth/launch.h"
#include "auth/secrets.h"
#include "base/error.h"
#include "base/files.h"
#include "base/paths.h"
#include "base/time.h"
#include "base/unique_fd.h"
#include "gateway/background.h"
#include "gateway/config.h"
#include "gateway/gateway.h"
#include "gateway/principal.h"
#include "gateway/store.h"
#include "net/http.h"
#include "protocol/supervisor_session.h"
#include "spec/sandbox_spec.h"

namespace openshell::gateway {

namespace asio = boost::asio;
using nlohmann::json;
using time::now_ms;

constexpr int kStopGraceMs = 10000;
constexpr auto kWaitTimeout = std::chrono::seconds(60);

// ---- processes (launch.cc) ---------------------------------------------------

// Start time of a process (clock ticks since boot, /proc/PID/stat field 22),
// 0 when it does not exist or has ended (a zombie: killed while its parent,
// a gateway, was gone, and not yet reaped).
uint64_t start_time(pid_t pid);
bool alive(int64_t pid, uint64_t started);
int pidfd_open(pid_t pid);

// ---- answers (api.cc) ---------------------------------------------------------

net::Response error_response(int status, const std::string& code, const std::string& message);
net::Response json_response(int status, const json& body);

// An error the API answers with a status and a code.
struct ApiError : Error {
  int status;
  std::string code;
  ApiError(int s, std::string c, const std::string& message)
      : Error(message), status(s), code(std::move(c)) {}
};

inline bool finished(Phase phase) {
  return phase == Phase::kCompleted || phase == Phase::kError || phase == Phase::kStopped;
}

// ---- the gateway --------------------------------------------------------------

class Gateway {
 public:
  // A bad configuration stops the gateway here, saying what is wrong.
  Gateway(asio::io_context& io, Paths paths, RunOptions options);

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
    // The children of a supervisor that a delete kills before it reported
    // its init (pid, start time): the delete waits for them too.
    std::vector<std::pair<int64_t, uint64_t>> children;
    // The CA made for this launch (launch()), until its welcome takes it.
    std::string ca_cert;
    std::string ca_key;
  };

  // One request to a route of the API (api.cc).
  struct Call {
    std::shared_ptr<net::Exchange> exchange;
    std::string name;  // the path's {name}, where the route has one
    std::string item;  // its other parameter ({port}), where it has one
    Principal who;
    // The sandbox as authorize() found it (an owner's route), so that a
    // handler on the hot path (exec, attach) need not read it again.
    std::optional<SandboxRecord> record;
  };
  // Who may call a route; checked by route() before any handler runs.
  enum class Access {
    kAnyone,      // every principal (a handler may narrow what it shows: list, watch)
    kAdmin,       // admins only: 403 admin_only
    kOwner,       // the owner of the sandbox the path names, or an admin: 403 not_owner
    kSupervisor,  // the Unix socket only (the launch file then says which sandbox)
  };
  struct Route {
    const char* method;   // of a plain request
    bool websocket;       // an upgrade to a WebSocket (at any method), not a plain request
    const char* pattern;  // "/v1/sandboxes/{name}/logs"
    Access access;
    std::function<void(Gateway&, const Call&)> handler;
  };
  static const std::vector<Route>& routes();
  // Refuses the call: 403 with this code, recorded in the gateway's log and
  // in STATE/audit.log (one JSON object a line). Throws ApiError.
  [[noreturn]] void refuse(const Call& call, const std::string& code, const std::string& message);
  // Whose the record is (its stored owner, or the gateway owner's).
  std::string owner_of(const SandboxRecord& record) const;
  // The host paths in the spec, checked with the caller's rights, not the
  // gateway's (sandboxes.cc). Refuses through refuse(). `given_kernel`: a
  // VM's kernel that the client named (at create; the gateway's own default
  // is not the caller's to check).
  void check_host_paths(const Call& call, const SandboxSpec& spec,
                        const std::string& given_kernel = "");
  void authorize(const Route& route, Call& call);
  // The sandbox named, if the caller may touch it: 404 not_found, or 403
  // not_owner through refuse().
  SandboxRecord owned(const Call& call, const std::string& name);

  // API
  void handle(std::shared_ptr<net::Exchange> exchange);
  void route(const std::shared_ptr<net::Exchange>& exchange);
  void health(const std::shared_ptr<net::Exchange>& exchange);
  void gateway_info(const Call& call);
  void stop_gateway(const std::shared_ptr<net::Exchange>& exchange);
  void list_sandboxes(const Call& call);
  void get_sandbox(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void events(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void whoami(const Call& call);
  json view(const SandboxRecord& record) const;
  // What a list shows of each sandbox, oldest first: its view as JSON text,
  // with what the list filters by. Made again only when the store has
  // changed since the last list (Store::revision): a list of a thousand
  // unchanged sandboxes reads and prints none of them.
  struct Listed {
    std::string owner;
    std::map<std::string, std::string> labels;
    std::string view;  // view(record), as json_text writes it
  };
  const std::vector<Listed>& listed() const;
  // A record's spec, parsed once while its text stays the same: a create
  // parsed it four times (its view, its CA, its welcome, its ids), a list
  // of a thousand once each.
  std::shared_ptr<const SandboxSpec> spec_of(const SandboxRecord& record) const;
  void release_id_range(const SandboxRecord& record) const;
  SandboxRecord find(const std::string& name) const;

  void create(const Call& call);
  void start_sandbox(const Call& call);
  void stop_sandbox(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void delete_sandbox(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  // POST /v1/sandboxes:batchDelete {"names": [...]}: one answer for them all.
  struct DeleteBatch;
  void delete_sandboxes(const Call& call);
  void delete_batch(const std::shared_ptr<DeleteBatch>& batch,
                    const std::vector<std::string>& names, const Call& call);
  // A sandbox marked Deleting: its delete driven on; `then` gets nullptr
  // once its record is gone, or the 504 to answer when that takes too long.
  void await_delete(const std::string& id, const std::string& name,
                    std::function<void(const ApiError*)> then);
  void wait_exit(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void logs(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void exec(const Call& call);
  void attach(const Call& call);
  void session(const std::shared_ptr<net::Exchange>& exchange);
  void watch(const Call& call);
  void get_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void list_policies(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  void set_policy(const std::shared_ptr<net::Exchange>& exchange, const std::string& name);
  // Providers (providers.cc).
  void list_providers(const Call& call);
  void get_provider(const Call& call);
  void create_provider(const Call& call);
  void update_provider(const Call& call);
  void delete_provider(const Call& call);
  void attach_provider(const Call& call);
  void detach_provider(const Call& call);
  json provider_view(const ProviderRecord& record) const;
  ProviderRecord find_provider(const std::string& name) const;  // ApiError 404
  // The credentials of the providers attached to the sandbox.
  std::vector<protocol::session::Credential> credentials_of(const std::string& id) const;
  // Attaches them (ApiError 404 before any when one is unknown).
  void attach_providers(SandboxRecord& record, const std::vector<std::string>& names);
  // The spec's env holds KEY=openshell:resolve:env:KEY for every key of
  // its providers, and no other placeholder; saved when it changed. Only
  // at a launch, before its file is minted: the file names the env by its
  // digest, which a change between the file and the welcome would break.
  void sync_placeholders(SandboxRecord& record);
  // The whole set to the sandbox's supervisor, when its session is open.
  void send_credentials(const std::string& id);
  // A sandbox's writable layer as a new image (commit.cc).
  void commit_sandbox(const Call& call);
  // Port forwards (forwards.cc).
  void list_all_forwards(const Call& call);
  void list_forwards(const Call& call);
  void add_forward(const Call& call);
  void remove_forward(const Call& call);
  json forward_view(const ForwardRecord& forward, const SandboxRecord& sandbox) const;
  // create's "forwards" ([{"bind", "port"}]), checked and free (ApiError
  // 400, 409), before the sandbox is made; stored by the caller.
  std::vector<ForwardRecord> forwards_to_create(const Call& call, const json& body);
  // The sandbox's forwards to its supervisor, when its session is open.
  void send_forwards(const std::string& id);
  std::vector<protocol::session::Forward> session_forwards(const std::string& id) const;
  // Runs `then` with the supervisor's next report of forward states that
  // `done` accepts, or with nullptr after a few seconds without one.
  using ForwardStates = std::vector<protocol::session::ForwardState>;
  void await_forward_report(const std::string& id, std::function<bool(const ForwardStates&)> done,
                            std::function<void(const ForwardStates*)> then);
  void forward_report(const std::string& id, const ForwardStates& states);

  // Lifecycle
  void save(SandboxRecord& record);
  void set_phase(SandboxRecord& record, Phase phase, const std::string& reason = "",
                 const std::string& message = "");
  void launch(SandboxRecord& record);
  void make_sandbox_ca(const SandboxRecord& record);
  void mint_launch_file(const SandboxRecord& record, const std::string& file);
  pid_t spawn_supervisor(const SandboxRecord& record, const std::string& launch_file,
                         const std::vector<std::string>& extra, int report_fd);
  // Hands an exec's connection to the supervisor listening at socket_path.
  void hand_exec_over(const std::shared_ptr<net::Exchange>& exchange,
                      const std::string& socket_path, const std::string& name);
  // Downloads and uploads of a sandbox that is not running (copy.cc): a
  // copy supervisor each (supervisor/supervisor.h), one at a time; while one
  // lives (ours, or one a gateway before us started: its lock tells) the
  // sandbox is not started, deleted or copied again.
  void copy_exec(const Call& call, const SandboxRecord& record);
  bool copy_in_progress(const std::string& id) const;
  // While a copy supervisor of ours lives, the request is handled again
  // once it has ended (true); while one a gateway before us started holds
  // the lock, ApiError 409 "busy" naming `verb`; false when there is none.
  bool wait_for_copy(const std::shared_ptr<net::Exchange>& exchange, const SandboxRecord& record,
                     const std::string& verb);
  // A new generation of a sandbox whose run is over: the old supervisor
  // gone, the launch recorded (Starting, with this reason), then done.
  void relaunch(SandboxRecord& record, const std::string& reason = "",
                const std::string& message = "");
  // At the gateway's start: a sandbox meant to run whose supervisor was
  // gone, settled now, starts again if its restart policy says so.
  void restart_if_meant_to(const std::string& id);
  void watch_supervisor(const std::string& id, int64_t pid, int64_t generation);
  void supervisor_exited(const std::string& id, int64_t generation);
  // Runs `then` once the sandbox's own process (its init, which dies with
  // its supervisor a moment later) is gone; with end, SIGKILL ends it first
  // (a delete's).
  void after_sandbox_gone(int64_t pid, uint64_t start, std::function<void()> then,
                          bool end = false);
  void on_exit(const std::shared_ptr<asio::posix::stream_descriptor>& desc,
               std::function<void()> then);
  void apply_final(SandboxRecord& record, const protocol::session::Status& status);
  void on_hello(const std::shared_ptr<net::WebSocket>& ws, const protocol::session::Hello& hello,
                std::string* sandbox_id);
  void on_session_message(const std::string& id, const protocol::session::ToGateway& message);
  bool current_session(const std::string& id, const std::shared_ptr<net::WebSocket>& ws) const;
  void request_stop(SandboxRecord& record);
  void finish_delete(const std::string& id);
  // The records of the deletes whose files are gone, removed in one commit.
  void forget_deleted();
  // An image reference in spec->from: its layers and config (command,
  // environment) into the spec. Throws ApiError (404 for an unknown image).
  void resolve_image(SandboxSpec* spec);
  // Overlayfs, or a copy of the root where overlayfs cannot stack it here.
  void choose_storage(SandboxSpec* spec, const std::string& id);
  // A sandbox's cgroups and the supervisor sockets of every generation up
  // to this one. Reads paths_ alone: the background's thread calls it too.
  void cleanup_host(const std::string& id, int64_t generation) const;
  void reconcile();
  void wait_for(const std::string& id, std::function<bool(const SandboxRecord*)> done,
                std::function<void(const SandboxRecord*)> callback);
  void notify(const std::string& id);
  void shutdown();
  std::optional<gid_t> socket_group() const;
  void share_socket(gid_t gid);

  // The settings (gateway/config.h), read again when the file changes.
  const GatewayConfig& config();
  // The TLS and plain-TCP listeners of the settings, beside the socket.
  void listen_tcp();

  asio::io_context& io_;
  Paths paths_;
  RunOptions options_;
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
  // The init's program (runtime/init_image.h), made at the first spawn and
  // handed to every supervisor: one copy in memory for all their sandboxes.
  UniqueFd init_image_;
  bool init_image_made_ = false;
  std::map<std::string, Supervised> supervised_;  // by sandbox id
  // listed()'s, and the store's revision it was made at.
  mutable std::vector<Listed> listed_;
  mutable std::optional<Store::Revision> listed_at_;
  // spec_of's: by sandbox id, the text and what it parsed to.
  mutable std::map<std::string, std::pair<std::string, std::shared_ptr<const SandboxSpec>>> specs_;
  // Where a launch's time goes (`?timings=1` on create and start; the CLI's
  // -v): each step's time since the request arrived, until the answer.
  struct LaunchTrace {
    std::chrono::steady_clock::time_point begin;
    json steps = json::array();  // [{"step": NAME, "ms": SINCE_BEGIN}]
  };
  std::map<std::string, LaunchTrace> traces_;  // by sandbox id, while asked for
  void trace(const std::string& id, const char* step);
  // The trace as the answer's "timings" (and forgotten): null when none.
  json take_trace(const std::string& id);
  std::map<std::string, pid_t> copies_;  // copy supervisors, by sandbox id
  std::map<std::string, std::vector<std::function<void()>>> copy_waiters_;
  std::map<std::string, std::vector<Waiter>> waiters_;
  struct Watcher {
    std::weak_ptr<net::WebSocket> ws;
    Principal who;  // sees only the sandboxes it may see
  };
  std::vector<Watcher> watchers_;
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
  // Each sandbox's forwards as its supervisor last reported them (since its
  // session's hello), and who waits for its next report.
  std::map<std::string, ForwardStates> forward_states_;
  struct ForwardWaiter {
    std::function<bool(const ForwardStates&)> done;
    std::function<void(const ForwardStates*)> then;
    std::shared_ptr<asio::steady_timer> timer;
  };
  std::map<std::string, std::vector<ForwardWaiter>> forward_waiters_;
  // Deletes whose files the background removes (by sandbox id), and those
  // done, whose records wait for forget_deleted's commit (posted once).
  std::set<std::string> removing_;
  std::vector<SandboxRecord> removed_;
  bool forget_posted_ = false;
  static constexpr size_t kForgetBatch = 64;  // deleted records removed in one commit, at most
  // Last: its thread ends before anything above goes.
  Background background_{io_};
};

}  // namespace openshell::gateway
