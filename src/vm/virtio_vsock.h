// virtio-vsock (virtio 1.x, 5.10): stream sockets between the guest (CID 3)
// and the host (CID 2), over an rx, a tx and an event queue. The host side
// of every connection is a plain fd, one end of a Unix socket pair that the
// device pumps to and from the queues: a guest that connects to a port the
// host listens on hands the host's callback an fd, and connect() gives the
// host an fd to a guest port. Flow control is the protocol's credit: the
// device buffers at most kBufferBytes a connection from the guest, and
// sends to the guest no more than the guest said it has room for.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "base/unique_fd.h"
#include "vm/virtio_mmio.h"

namespace openshell::vm {

namespace virtio_vsock {
inline constexpr uint32_t kDeviceId = 19;
inline constexpr uint16_t kQueueSize = 128;
inline constexpr uint16_t kRxQueue = 0;
inline constexpr uint16_t kTxQueue = 1;
inline constexpr uint16_t kEventQueue = 2;
inline constexpr uint64_t kHostCid = 2;
inline constexpr uint64_t kGuestCid = 3;

inline constexpr uint16_t kTypeStream = 1;
inline constexpr uint16_t kOpRequest = 1;
inline constexpr uint16_t kOpResponse = 2;
inline constexpr uint16_t kOpRst = 3;
inline constexpr uint16_t kOpShutdown = 4;
inline constexpr uint16_t kOpRw = 5;
inline constexpr uint16_t kOpCreditUpdate = 6;
inline constexpr uint16_t kOpCreditRequest = 7;
inline constexpr uint32_t kShutdownReceive = 1;
inline constexpr uint32_t kShutdownSend = 2;

// What the device buffers from the guest per connection (its buf_alloc),
// the most payload it puts in one packet, and how many connections it keeps.
inline constexpr uint32_t kBufferBytes = 256 * 1024;
inline constexpr uint32_t kMaxPayload = 64 * 1024;
inline constexpr size_t kMaxConnections = 1024;

struct __attribute__((packed)) Header {
  uint64_t src_cid;
  uint64_t dst_cid;
  uint32_t src_port;
  uint32_t dst_port;
  uint32_t len;
  uint16_t type;
  uint16_t op;
  uint32_t flags;
  uint32_t buf_alloc;
  uint32_t fwd_cnt;
};
static_assert(sizeof(Header) == 44);
}  // namespace virtio_vsock

class VirtioVsock : public VirtioMmio {
 public:
  // Called on the device's thread with the device locked: take the fd and
  // return; calling back into the device would deadlock.
  using Accept = std::function<void(UniqueFd host_end, uint32_t guest_port)>;

  explicit VirtioVsock(const GuestMemory& memory, uint64_t guest_cid = virtio_vsock::kGuestCid);
  ~VirtioVsock() override;

  std::string name() const override { return "virtio-vsock"; }

  // The host listens on `port`: each guest connection to it is accepted and
  // its fd given to `accept`. A connection to a port nobody listens on is
  // refused (RST).
  void listen(uint32_t port, Accept accept);
  // A connection to the guest's `port`. The fd reads end of file if the
  // guest refuses it. Throws Error when the guest's driver is not running.
  UniqueFd connect(uint32_t guest_port);
  // connect() done on the device's own thread, for a caller whose seccomp
  // filter lets it make no socket (the VMM's main thread serving its
  // channel). Returns "" once queued, or why not (the guest's driver is not
  // running). `done` is called later with the device locked, as Accept is:
  // on the device's thread with the fd, or with no fd and why not (there, or
  // on a vCPU thread when the guest resets the device meanwhile).
  using Connected = std::function<void(UniqueFd host_end, const std::string& error)>;
  std::string connect_later(uint32_t guest_port, Connected done);
  size_t connection_count() const;

 protected:
  void read_config(uint64_t offset, uint8_t* data, uint32_t len) override;
  void queue_notified(uint16_t queue) override;
  void device_event() override;
  void device_reset() override;
  int event_fd() const override { return epoll_.get(); }

 private:
  struct Connection {
    uint32_t host_port = 0;
    uint32_t guest_port = 0;
    UniqueFd socket;  // the device's end of the pair
    bool established = false;
    std::string to_host;   // from the guest, not yet written to the socket
    std::string to_guest;  // read from the socket, not yet in an rx buffer
    uint32_t fwd_cnt = 0;  // bytes of the guest's written to the socket
    uint32_t fwd_cnt_told = 0;
    uint32_t tx_cnt = 0;  // bytes sent to the guest
    uint32_t peer_buf_alloc = 0;
    uint32_t peer_fwd_cnt = 0;
    bool guest_sends_no_more = false;
    bool guest_receives_no_more = false;
    bool host_eof = false;
    bool watched = true;  // in epoll_
    uint32_t events = 0;  // what epoll_ waits for
  };
  using Key = std::pair<uint32_t, uint32_t>;  // host port, guest port

  UniqueFd connect_locked(uint32_t guest_port);
  void process_tx();
  void process_rx();
  void handle_packet(const virtio_vsock::Header& header, const Chain& chain);
  void accept_request(const virtio_vsock::Header& header);
  void receive_data(Connection& connection, const virtio_vsock::Header& header, const Chain& chain);
  void flush_to_host(Connection& connection);
  void read_from_host(Connection& connection);
  void update_events(Connection& connection);
  void send_control(const Connection& connection, uint16_t op, uint32_t flags = 0);
  void send_rst(uint32_t host_port, uint32_t guest_port);
  void close(uint32_t host_port, uint32_t guest_port);
  uint32_t guest_credit(const Connection& connection) const;
  Connection* find(uint32_t host_port, uint32_t guest_port);
  virtio_vsock::Header header_for(uint32_t host_port, uint32_t guest_port, uint16_t op) const;

  uint64_t guest_cid_;
  UniqueFd epoll_;
  std::map<uint32_t, Accept> listeners_;
  std::map<Key, Connection> connections_;
  std::map<int, Key> by_fd_;
  std::deque<virtio_vsock::Header> control_;  // waiting for rx buffers
  std::deque<std::pair<uint32_t, Connected>> pending_connects_;
  uint32_t next_port_ = 49152;
};

}  // namespace openshell::vm
