// The exec relay: connections the gateway hands over, and the init's answers
// about the processes it started for them.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>

#include "auth/peer.h"
#include "base/error.h"
#include "base/log.h"
#include "base/packet.h"
#include "base/unique_fd.h"
#include "net/http.h"
#include "protocol/exec_handoff.h"
#include "protocol/exec_stream.h"
#include "runtime/init_protocol.h"
#include "spec/container_spec.h"
#include "supervisor/exec_session.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

namespace {

// The path of a handed-over request ("GET /v1/sandboxes/x/attach?a HTTP/1.1").
std::string_view handoff_path(std::string_view request) {
  const size_t start = request.find(' ');
  if (start == std::string_view::npos) return {};
  const size_t end = request.find_first_of(" ?\r\n", start + 1);
  return request.substr(start + 1, end == std::string_view::npos ? end : end - start - 1);
}

}  // namespace

void Supervisor::watch_control() {
  control_.async_wait(asio::posix::descriptor_base::wait_read,
                      [this](const boost::system::error_code& ec) {
                        if (ec) return;
                        long n = read_control();
                        if (n <= 0 && n != -EAGAIN && n != -EINTR) return;  // the init is gone
                        watch_control();
                      });
}

long Supervisor::read_control() {
  std::string packet;
  PacketFds fds;  // what a session does not take is closed with them
  long n = receive_packet(control_.native_handle(), &packet, &fds);
  if (n <= 0) return n;
  runtime::InitMessage m = runtime::parse_message(packet);
  if (m.kind == runtime::InitMessage::Kind::kSocket) {
    socket_made(m, fds);
    return n;
  }
  uint64_t id = m.fields.empty() ? 0 : std::strtoull(m.fields[0].c_str(), nullptr, 10);
  auto it = execs_.find(id);
  if (it == execs_.end()) {
    // Not ours (any longer): its fds close here.
  } else if (m.kind == runtime::InitMessage::Kind::kStarted) {
    it->second->started(std::move(fds[0]));
  } else if (m.kind == runtime::InitMessage::Kind::kFailed && m.fields.size() >= 4) {
    int code = std::atoi(m.fields[1].c_str());
    int err = std::atoi(m.fields[2].c_str());
    it->second->failed(code, m.fields[3] + ": " + std::strerror(err));
  } else if (m.kind == runtime::InitMessage::Kind::kExited && m.fields.size() >= 2) {
    it->second->exited(std::atoi(m.fields[1].c_str()));
  }
  return n;
}

std::optional<runtime::ExecUser> Supervisor::exec_user(const std::string& user) const {
  const runtime::ResolvedUser ids = spec::exec_user(
      spec_, spec::sandbox_placement(launch_.sandbox_id, launch_.sandbox_name, paths_), user);
  if (ids.uid == container_spec_.uid && ids.gid == container_spec_.gid) return std::nullopt;
  if (container_) {
    const namespaces::IdMap& map = container_->id_map();
    const bool mapped = map.host_uid(ids.uid) && map.host_gid(ids.gid);
    if (!mapped && map.is_single())
      throw Error("--user " + user + ": the sandbox holds only its own user (" +
                  std::to_string(container_spec_.uid) + ":" + std::to_string(container_spec_.gid) +
                  "): rootless without subordinate ids in /etc/subuid and /etc/subgid");
    if (!mapped)
      throw Error("--user " + user + ": " + std::to_string(ids.uid) + ":" +
                  std::to_string(ids.gid) + " is outside the sandbox's ids (" + map.describe() +
                  ")");
  }
  return runtime::ExecUser{ids.uid, ids.gid};
}

bool Supervisor::send_exec(const runtime::ExecRequest& request, const int* fds, int count) {
  if (state_ != State::kRunning || !control_.is_open()) return false;
  return send_packet(control_.native_handle(), runtime::encode_exec(request), fds, count) == 0;
}

void Supervisor::kill_exec(uint64_t id, int sig) {
  if (!control_.is_open()) return;
  send_packet(control_.native_handle(),
              runtime::make_message({"kill", std::to_string(id), std::to_string(sig)}), nullptr, 0);
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
          protocol::ExecHandoff handoff;
          try {
            handoff = protocol::receive_exec_handoff(conn.get());
          } catch (const Error& e) {
            log::error(e.what());
            continue;
          }
          // `sandbox connect` (GET .../attach) joins the main process's console.
          const bool attach = handoff_path(handoff.request).ends_with("/attach");
          // A copy supervisor serves one copy, and only one.
          if (!attach && !spec_.vm && copy_ && next_exec_ > 1) continue;
          // An exec whose start message came in the request starts at once
          // (a VM's guest exec reads it from the stream as ever).
          std::optional<exec::Start> early;
          if (!attach && !spec_.vm && state_ == State::kRunning)
            early = exec::start_in_request(handoff.request);
          net::WebSocket::Headers answer;
          if (early) answer.emplace_back(exec::kStartHeader, exec::kStartAccepted);
          std::string error;
          auto ws = net::WebSocket::accept_handed_over(io_, handoff.connection.release(),
                                                       handoff.request, &error, answer);
          if (!ws) {
            log::error("exec handover: " + error);
            continue;
          }
          if (attach) {
            console_.attach(ws);
            continue;
          }
          if (spec_.vm) {
            start_guest_exec(ws);
            continue;
          }
          if (copy_) ++open_execs_;
          uint64_t id = next_exec_++;
          auto session = std::make_shared<ExecSession>(io_, *this, ws, id);
          execs_[id] = session;
          session->start();
          if (state_ != State::kRunning)
            session->sandbox_gone();
          else if (early)
            session->start_early(*early);
        }
        accept_exec();
      });
}

}  // namespace openshell::supervisor
