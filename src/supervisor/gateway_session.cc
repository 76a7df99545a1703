// The session to the gateway: the launch file presented, the sandbox started
// on the welcome, its status reported, stops and policy updates taken.
#include <unistd.h>

#include <variant>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "net/http.h"
#include "protocol/supervisor_session.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

namespace session = protocol::session;

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
        ws->send(protocol::encode(session::Hello{bytes, ::getpid()}), false);
      });
}

void Supervisor::on_session_message(const std::string& data) {
  session::ToSupervisor message;
  try {
    message = session::decode_to_supervisor(data);
  } catch (const protocol::ProtocolError& e) {
    log::error(std::string("from the gateway: ") + e.what());
    return;
  }
  if (auto* welcome = std::get_if<session::Welcome>(&message)) {
    session_welcome_ = true;
    credentials_ = std::move(welcome->credentials);
    if (!container_ && !vm_ && state_ == State::kRunning) {
      take_environment(welcome->env);
      take_ca(std::move(welcome->ca_cert), std::move(welcome->ca_key));
      if (spec_error_.empty()) try {
          listen_for_exec();
        } catch (const Error& e) {
          spec_error_ = e.what();
        }
      if (spec_error_.empty())
        start_container();
      else
        fail_start(exit_code::kFailure, spec_error_);
    }
    report_status();
    // Every welcome carries the whole set: after a gateway's restart the
    // same set, whose listeners (and connections) stay as they are.
    apply_forwards(welcome->forwards);
  } else if (std::holds_alternative<session::Superseded>(message) ||
             std::holds_alternative<session::Rejected>(message)) {
    // Another launch of this sandbox is current, or ours is not valid: end,
    // claiming nothing (the gateway has recorded why).
    const std::string& why = std::holds_alternative<session::Superseded>(message)
                                 ? std::get<session::Superseded>(message).message
                                 : std::get<session::Rejected>(message).message;
    log::error("the gateway refused this supervisor: " + why);
    result_ = exit_code::kFailure;
    refused_ = true;
    io_.stop();
  } else if (auto* stop_message = std::get_if<session::Stop>(&message)) {
    stop(stop_message->grace_ms);
  } else if (auto* policy = std::get_if<session::Policy>(&message)) {
    // A live update of the network part: the next connection sees it.
    session::PolicyApplied ack{policy->revision, std::nullopt};
    try {
      if (proxy_) apply_policy(policy->text, policy->revision);
      spec_.policy = policy->text;
    } catch (const std::exception& e) {
      ack.error = e.what();
    }
    if (session_) session_->send(protocol::encode(ack), false);
  } else if (auto* update = std::get_if<session::Credentials>(&message)) {
    // A provider was updated, attached or detached: the next request
    // carries the new set. Only their number is told.
    credentials_ = std::move(update->credentials);
    apply_credentials();
    log::debug("credentials updated (" + std::to_string(credentials_.size()) + ")");
  } else if (auto* forwards = std::get_if<session::Forwards>(&message)) {
    apply_forwards(forwards->forwards);
  }
}

// What the gateway learns of the sandbox: running (after every welcome), or
// how it ended, once; the same record is the exit file.
session::Status Supervisor::status() const {
  session::Status status;
  status.generation = launch_.generation;
  if (state_ == State::kEnded) {
    status.state = stopped_ ? "stopped" : "exited";
    status.exit_code = exit_code_;
    status.reason = reason_;
    status.message = message_;
  } else {
    // A VM is ready once its guest's init has started the main process.
    status.state = vm_ && !vm_ready_ ? "starting" : "running";
    // The gateway waits for it to be gone before it removes the sandbox.
    status.init_pid = container_ ? container_->pid() : vm_ ? vm_->pid() : 0;
  }
  return status;
}

void Supervisor::report_status() {
  if (!session_ || !session_welcome_) return;
  session::Status now = status();
  session_->send(protocol::encode(now), false);
  if (!now.running()) {
    final_sent_ = true;
    session_->close();
  }
}

}  // namespace openshell::supervisor
