#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "base/directory.h"
#include "base/log.h"
#include "base/process_name.h"
#include "base/random.h"
#include "base/text.h"
#include "egress/tls.h"
#include "gateway/restart_policy.h"
#include "gateway/service.h"
#include "image/store.h"
#include "runtime/cleanup.h"
#include "runtime/gpu.h"
#include "runtime/host_ids.h"
#include "runtime/init_image.h"
#include "spec/container_spec.h"

extern char** environ;

namespace openshell::gateway {

// ---- processes ---------------------------------------------------------------

namespace {

// A process's start time (clock ticks since boot, /proc/PID/stat field 22)
// and its parent's pid (field 4), from one reading; start 0 when it does not
// exist or has ended (a zombie: killed while its parent, a gateway, was
// gone, and not yet reaped).
struct ProcStat {
  uint64_t start = 0;
  std::string parent;
};

ProcStat proc_stat(const std::string& pid) {
  auto stat = files::try_read("/proc/" + pid + "/stat");
  if (!stat) return {};
  size_t paren = stat->rfind(')');
  if (paren == std::string::npos) return {};
  auto fields = text::split(std::string_view(*stat).substr(paren + 2), ' ');
  // After ") ": field 3 (state) is index 0, so field 4 is index 1 and
  // field 22 index 19.
  if (fields.size() < 20 || fields[0] == "Z" || fields[0] == "X") return {};
  return {text::parse_uint(fields[19]).value_or(0), fields[1]};
}

// The children of a live process, each with its start time: read from
// /proc/PID/task/PID/children (the main thread's, which forks them), each
// checked to be its child still when its start time is read.
std::vector<std::pair<int64_t, uint64_t>> children_of(pid_t pid) {
  std::vector<std::pair<int64_t, uint64_t>> out;
  const std::string me = std::to_string(pid);
  auto list = files::try_read("/proc/" + me + "/task/" + me + "/children");
  if (!list) return out;
  for (const std::string& word : text::split(*list, ' ')) {
    auto child = text::parse_uint(word, INT32_MAX);
    if (!child) continue;
    const ProcStat stat = proc_stat(word);
    if (stat.start && stat.parent == me) out.emplace_back(*child, stat.start);
  }
  return out;
}

}  // namespace

uint64_t start_time(pid_t pid) { return proc_stat(std::to_string(pid)).start; }

bool alive(int64_t pid, uint64_t started) {
  return pid > 0 && started != 0 && start_time(static_cast<pid_t>(pid)) == started;
}

int pidfd_open(pid_t pid) { return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)); }

// Once its files are gone, the sandbox's host ids may go to another.
void Gateway::release_id_range(const SandboxRecord& record) const {
  const auto spec = spec_of(record);
  if (spec->host_uid_start)
    runtime::release_sandbox_ids(*spec->host_uid_start, paths_.sandbox(record.id));
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
  // Replaced whole (a crash of the gateway leaves the old file or the new),
  // not synced: it is worth nothing after a crash of the machine, which
  // ends its supervisor; the next launch mints a new one.
  files::replace(file, auth::encode(spec, *key_));
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
  // Where the supervisor finds the host's GPUs (--gpu; runtime/gpu.h).
  for (const char* name : {runtime::gpu::kCdiDirsVariable, runtime::gpu::kRootVariable})
    if (const char* value = std::getenv(name))
      env_strings.push_back(std::string(name) + "=" + value);
  // The init's program for its sandbox, as fd 4 (above any fd of ours that
  // the dup2s below write over).
  if (!init_image_made_) {
    init_image_made_ = true;
    if (UniqueFd image = runtime::make_init_image())
      init_image_.reset(::fcntl(image.get(), F_DUPFD_CLOEXEC, 10));
  }
  constexpr int kInitImageFd = 4;
  if (init_image_)
    env_strings.push_back(std::string(runtime::kInitImageFdVariable) + "=" +
                          std::to_string(kInitImageFd));
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
  if (report_fd >= 0)
    posix_spawn_file_actions_adddup2(&actions, report_fd, 3);
  else
    posix_spawn_file_actions_addclose(&actions, 3);
  if (init_image_) posix_spawn_file_actions_adddup2(&actions, init_image_.get(), kInitImageFd);
  // Nothing else of the gateway's (a descriptor someone forgot to mark
  // close-on-exec would keep a pipe or socket of the gateway open as long
  // as the sandbox lives).
  posix_spawn_file_actions_addclosefrom_np(&actions, init_image_ ? kInitImageFd + 1 : 4);
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
  sync_placeholders(record);  // the providers attached now
  const std::string file = paths_.launch_file(record.id);
  mint_launch_file(record, file);
  trace(record.id, "launch file");
  pid_t pid = spawn_supervisor(record, file, {}, -1);
  trace(record.id, "supervisor spawned");
  record.supervisor_pid = pid;
  record.supervisor_start = start_time(pid);
  // Its pid is how a restarted gateway finds it again. A crash of this
  // process keeps the commit; a crash of the machine ends the supervisor
  // too, so the commit need not wait for the disk.
  record.updated_ms = now_ms();
  store_->atomically_unsynced("record the supervisor of '" + record.name + "'",
                              [&] { store_->update(record); });
  notify(record.id);
  trace(record.id, "supervisor stored");
  watch_supervisor(record.id, pid, record.generation);
  make_sandbox_ca(record);
}

// The sandbox's CA for this launch and its CA bundle, made here while the
// supervisor starts: this process's OpenSSL is warm (a P-256 key and a
// signature, 0.3 ms), a new supervisor's would spend milliseconds on its
// first. The key goes to the supervisor in its welcome, never to a file.
// A failure leaves the making to the supervisor, which reports it.
void Gateway::make_sandbox_ca(const SandboxRecord& record) {
  Supervised& s = supervised_[record.id];
  s.ca_cert.clear();
  s.ca_key.clear();
  try {
    const auto spec = spec_of(record);
    if (spec->vm) return;  // a micro-VM's guest has no CA yet
    egress::tls::SandboxCa ca(record.name);
    spec::write_ca_bundle(*spec, paths_.sandbox(record.id), ca.cert_pem());
    s.ca_cert = ca.cert_pem();
    s.ca_key = ca.key_pem();
  } catch (const Error& e) {
    log::debug("sandbox " + record.name + ": its CA is left to its supervisor: " + e.what());
  }
  trace(record.id, "ca");
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
  on_exit(desc, [this, id, generation, pid] {
    // Reap it if it is our child (it is not after a gateway restart).
    int status;
    ::waitpid(static_cast<pid_t>(pid), &status, WNOHANG);
    supervisor_exited(id, generation);
  });
}

// Runs `then` once the pidfd's process has exited. The reactor's word is
// checked with poll() first: under load it woke a wait on a live
// supervisor's pidfd (1 create in 200, four at a time on a busy machine),
// which then was taken for lost and its sandbox failed. A wake-up the
// pidfd does not confirm waits again.
void Gateway::on_exit(const std::shared_ptr<asio::posix::stream_descriptor>& desc,
                      std::function<void()> then) {
  desc->async_wait(
      asio::posix::descriptor_base::wait_read,
      [this, desc, then = std::move(then)](const boost::system::error_code& ec) mutable {
        if (ec) return;
        pollfd p{desc->native_handle(), POLLIN, 0};
        if (::poll(&p, 1, 0) == 0) {
          log::debug("a pidfd woke with its process alive: waiting again");
          return on_exit(desc, std::move(then));
        }
        then();
      });
}

void Gateway::after_sandbox_gone(int64_t pid, uint64_t start, std::function<void()> then,
                                 bool end) {
  int fd = pidfd_open(static_cast<pid_t>(pid));
  if (fd < 0) return then();
  auto desc = std::make_shared<asio::posix::stream_descriptor>(io_, fd);
  // Checked once the pidfd holds it: the pid is still that process.
  if (!alive(pid, start)) return then();
  if (end) ::syscall(SYS_pidfd_send_signal, fd, SIGKILL, nullptr, 0);
  on_exit(desc, std::move(then));
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
  if (it != supervised_.end() && it->second.generation == generation &&
      !it->second.children.empty()) {
    // The children a delete noted (an init never reported to this gateway)
    // are ended and gone before the entry that holds them is: the delete
    // waited for none of them when they went with it.
    auto [pid, start] = it->second.children.back();
    it->second.children.pop_back();
    return after_sandbox_gone(
        pid, start, [this, id, generation] { supervisor_exited(id, generation); }, true);
  }
  bool reported = it != supervised_.end() && it->second.final_status;
  if (it != supervised_.end() && it->second.generation == generation) supervised_.erase(it);
  auto record = store_->find_by_id(id);
  if (!record || record->generation != generation) return;
  if (record->intent == "delete") return finish_delete(id);
  record->supervisor_pid = 0;
  record->supervisor_start = 0;
  cleanup_host(record->id, record->generation);
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
void Gateway::cleanup_host(const std::string& id, int64_t generation) const {
  runtime::remove_cgroups("openshell-" + id);
  // Every generation's socket up to this one: a supervisor that died while
  // the gateway was down left its own behind. By name: a listing of the
  // directory, which holds every sandbox's, made each delete of a thousand
  // read a thousand names.
  for (int64_t g = 1; g <= generation; ++g) ::unlink(paths_.supervisor_socket(id, g).c_str());
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
  if (removing_.count(id)) return;  // its files are being removed
  auto record = store_->find_by_id(id);
  if (!record) return;
  if (alive(record->supervisor_pid, record->supervisor_start)) {
    // Killing the supervisor ends its sandbox: its init's lifeline closes.
    // An init it has not reported to this gateway (this gateway restarted,
    // and the supervisor has not reconnected yet) is one of its children:
    // they are noted first, and the delete waits for them as for the init.
    const bool watched = supervised_.count(id) > 0;
    if (!watched || !supervised_[id].init_pid)
      supervised_[id].children = children_of(static_cast<pid_t>(record->supervisor_pid));
    ::kill(static_cast<pid_t>(record->supervisor_pid), SIGKILL);
    if (!watched) watch_supervisor(id, record->supervisor_pid, record->generation);
    return;  // finish_delete runs again when it is gone
  }
  // Then its init, and what else was its child, ended (SIGKILL to a pid
  // namespace's init ends the namespace): a stopped init, or one slow to
  // see its lifeline close, must not outlive its delete.
  auto sup = supervised_.find(id);
  if (sup != supervised_.end() && sup->second.init_pid) {
    int64_t pid = sup->second.init_pid;
    uint64_t start = sup->second.init_start;
    sup->second.init_pid = 0;
    return after_sandbox_gone(
        pid, start, [this, id] { finish_delete(id); }, true);
  }
  if (sup != supervised_.end() && !sup->second.children.empty()) {
    auto [pid, start] = sup->second.children.back();
    sup->second.children.pop_back();
    return after_sandbox_gone(
        pid, start, [this, id] { finish_delete(id); }, true);
  }
  // Its files, cgroups and id range go on the background's thread (ext4
  // frees a file's blocks in unlink, and may discard them synchronously:
  // most of a delete's time on this thread was there). The record stays,
  // Deleting, until they are gone: a gateway that dies meanwhile finishes
  // the delete when it starts again. An error is logged by the background,
  // and the rest of the job skipped. What the job needs of the record is
  // read here: the record itself is moved into `done`.
  removing_.insert(id);
  const int64_t generation = record->generation;
  const auto uid_start = spec_of(*record)->host_uid_start;
  background_.run(
      [this, id, generation, uid_start] {
        cleanup_host(id, generation);
        const std::string dir = paths_.sandbox(id);
        runtime::remove_tree(dir);
        image::Store(paths_.images()).release(id);
        if (uid_start) runtime::release_sandbox_ids(*uid_start, dir);
      },
      [this, record = std::move(*record)]() mutable {
        removed_.push_back(std::move(record));
        // While other deletes' files are still being removed, their records
        // wait to go with this one (a commit waits for the disk), up to
        // kForgetBatch of them; the last one's `done` commits the rest.
        if (removing_.size() > removed_.size() && removed_.size() < kForgetBatch) return;
        if (forget_posted_) return;
        forget_posted_ = true;
        asio::post(io_, [this] { forget_deleted(); });
      });
}

void Gateway::forget_deleted() {
  forget_posted_ = false;
  const std::vector<SandboxRecord> done = std::exchange(removed_, {});
  // One commit for every delete finished since the last: each commit waits
  // for the disk (synchronous=FULL), and a thousand deletes made a thousand.
  std::vector<const SandboxRecord*> forgotten;
  try {
    store_->atomically("remove " + std::to_string(done.size()) + " deleted sandboxes", [&] {
      for (const auto& record : done) store_->remove(record.id);  // and its forwards
    });
    for (const auto& record : done) forgotten.push_back(&record);
  } catch (const Error& e) {
    // One at a time, then: one that cannot be removed does not hold back
    // the others, and stays Deleting (a later delete tries it again).
    log::warn(e.what());
    for (const auto& record : done) try {
        store_->remove(record.id);
        forgotten.push_back(&record);
      } catch (const Error& one) {
        log::error(one.what());
      }
  }
  for (const auto& record : done) removing_.erase(record.id);
  for (const SandboxRecord* record : forgotten) {
    const std::string& id = record->id;
    if (gone_.size() > 256) gone_.erase(gone_.begin());
    gone_[id] = view(*record);
    supervised_.erase(id);
    specs_.erase(id);
    forward_states_.erase(id);
    notify(id);
  }
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
  trace(record.id, "stored");
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

}  // namespace openshell::gateway
