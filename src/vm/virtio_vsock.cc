#include "vm/virtio_vsock.h"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "vm/chain_io.h"

namespace openshell::vm {

using namespace virtio_vsock;

namespace {

constexpr uint64_t kHeaderBytes = sizeof(Header);
// Packets without payload waiting for rx buffers: past this, the device
// stops taking the guest's tx packets until the guest posts rx buffers.
constexpr size_t kMaxControl = 2 * kMaxConnections;

}  // namespace

VirtioVsock::VirtioVsock(const GuestMemory& memory, uint64_t guest_cid)
    : VirtioMmio(memory, kDeviceId, 0, {kQueueSize, kQueueSize, kQueueSize}),
      guest_cid_(guest_cid),
      epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
  if (!epoll_) throw_errno("epoll_create1 for virtio-vsock");
}

VirtioVsock::~VirtioVsock() { stop(); }

void VirtioVsock::read_config(uint64_t offset, uint8_t* data, uint32_t len) {
  // guest_cid, le64.
  if (offset < 8 && len <= 8 - offset)
    std::memcpy(data, reinterpret_cast<const uint8_t*>(&guest_cid_) + offset, len);
  else
    count_fault();
}

void VirtioVsock::listen(uint32_t port, Accept accept) {
  std::lock_guard lock(mutex_);
  listeners_[port] = std::move(accept);
}

size_t VirtioVsock::connection_count() const {
  std::lock_guard lock(mutex_);
  return connections_.size();
}

// Both ends of a connection's pair block: the host's is an ordinary socket,
// and the device's own calls all pass MSG_DONTWAIT.
UniqueFd VirtioVsock::connect(uint32_t guest_port) {
  std::lock_guard lock(mutex_);
  return connect_locked(guest_port);
}

std::string VirtioVsock::connect_later(uint32_t guest_port, Connected done) {
  std::lock_guard lock(mutex_);
  if (!running()) return "virtio-vsock: the guest's driver is not running";
  if (pending_connects_.size() >= kMaxConnections)
    return "virtio-vsock: " + std::to_string(kMaxConnections) + " connections are waiting";
  pending_connects_.emplace_back(guest_port, std::move(done));
  kick();
  return "";
}

UniqueFd VirtioVsock::connect_locked(uint32_t guest_port) {
  if (!running()) throw Error("virtio-vsock: the guest's driver is not running");
  if (connections_.size() >= kMaxConnections)
    throw Error("virtio-vsock: " + std::to_string(kMaxConnections) + " connections are open");
  uint32_t host_port = 0;
  for (int tries = 0; tries < 65536 && host_port == 0; ++tries) {
    uint32_t candidate = next_port_;
    next_port_ = next_port_ == 0xffffffffu ? 49152 : next_port_ + 1;
    if (find(candidate, guest_port) == nullptr && listeners_.count(candidate) == 0)
      host_port = candidate;
  }
  if (host_port == 0) throw Error("virtio-vsock: no free host port");
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
    throw_errno("socketpair for a virtio-vsock connection");
  UniqueFd host_end(pair[1]);
  Connection& c = connections_[{host_port, guest_port}];
  c.host_port = host_port;
  c.guest_port = guest_port;
  c.socket.reset(pair[0]);
  by_fd_[pair[0]] = {host_port, guest_port};
  epoll_event event{};
  event.data.fd = pair[0];
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pair[0], &event);
  send_control(c, kOpRequest);
  kick();
  return host_end;
}

VirtioVsock::Connection* VirtioVsock::find(uint32_t host_port, uint32_t guest_port) {
  auto it = connections_.find({host_port, guest_port});
  return it == connections_.end() ? nullptr : &it->second;
}

Header VirtioVsock::header_for(uint32_t host_port, uint32_t guest_port, uint16_t op) const {
  Header h{};
  h.src_cid = kHostCid;
  h.dst_cid = guest_cid_;
  h.src_port = host_port;
  h.dst_port = guest_port;
  h.type = kTypeStream;
  h.op = op;
  h.buf_alloc = kBufferBytes;
  return h;
}

void VirtioVsock::send_control(const Connection& c, uint16_t op, uint32_t flags) {
  Header h = header_for(c.host_port, c.guest_port, op);
  h.flags = flags;
  control_.push_back(h);
}

void VirtioVsock::send_rst(uint32_t host_port, uint32_t guest_port) {
  control_.push_back(header_for(host_port, guest_port, kOpRst));
}

void VirtioVsock::close(uint32_t host_port, uint32_t guest_port) {
  auto it = connections_.find({host_port, guest_port});
  if (it == connections_.end()) return;
  by_fd_.erase(it->second.socket.get());
  connections_.erase(it);  // closing the socket takes it out of epoll_
}

void VirtioVsock::device_reset() {
  for (auto& [port, done] : pending_connects_) done(UniqueFd(), "the guest reset its vsock device");
  pending_connects_.clear();
  connections_.clear();
  by_fd_.clear();
  control_.clear();
}

uint32_t VirtioVsock::guest_credit(const Connection& c) const {
  uint32_t in_flight = c.tx_cnt - c.peer_fwd_cnt;
  return in_flight >= c.peer_buf_alloc ? 0 : c.peer_buf_alloc - in_flight;
}

void VirtioVsock::queue_notified(uint16_t queue_index) {
  // The event queue's buffers stay with the device: it has no events to send.
  (void)queue_index;
  process_tx();
  process_rx();
  // Rx buffers may have made room for the answers that paused the tx queue.
  if (queue(kTxQueue).has_available()) {
    process_tx();
    process_rx();
  }
}

void VirtioVsock::device_event() {
  while (!pending_connects_.empty()) {
    auto [port, done] = std::move(pending_connects_.front());
    pending_connects_.pop_front();
    UniqueFd fd;
    std::string error;
    try {
      fd = connect_locked(port);
    } catch (const Error& e) {
      error = e.what();
    }
    done(std::move(fd), error);
  }
  epoll_event events[32];
  int n = ::epoll_wait(epoll_.get(), events, 32, 0);
  for (int i = 0; i < n; ++i) {
    auto it = by_fd_.find(events[i].data.fd);
    if (it == by_fd_.end()) continue;
    Connection& c = connections_.at(it->second);
    Key key = it->second;
    if (events[i].events & EPOLLOUT) flush_to_host(c);
    if (find(key.first, key.second) == nullptr) continue;
    if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_from_host(c);
    // A closed host end reports EPOLLHUP whatever epoll_ waits for: its
    // socket leaves epoll_ and the rest is read as rx buffers allow.
    if ((events[i].events & (EPOLLHUP | EPOLLERR)) && c.watched) {
      ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.socket.get(), nullptr);
      c.watched = false;
    }
  }
  process_rx();
}

void VirtioVsock::process_tx() {
  Chain chain;
  while (control_.size() < kMaxControl && next_chain(kTxQueue, chain)) {
    Header h{};
    if (chain.readable_bytes < kHeaderBytes) {
      count_fault();  // not even a header: nothing to answer
    } else {
      copy_from_buffers(chain.readable, 0, &h, kHeaderBytes);
      if (h.src_cid != guest_cid_) {
        count_fault();  // not the guest's own address: dropped
      } else if (h.len > chain.readable_bytes - kHeaderBytes) {
        count_fault();
        send_rst(h.dst_port, h.src_port);
        close(h.dst_port, h.src_port);
      } else {
        handle_packet(h, chain);
      }
    }
    complete(kTxQueue, chain.head, 0);
  }
}

void VirtioVsock::handle_packet(const Header& h, const Chain& chain) {
  if (h.dst_cid != kHostCid || h.type != kTypeStream) {
    if (h.op != kOpRst) send_rst(h.dst_port, h.src_port);
    close(h.dst_port, h.src_port);
    return;
  }
  Connection* c = find(h.dst_port, h.src_port);
  if (c == nullptr) {
    if (h.op == kOpRequest)
      accept_request(h);
    else if (h.op != kOpRst)
      send_rst(h.dst_port, h.src_port);
    return;
  }
  c->peer_buf_alloc = h.buf_alloc;
  c->peer_fwd_cnt = h.fwd_cnt;
  switch (h.op) {
    case kOpResponse:
      if (c->established) {
        send_rst(c->host_port, c->guest_port);
        close(c->host_port, c->guest_port);
        return;
      }
      c->established = true;
      break;
    case kOpRw:
      if (!c->established || c->guest_sends_no_more) {
        send_rst(c->host_port, c->guest_port);
        close(c->host_port, c->guest_port);
        return;
      }
      receive_data(*c, h, chain);
      return;
    case kOpCreditUpdate:
      break;
    case kOpCreditRequest:
      send_control(*c, kOpCreditUpdate);
      break;
    case kOpShutdown:
      if (h.flags & kShutdownSend) c->guest_sends_no_more = true;
      if (h.flags & kShutdownReceive) c->guest_receives_no_more = true;
      if (c->guest_sends_no_more && c->guest_receives_no_more) {
        // Both ways done: the connection ends with the RST that confirms it.
        send_rst(c->host_port, c->guest_port);
        close(c->host_port, c->guest_port);
        return;
      }
      if (c->guest_sends_no_more && c->to_host.empty()) ::shutdown(c->socket.get(), SHUT_WR);
      break;
    case kOpRst:
      close(c->host_port, c->guest_port);
      return;
    default:  // a second REQUEST, or an op the protocol does not have
      send_rst(c->host_port, c->guest_port);
      close(c->host_port, c->guest_port);
      return;
  }
  update_events(*c);
}

void VirtioVsock::accept_request(const Header& h) {
  auto listener = listeners_.find(h.dst_port);
  if (listener == listeners_.end() || connections_.size() >= kMaxConnections) {
    send_rst(h.dst_port, h.src_port);
    return;
  }
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    send_rst(h.dst_port, h.src_port);
    return;
  }
  Connection& c = connections_[{h.dst_port, h.src_port}];
  c.host_port = h.dst_port;
  c.guest_port = h.src_port;
  c.socket.reset(pair[0]);
  c.established = true;
  c.peer_buf_alloc = h.buf_alloc;
  c.peer_fwd_cnt = h.fwd_cnt;
  by_fd_[pair[0]] = {c.host_port, c.guest_port};
  epoll_event event{};
  event.data.fd = pair[0];
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, pair[0], &event);
  send_control(c, kOpResponse);
  update_events(c);
  listener->second(UniqueFd(pair[1]), h.src_port);
}

void VirtioVsock::receive_data(Connection& c, const Header& h, const Chain& chain) {
  // The guest may send only what our credit allowed: more is a broken peer.
  if (h.len > kBufferBytes - c.to_host.size()) {
    count_fault();
    send_rst(c.host_port, c.guest_port);
    close(c.host_port, c.guest_port);
    return;
  }
  size_t at = c.to_host.size();
  c.to_host.resize(at + h.len);
  copy_from_buffers(chain.readable, kHeaderBytes, c.to_host.data() + at, h.len);
  flush_to_host(c);
}

void VirtioVsock::flush_to_host(Connection& c) {
  Key key{c.host_port, c.guest_port};
  while (!c.to_host.empty()) {
    ssize_t n =
        ::send(c.socket.get(), c.to_host.data(), c.to_host.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    if (n <= 0) {  // the host closed its end
      send_rst(c.host_port, c.guest_port);
      close(key.first, key.second);
      return;
    }
    c.to_host.erase(0, static_cast<size_t>(n));
    c.fwd_cnt += static_cast<uint32_t>(n);
  }
  if (c.to_host.empty() && c.guest_sends_no_more) ::shutdown(c.socket.get(), SHUT_WR);
  // Tell the guest about the room it has again before it runs out.
  if (c.fwd_cnt - c.fwd_cnt_told >= kBufferBytes / 2) {
    send_control(c, kOpCreditUpdate);
    c.fwd_cnt_told = c.fwd_cnt;
  }
  update_events(c);
}

void VirtioVsock::read_from_host(Connection& c) {
  if (!c.established || c.host_eof || c.guest_receives_no_more || !c.to_guest.empty()) {
    update_events(c);
    return;
  }
  char buffer[kMaxPayload];
  ssize_t n;
  do {
    n = ::recv(c.socket.get(), buffer, sizeof buffer, MSG_DONTWAIT);
  } while (n < 0 && errno == EINTR);
  if (n > 0) {
    c.to_guest.assign(buffer, static_cast<size_t>(n));
  } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
    c.host_eof = true;
    send_control(c, kOpShutdown, kShutdownSend);
  }
  update_events(c);
}

void VirtioVsock::update_events(Connection& c) {
  if (!c.watched) return;
  if (c.host_eof) {
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.socket.get(), nullptr);
    c.watched = false;
    return;
  }
  uint32_t want = 0;
  if (c.established && !c.guest_receives_no_more && c.to_guest.empty()) want |= EPOLLIN;
  if (!c.to_host.empty()) want |= EPOLLOUT;
  if (want == c.events) return;
  epoll_event event{};
  event.events = want;
  event.data.fd = c.socket.get();
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, c.socket.get(), &event);
  c.events = want;
}

void VirtioVsock::process_rx() {
  for (;;) {
    Connection* sender = nullptr;
    if (control_.empty()) {
      for (auto& [key, c] : connections_) {
        if (c.to_guest.empty() && c.established && !c.watched) read_from_host(c);
        if (!c.to_guest.empty() && guest_credit(c) > 0) {
          sender = &c;
          break;
        }
      }
      if (sender == nullptr) return;
    }
    Chain chain;
    if (!next_chain(kRxQueue, chain)) return;
    // Too small for a header, or for a header and some data.
    if (chain.writable_bytes < kHeaderBytes + (sender ? 1 : 0)) {
      count_fault();
      complete(kRxQueue, chain.head, 0);
      continue;
    }
    if (sender == nullptr) {
      Header h = control_.front();
      control_.pop_front();
      if (Connection* c = find(h.src_port, h.dst_port)) {
        h.fwd_cnt = c->fwd_cnt;
        c->fwd_cnt_told = c->fwd_cnt;
      }
      copy_to_buffers(chain.writable, 0, &h, kHeaderBytes);
      complete(kRxQueue, chain.head, kHeaderBytes);
      continue;
    }
    Connection& c = *sender;
    uint64_t room = chain.writable_bytes - kHeaderBytes;
    uint64_t n = c.to_guest.size();
    if (n > guest_credit(c)) n = guest_credit(c);
    if (n > room) n = room;
    Header h = header_for(c.host_port, c.guest_port, kOpRw);
    h.len = static_cast<uint32_t>(n);
    h.fwd_cnt = c.fwd_cnt;
    c.fwd_cnt_told = c.fwd_cnt;
    copy_to_buffers(chain.writable, 0, &h, kHeaderBytes);
    copy_to_buffers(chain.writable, kHeaderBytes, c.to_guest.data(), n);
    c.to_guest.erase(0, n);
    c.tx_cnt += static_cast<uint32_t>(n);
    complete(kRxQueue, chain.head, static_cast<uint32_t>(kHeaderBytes + n));
    if (c.to_guest.empty()) read_from_host(c);
  }
}

}  // namespace openshell::vm
