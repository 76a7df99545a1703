#include "gateway/gateway.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

#include "auth/peer.h"
#include "base/event_loop.h"
#include "base/files.h"
#include "base/json_text.h"
#include "base/log.h"
#include "base/process_name.h"
#include "base/text.h"
#include "gateway/service.h"

namespace openshell::gateway {

namespace {

// The configuration file's identity before it is read (a change after that
// is read again), and what it says.
GatewayConfig load_config_noting(const std::string& path, struct stat* st) {
  if (::stat(path.c_str(), st) != 0) *st = {};
  return load_config(path, std::getenv);
}

}  // namespace

Gateway::Gateway(asio::io_context& io, Paths paths, RunOptions options)
    : io_(io),
      paths_(std::move(paths)),
      options_(std::move(options)),
      config_(load_config_noting(config_path(paths_, ::geteuid(), std::getenv), &config_stat_)),
      signals_(io, SIGTERM, SIGINT),
      server_(
          io, [this](std::shared_ptr<net::Exchange> e) { handle(std::move(e)); },
          config_.api_limits()) {
  auto from_flags = [](Setting* s, std::string value) {
    s->value = std::move(value);
    s->source = "command line";
  };
  if (!options_.listen.empty()) from_flags(&config_.listen, text::join(options_.listen, ","));
  if (!options_.insecure_listen.empty())
    from_flags(&config_.insecure_listen, text::join(options_.insecure_listen, ","));
  if (!options_.tls_dir.empty()) from_flags(&config_.tls_dir, options_.tls_dir);
}

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
  store_->set_secret_box(box);  // providers' credentials
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
  const std::optional<gid_t> socket_gid = socket_group();
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
  // A sandbox running as our uid passes the socket's mode: the pid namespace
  // tells. (A TCP peer has no pid to tell; a sandbox has a network namespace
  // of its own, and the TLS port wants a certificate.)
  server_.set_admission(
      [](int fd, const net::PeerCredentials& peer) -> std::optional<net::Refusal> {
        if (peer.transport != net::PeerCredentials::Transport::kUnix) return std::nullopt;
        std::string why = auth::peer_in_sandbox(fd);
        if (why.empty()) return std::nullopt;
        return net::Refusal{403, "peer_in_sandbox",
                            "the gateway serves no process inside a sandbox: " + why};
      });
  server_.listen(paths_.socket(), 0600);
  listen_tcp();
  if (socket_gid) share_socket(*socket_gid);
  signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (!ec) shutdown();
  });
  log::error("gateway " + gateway_id_ + " serving on " + paths_.socket() + " (pid " +
             std::to_string(::getpid()) + ")");
}

void Gateway::listen_tcp() {
  auto addresses = [](const Setting& s) {
    std::vector<std::string> out;
    for (const std::string& part : text::split(s.value, ','))
      if (!part.empty()) out.push_back(part);
    return out;
  };
  const std::vector<std::string> tls = addresses(config_.listen);
  if (!tls.empty()) {
    const std::string dir =
        config_.tls_dir.value.empty() ? paths_.tls_dir() : config_.tls_dir.value;
    const net::TlsFiles files{dir + "/ca.crt", dir + "/server.crt", dir + "/server.key"};
    std::vector<std::string> missing;
    for (const std::string* file : {&files.ca, &files.cert, &files.key})
      if (!files::exists(*file)) missing.push_back(file->substr(dir.size() + 1));
    if (missing.size() == 3)
      throw Error("no certificates in " + dir + ": run 'openshell gateway generate-certs'");
    if (!missing.empty())
      throw Error(dir + " lacks " + text::join(missing, ", ") +
                  ": run 'openshell gateway generate-certs'");
    for (const std::string& address : tls)
      log::error("gateway serving TLS on " + server_.listen_tls(address, files) +
                 " (certificates from " + dir + ")");
  }
  for (const std::string& address : addresses(config_.insecure_listen))
    log::error("gateway serving plain HTTP on " + server_.listen_tcp(address) +
               " (--insecure-listen: no authentication)");
}

// The group the socket is opened to (--socket-group over the file's
// api.socket_group), or none; checked before anything listens.
std::optional<gid_t> Gateway::socket_group() const {
  const std::string& name =
      !options_.socket_group.empty() ? options_.socket_group : config_.socket_group.value;
  if (name.empty()) return std::nullopt;
  if (::geteuid() != 0)
    throw Error("socket group " + name +
                ": only a root gateway opens its socket to a group (this one runs as uid " +
                std::to_string(::geteuid()) + ")");
  const std::optional<gid_t> gid = group_id(name);
  if (!gid) throw Error("socket group " + name + ": no such group in /etc/group");
  return gid;
}

// The socket opened to the group, once it is root's alone: its group
// first, then the mode, so that no other group ever holds it open.
void Gateway::share_socket(gid_t gid) {
  // Its directory: searchable by the group, not listable.
  if (::chown(paths_.run_dir.c_str(), 0, gid) != 0) throw_errno("chown " + paths_.run_dir);
  if (::chmod(paths_.run_dir.c_str(), 0710) != 0) throw_errno("chmod " + paths_.run_dir);
  if (::chown(paths_.socket().c_str(), 0, gid) != 0) throw_errno("chown " + paths_.socket());
  if (::chmod(paths_.socket().c_str(), 0660) != 0) throw_errno("chmod " + paths_.socket());
  log::warn("the socket " + paths_.socket() + " is open to group gid " + std::to_string(gid));
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
    // And so do its listeners.
    fresh.listen = config_.listen;
    fresh.insecure_listen = config_.insecure_listen;
    fresh.tls_dir = config_.tls_dir;
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
  // The event and the record in one commit.
  record.updated_ms = now_ms();
  store_->atomically("set the phase of sandbox '" + record.name + "'", [&] {
    store_->append_event(record.id, "Phase",
                         std::string(phase_name(phase)) +
                             (reason.empty() ? "" : " (" + reason + ")") +
                             (message.empty() ? "" : ": " + message),
                         now);
    store_->update(record);
  });
  notify(record.id);
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
  // Watchers first: they see every change of the sandboxes they may see.
  json event = record ? json{{"type", "phase"}, {"sandbox", view(*record)}}
                      : json{{"type", "deleted"}, {"id", id}};
  std::string owner;
  if (record)
    owner = owner_of(*record);
  else if (auto last = gone_.find(id); last != gone_.end())
    owner = last->second.value("owner", "");
  std::string text = json_text(event);
  for (auto it = watchers_.begin(); it != watchers_.end();) {
    if (auto ws = it->ws.lock()) {
      if (may_touch(it->who, owner)) ws->send(text, false);
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

int run(int ready_fd, const RunOptions& options) {
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
    Gateway gateway(io, Paths::resolve(), options);
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
