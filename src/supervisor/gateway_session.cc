// The session to the gateway: the launch file presented, the sandbox started
// on the welcome, its status reported, stops and policy updates taken.
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/json_text.h"
#include "base/log.h"
#include "net/http.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

using nlohmann::json;

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
      std::vector<std::string> env;
      if (m.contains("env") && m["env"].is_array())
        for (const auto& e : m["env"])
          if (e.is_string()) env.push_back(e.get<std::string>());
      take_environment(env);
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

}  // namespace openshell::supervisor
