#include <string>

#include "base/log.h"
#include "gateway/service.h"

namespace openshell::gateway {

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
        else if (!sandbox_id->empty() && current_session(*sandbox_id, ws))
          on_session_message(*sandbox_id, message);
      },
      [this, ws, sandbox_id](const std::string&) {
        auto it = supervised_.find(*sandbox_id);
        if (it != supervised_.end() && it->second.session == ws) it->second.session.reset();
      });
}

// Whether ws is the sandbox's session now: one that another superseded says
// nothing more of the sandbox (its status would be taken for the current
// supervisor's).
bool Gateway::current_session(const std::string& id,
                              const std::shared_ptr<net::WebSocket>& ws) const {
  auto it = supervised_.find(id);
  return it != supervised_.end() && it->second.session == ws;
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
  // One supervisor per generation: the one this gateway started or found
  // at its start. Another with the same launch file was started by a
  // gateway killed before it could record it; it may not run a second
  // sandbox beside the first.
  if (auto watched = supervised_.find(launch.sandbox_id);
      watched != supervised_.end() && watched->second.pidfd &&
      watched->second.generation == launch.generation && watched->second.pid != ws->peer().pid)
    return refuse(session::Superseded{"generation " + std::to_string(launch.generation) +
                                      " of sandbox '" + record->name + "' is supervisor pid " +
                                      std::to_string(watched->second.pid) + "'s"});
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
  // The providers' credentials too, which no file holds.
  // And its forwards, whose states this session reports afresh.
  forward_states_.erase(record->id);
  trace(record->id, "session");
  session::Welcome welcome{spec_of(*record)->env, credentials_of(record->id),
                           session_forwards(record->id)};
  // The CA made at the launch: to the supervisor started for it, once.
  Supervised& started = supervised_[launch.sandbox_id];
  if (!started.ca_key.empty() && started.pid == ws->peer().pid &&
      started.generation == launch.generation) {
    welcome.ca_cert = std::move(started.ca_cert);
    welcome.ca_key = std::move(started.ca_key);
    started.ca_cert.clear();
    started.ca_key.clear();
  }
  ws->send(protocol::encode(welcome), false);
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
  if (auto* report = std::get_if<session::ForwardStates>(&message))
    return forward_report(id, report->forwards);
  const auto* status = std::get_if<session::Status>(&message);
  auto record = store_->find_by_id(id);
  if (!record || !status || status->generation != record->generation) return;
  if (status->running()) {
    auto s = supervised_.find(id);
    if (s != supervised_.end()) {
      s->second.init_pid = status->init_pid.value_or(0);
      s->second.init_start = start_time(static_cast<pid_t>(s->second.init_pid));
    }
    if (status->ready() &&
        (record->phase == Phase::kProvisioning || record->phase == Phase::kStarting)) {
      trace(id, "running");
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

}  // namespace openshell::gateway
