// The sandbox's port forwards: the gateway's set (in its welcome, then a
// forwards message on every change) applied to the listeners (forwards.h),
// their states reported back, and the init asked for the sockets they
// connect into the sandbox with.
#include <cerrno>
#include <cstring>

#include "base/log.h"
#include "base/packet.h"
#include "net/http.h"
#include "runtime/init_protocol.h"
#include "supervisor/owner.h"

namespace openshell::supervisor {

namespace session = protocol::session;

void Supervisor::apply_forwards(const std::vector<session::Forward>& forwards) {
  if (copy_) return;  // a copy supervisor has no network to forward into
  forwards_wanted_ = forwards;
  // Listeners only while the sandbox runs: a sandbox that has ended (or
  // never started) refuses nothing silently, it has no listener at all.
  if (state_ != State::kRunning || (!container_ && !vm_)) {
    if (forwards_) forwards_->close_all();
    return report_forwards();
  }
  if (vm_) return report_forwards();  // see report_forwards: not yet for a micro-VM
  if (!forwards_)
    forwards_ =
        std::make_unique<ForwardSet>(io_, [this](auto done) { sandbox_socket(std::move(done)); });
  forwards_->apply(forwards);
  report_forwards();
}

void Supervisor::report_forwards() {
  if (!session_ || !session_welcome_) return;
  session::ForwardStates report;
  if (vm_) {
    for (const auto& f : forwards_wanted_)
      report.forwards.push_back(
          {f.bind, f.port, "error",
           forward_address(f) + ": port forwards into a micro-VM sandbox are not supported"});
  } else if (forwards_) {
    report.forwards = forwards_->states();
  }
  session_->send(protocol::encode(report), false);
}

void Supervisor::sandbox_socket(std::function<void(UniqueFd, const std::string&)> done) {
  if (state_ != State::kRunning || !control_.is_open())
    return done(UniqueFd(), "the sandbox has ended");
  const uint64_t id = next_socket_++;
  const int err =
      send_packet(control_.native_handle(), runtime::make_message({"socket", std::to_string(id)}),
                  nullptr, 0, MSG_DONTWAIT);
  if (err != 0)
    return done(UniqueFd(),
                std::string("ask the sandbox's init for a socket: ") + std::strerror(-err));
  socket_requests_[id] = std::move(done);
}

// The init's answer: "socket ID ERRNO", the socket beside it.
void Supervisor::socket_made(const runtime::InitMessage& message, PacketFds& fds) {
  if (message.fields.size() != 2) return;
  auto it = socket_requests_.find(std::strtoull(message.fields[0].c_str(), nullptr, 10));
  if (it == socket_requests_.end()) return;
  auto done = std::move(it->second);
  socket_requests_.erase(it);
  const int err = std::atoi(message.fields[1].c_str());
  if (err != 0 || !fds[0])
    return done(UniqueFd(),
                std::string("a socket in the sandbox: ") + std::strerror(err != 0 ? err : EBADMSG));
  done(std::move(fds[0]), "");
}

void Supervisor::fail_socket_requests(const std::string& why) {
  auto pending = std::move(socket_requests_);
  socket_requests_.clear();
  for (auto& [id, done] : pending) done(UniqueFd(), why);
}

}  // namespace openshell::supervisor
