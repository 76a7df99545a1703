// virtio-vsock driven as a guest's driver drives it: rx buffers posted,
// packets written to the tx queue, answers read from the rx queue; the host
// side is the fd the device gives the host.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"
#include "virtio_driver.h"
#include "vm/guest_memory.h"
#include "vm/virtio_vsock.h"

namespace openshell::vm {
namespace {

using testing::Driver;
using testing::Used;
using namespace virtio_vsock;

constexpr uint64_t kVersion1 = 1ull << virtio_mmio::kFeatureVersion1;
constexpr uint32_t kRxBufferBytes = 4096;
constexpr int kRxBuffers = 32;

struct Packet {
  Header header{};
  std::string payload;
};

// Reads what the host end of a connection has, until `bytes` or 30 s.
std::string read_host(int fd, size_t bytes) {
  std::string got;
  while (got.size() < bytes) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 30000) != 1) break;
    char buffer[65536];
    ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    got.append(buffer, n);
  }
  return got;
}

// True when the host end reads end of file within 30 s.
bool host_sees_eof(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 30000) != 1) return false;
  char c;
  return ::read(fd, &c, 1) == 0;
}

class VirtioVsockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    memory_ = std::make_unique<GuestMemory>(GuestMemory::create(testing::kMemoryBytes));
    device_ = std::make_unique<VirtioVsock>(*memory_);
    device_->listen(1024, [this](UniqueFd fd, uint32_t guest_port) {
      accepted_.push_back(std::move(fd));
      accepted_ports_.push_back(guest_port);
    });
    device_->start();
    driver_ = std::make_unique<Driver>(*device_, *memory_);
    ASSERT_TRUE(driver_->bring_up(kVersion1, 3, 64));
    for (int i = 0; i < kRxBuffers; ++i) post_rx(driver_->alloc(kRxBufferBytes));
    driver_->notify(kRxQueue);
  }
  void TearDown() override { device_.reset(); }

  void post_rx(uint64_t buffer) {
    uint16_t head = driver_->post(kRxQueue, {{buffer, kRxBufferBytes, true}});
    rx_buffer_[head] = buffer;
  }

  Header header(uint16_t op, uint32_t guest_port, uint32_t host_port, uint32_t len = 0) {
    Header h{};
    h.src_cid = kGuestCid;
    h.dst_cid = kHostCid;
    h.src_port = guest_port;
    h.dst_port = host_port;
    h.len = len;
    h.type = kTypeStream;
    h.op = op;
    h.buf_alloc = buf_alloc_;
    h.fwd_cnt = fwd_cnt_;
    return h;
  }

  // Sends a packet on the tx queue and waits until the device took it.
  void send(Header h, const std::string& payload = "") {
    uint64_t at = driver_->alloc(sizeof h + payload.size());
    std::memcpy(driver_->host(at, sizeof h), &h, sizeof h);
    std::memcpy(driver_->host(at + sizeof h, payload.size()), payload.data(), payload.size());
    driver_->post(kTxQueue, {{at, static_cast<uint32_t>(sizeof h + payload.size()), false}});
    driver_->notify(kTxQueue);
    Used used;
    ASSERT_TRUE(driver_->wait_used(kTxQueue, used)) << device_->fatal();
  }

  // The next packet the device put in an rx buffer; the buffer goes back.
  bool receive(Packet& packet) {
    Used used;
    if (!driver_->wait_used(kRxQueue, used)) return false;
    uint64_t buffer = rx_buffer_[used.id];
    EXPECT_GE(used.length, sizeof(Header));
    std::memcpy(&packet.header, driver_->host(buffer, sizeof(Header)), sizeof(Header));
    EXPECT_EQ(used.length, sizeof(Header) + packet.header.len);
    packet.payload.assign(
        reinterpret_cast<char*>(driver_->host(buffer + sizeof(Header), packet.header.len)),
        packet.header.len);
    post_rx(buffer);
    driver_->notify(kRxQueue);
    return true;
  }

  // Receives packets until one with `op`; the data of RW packets before it
  // is added to `data`.
  bool receive_until(uint16_t op, Packet& packet, std::string* data = nullptr) {
    while (receive(packet)) {
      if (packet.header.op == op) return true;
      if (packet.header.op == kOpRw && data) {
        data->append(packet.payload);
        continue;
      }
      if (packet.header.op != kOpCreditUpdate) {
        ADD_FAILURE() << "unexpected op " << packet.header.op;
        return false;
      }
    }
    return false;
  }

  // The guest connects from `guest_port` to the host's listener.
  int connect_from_guest(uint32_t guest_port) {
    send(header(kOpRequest, guest_port, 1024));
    Packet answer;
    EXPECT_TRUE(receive(answer));
    EXPECT_EQ(answer.header.op, kOpResponse);
    EXPECT_EQ(answer.header.src_cid, kHostCid);
    EXPECT_EQ(answer.header.dst_cid, kGuestCid);
    EXPECT_EQ(answer.header.src_port, 1024u);
    EXPECT_EQ(answer.header.dst_port, guest_port);
    EXPECT_EQ(answer.header.buf_alloc, kBufferBytes);
    if (accepted_.empty()) return -1;
    EXPECT_EQ(accepted_ports_.back(), guest_port);
    return accepted_.back().get();
  }

  std::unique_ptr<GuestMemory> memory_;
  std::unique_ptr<VirtioVsock> device_;
  std::unique_ptr<Driver> driver_;
  std::vector<UniqueFd> accepted_;
  std::vector<uint32_t> accepted_ports_;
  std::map<uint16_t, uint64_t> rx_buffer_;
  uint32_t buf_alloc_ = 1 << 20;
  uint32_t fwd_cnt_ = 0;
};

TEST_F(VirtioVsockTest, ConfigGivesTheGuestItsCid) {
  EXPECT_EQ(driver_->get(virtio_mmio::kDeviceId), kDeviceId);
  EXPECT_EQ(driver_->config64(0), kGuestCid);
}

TEST_F(VirtioVsockTest, AGuestConnectsToAHostListenerAndDataFlowsBothWays) {
  int host = connect_from_guest(5000);
  ASSERT_GE(host, 0);
  EXPECT_EQ(device_->connection_count(), 1u);
  send(header(kOpRw, 5000, 1024, 5), "hello");
  EXPECT_EQ(read_host(host, 5), "hello");
  ASSERT_EQ(::write(host, "world!", 6), 6);
  Packet packet;
  std::string data;
  while (data.size() < 6 && receive(packet)) {
    if (packet.header.op != kOpRw) continue;
    EXPECT_EQ(packet.header.src_port, 1024u);
    EXPECT_EQ(packet.header.dst_port, 5000u);
    EXPECT_EQ(packet.header.fwd_cnt, 5u);  // the device wrote our 5 bytes to the host
    data += packet.payload;
  }
  EXPECT_EQ(data, "world!");
}

TEST_F(VirtioVsockTest, TheHostsEndsAreOrdinaryBlockingSockets) {
  int accepted = connect_from_guest(5013);
  ASSERT_GE(accepted, 0);
  UniqueFd connected = device_->connect(7002);
  for (int fd : {accepted, connected.get()}) {
    int flags = ::fcntl(fd, F_GETFL);
    ASSERT_GE(flags, 0);
    EXPECT_EQ(flags & O_NONBLOCK, 0);
    int type = 0;
    socklen_t length = sizeof type;
    ASSERT_EQ(::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length), 0);
    EXPECT_EQ(type, SOCK_STREAM);
  }
}

TEST_F(VirtioVsockTest, TheHostConnectsToAGuestPort) {
  UniqueFd host = device_->connect(7000);
  Packet request;
  ASSERT_TRUE(receive(request));
  EXPECT_EQ(request.header.op, kOpRequest);
  EXPECT_EQ(request.header.dst_port, 7000u);
  EXPECT_EQ(request.header.dst_cid, kGuestCid);
  uint32_t host_port = request.header.src_port;
  send(header(kOpResponse, 7000, host_port));
  send(header(kOpRw, 7000, host_port, 3), "abc");
  EXPECT_EQ(read_host(host.get(), 3), "abc");
  ASSERT_EQ(::write(host.get(), "xyz", 3), 3);
  Packet packet;
  std::string data;
  while (data.size() < 3 && receive(packet))
    if (packet.header.op == kOpRw) data += packet.payload;
  EXPECT_EQ(data, "xyz");
}

// connect_later: the socket is made on the device's thread (the VMM's main
// thread may make none), and the fd handed to the callback.
TEST_F(VirtioVsockTest, AConnectLaterIsMadeOnTheDevicesThread) {
  std::mutex mutex;
  std::condition_variable done_cv;
  UniqueFd host;
  std::string error = "not called";
  std::thread::id caller;
  ASSERT_EQ(device_->connect_later(7003,
                                   [&](UniqueFd fd, const std::string& why) {
                                     std::lock_guard lock(mutex);
                                     host = std::move(fd);
                                     error = why;
                                     caller = std::this_thread::get_id();
                                     done_cv.notify_all();
                                   }),
            "");
  {
    std::unique_lock lock(mutex);
    ASSERT_TRUE(
        done_cv.wait_for(lock, std::chrono::seconds(30), [&] { return error != "not called"; }));
  }
  EXPECT_EQ(error, "");
  ASSERT_TRUE(host);
  EXPECT_NE(caller, std::this_thread::get_id());
  Packet request;
  ASSERT_TRUE(receive(request));
  EXPECT_EQ(request.header.op, kOpRequest);
  EXPECT_EQ(request.header.dst_port, 7003u);
  send(header(kOpResponse, 7003, request.header.src_port));
  send(header(kOpRw, 7003, request.header.src_port, 2), "hi");
  EXPECT_EQ(read_host(host.get(), 2), "hi");
}

TEST_F(VirtioVsockTest, AConnectLaterBeforeTheDriverIsReadyIsRefusedAtOnce) {
  driver_->set(virtio_mmio::kStatus, 0);
  bool called = false;
  EXPECT_EQ(device_->connect_later(1, [&](UniqueFd, const std::string&) { called = true; }),
            "virtio-vsock: the guest's driver is not running");
  EXPECT_FALSE(called);
}

TEST_F(VirtioVsockTest, AGuestThatRefusesTheHostsConnectionGivesTheHostEndOfFile) {
  UniqueFd host = device_->connect(7001);
  Packet request;
  ASSERT_TRUE(receive(request));
  send(header(kOpRst, 7001, request.header.src_port));
  EXPECT_TRUE(host_sees_eof(host.get()));
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, AConnectionToAPortNobodyListensOnIsReset) {
  send(header(kOpRequest, 5001, 9));
  Packet answer;
  ASSERT_TRUE(receive(answer));
  EXPECT_EQ(answer.header.op, kOpRst);
  EXPECT_EQ(answer.header.src_port, 9u);
  EXPECT_EQ(answer.header.dst_port, 5001u);
  EXPECT_TRUE(accepted_.empty());
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, DataForNoConnectionIsReset) {
  send(header(kOpRw, 5002, 1024, 2), "hi");
  Packet answer;
  ASSERT_TRUE(receive(answer));
  EXPECT_EQ(answer.header.op, kOpRst);
  EXPECT_TRUE(accepted_.empty());
}

TEST_F(VirtioVsockTest, AnUnknownOpResetsTheConnection) {
  int host = connect_from_guest(5003);
  ASSERT_GE(host, 0);
  send(header(99, 5003, 1024));
  Packet answer;
  ASSERT_TRUE(receive(answer));
  EXPECT_EQ(answer.header.op, kOpRst);
  EXPECT_TRUE(host_sees_eof(host));
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, AHeaderLongerThanItsChainResetsTheConnection) {
  int host = connect_from_guest(5004);
  ASSERT_GE(host, 0);
  send(header(kOpRw, 5004, 1024, 100), "only ten b");  // says 100, carries 10
  Packet answer;
  ASSERT_TRUE(receive(answer));
  EXPECT_EQ(answer.header.op, kOpRst);
  EXPECT_TRUE(host_sees_eof(host));  // nothing of the 10 bytes reached the host
  EXPECT_EQ(device_->fatal(), "");
}

TEST_F(VirtioVsockTest, APacketFromAnotherCidIsDropped) {
  Header h = header(kOpRequest, 5005, 1024);
  h.src_cid = 42;
  uint64_t before = device_->faults();
  send(h);
  EXPECT_TRUE(accepted_.empty());
  EXPECT_EQ(device_->faults(), before + 1);
}

TEST_F(VirtioVsockTest, TheDeviceSendsNoMoreThanTheGuestsCredit) {
  buf_alloc_ = 1000;
  int host = connect_from_guest(5006);
  ASSERT_GE(host, 0);
  std::string sent(5000, 'c');
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = static_cast<char>('a' + i % 26);
  ASSERT_EQ(::write(host, sent.data(), sent.size()), 5000);
  // The first 1000 bytes come; then the device waits for credit. A credit
  // request is answered at once, with no data before it beyond the 1000.
  std::string data;
  Packet packet;
  while (data.size() < 1000 && receive(packet)) {
    ASSERT_EQ(packet.header.op, kOpRw);
    data += packet.payload;
  }
  ASSERT_EQ(data.size(), 1000u);
  send(header(kOpCreditRequest, 5006, 1024));
  ASSERT_TRUE(receive_until(kOpCreditUpdate, packet, &data));
  EXPECT_EQ(data.size(), 1000u);
  // The guest read 1000: the device may send 1000 more, and only that.
  fwd_cnt_ = 1000;
  send(header(kOpCreditUpdate, 5006, 1024));
  while (data.size() < 2000 && receive(packet)) {
    ASSERT_EQ(packet.header.op, kOpRw);
    data += packet.payload;
  }
  send(header(kOpCreditRequest, 5006, 1024));
  ASSERT_TRUE(receive_until(kOpCreditUpdate, packet, &data));
  EXPECT_EQ(data.size(), 2000u);
  // Room for everything: the rest comes.
  buf_alloc_ = 1 << 20;
  send(header(kOpCreditUpdate, 5006, 1024));
  while (data.size() < 5000 && receive(packet))
    if (packet.header.op == kOpRw) data += packet.payload;
  EXPECT_EQ(data, sent);
}

TEST_F(VirtioVsockTest, AGuestThatSendsPastTheDevicesCreditIsReset) {
  int host = connect_from_guest(5007);
  ASSERT_GE(host, 0);
  // More than the device's buf_alloc in one packet, the host reading nothing.
  std::string flood(kBufferBytes + 1, 'f');
  send(header(kOpRw, 5007, 1024, static_cast<uint32_t>(flood.size())), flood);
  Packet answer;
  ASSERT_TRUE(receive(answer));
  EXPECT_EQ(answer.header.op, kOpRst);
  EXPECT_TRUE(host_sees_eof(host));
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, TheDeviceTellsTheGuestOfRoomAsTheHostReads) {
  int host = connect_from_guest(5008);
  ASSERT_GE(host, 0);
  std::string chunk(2048, 'r');
  uint32_t sent = 0;
  // Half of the device's buffer, read by the host: a credit update follows.
  while (sent < kBufferBytes / 2) {
    send(header(kOpRw, 5008, 1024, static_cast<uint32_t>(chunk.size())), chunk);
    sent += chunk.size();
    EXPECT_EQ(read_host(host, chunk.size()).size(), chunk.size());
  }
  Packet packet;
  ASSERT_TRUE(receive(packet));
  EXPECT_EQ(packet.header.op, kOpCreditUpdate);
  EXPECT_EQ(packet.header.fwd_cnt, sent);
}

TEST_F(VirtioVsockTest, AGuestShutdownGivesTheHostEndOfFileAndRstEndsIt) {
  int host = connect_from_guest(5009);
  ASSERT_GE(host, 0);
  send(header(kOpRw, 5009, 1024, 4), "last");
  Header h = header(kOpShutdown, 5009, 1024);
  h.flags = kShutdownSend;
  send(h);
  EXPECT_EQ(read_host(host, 4), "last");
  EXPECT_TRUE(host_sees_eof(host));
  // The host may still write: the guest only stopped sending.
  ASSERT_EQ(::write(host, "bye", 3), 3);
  Packet packet;
  std::string data;
  while (data.size() < 3 && receive(packet))
    if (packet.header.op == kOpRw) data += packet.payload;
  EXPECT_EQ(data, "bye");
  send(header(kOpRst, 5009, 1024));
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, AShutdownBothWaysIsConfirmedWithRst) {
  int host = connect_from_guest(5010);
  ASSERT_GE(host, 0);
  Header h = header(kOpShutdown, 5010, 1024);
  h.flags = kShutdownSend | kShutdownReceive;
  send(h);
  Packet answer;
  ASSERT_TRUE(receive(answer));
  EXPECT_EQ(answer.header.op, kOpRst);
  EXPECT_TRUE(host_sees_eof(host));
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, TheHostClosingItsEndSendsShutdownAfterItsData) {
  int host = connect_from_guest(5011);
  ASSERT_GE(host, 0);
  ASSERT_EQ(::write(host, "tail", 4), 4);
  accepted_.clear();  // the host closes its end
  Packet packet;
  std::string data;
  ASSERT_TRUE(receive_until(kOpShutdown, packet, &data));
  EXPECT_EQ(data, "tail");
  EXPECT_EQ(packet.header.flags, kShutdownSend);
  send(header(kOpRst, 5011, 1024));
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, AResetOfTheDeviceClosesEveryConnection) {
  int host = connect_from_guest(5012);
  ASSERT_GE(host, 0);
  driver_->set(virtio_mmio::kStatus, 0);
  EXPECT_TRUE(host_sees_eof(host));
  EXPECT_EQ(device_->connection_count(), 0u);
}

TEST_F(VirtioVsockTest, ConnectBeforeTheDriverIsReadyIsRefused) {
  driver_->set(virtio_mmio::kStatus, 0);
  EXPECT_NE(::openshell::testing::error_of([&] {
              device_->connect(1);
            }).find("the guest's driver is not running"),
            std::string::npos);
}

}  // namespace
}  // namespace openshell::vm
