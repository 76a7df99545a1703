#include "runtime/guest_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/vm_sockets.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "base/directory.h"
#include "base/error.h"
#include "base/exe_credit.h"
#include "base/files.h"
#include "base/text.h"

namespace openshell::runtime::guest {

namespace {

// The /proc entries one search for a caller may read, as the egress
// proxy's (egress/identity.h's kIdentityBudget): a guest holds far fewer.
constexpr size_t kIdentityBudget = 100000;
constexpr size_t kSpliceBuffer = 64 * 1024;
// Queued bytes for the DNS stream past which queries are dropped (the
// callers ask again), and the most queries awaiting an answer.
constexpr size_t kDnsQueueLimit = 256 * 1024;
constexpr size_t kDnsPendingLimit = 4096;
constexpr auto kDnsAnswerWait = std::chrono::seconds(10);

sockaddr_in loopback(uint16_t port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

// All of data to a blocking socket, without SIGPIPE.
bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

UniqueFd connect_to_host(uint32_t port) {
  UniqueFd fd(socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  // The highest free reserved port: each connection holds its own.
  bool bound = false;
  for (uint32_t local = 1023; local >= kReservedPortFirst && !bound; --local) {
    sockaddr_vm self{};
    self.svm_family = AF_VSOCK;
    self.svm_cid = VMADDR_CID_ANY;
    self.svm_port = local;
    if (bind(fd.get(), reinterpret_cast<sockaddr*>(&self), sizeof self) == 0)
      bound = true;
    else if (errno != EADDRINUSE)
      break;
  }
  if (!bound) {
    int err = errno;
    fd.reset();
    errno = err;
    return fd;
  }
  sockaddr_vm addr{};
  addr.svm_family = AF_VSOCK;
  addr.svm_cid = VMADDR_CID_HOST;
  addr.svm_port = port;
  int rc;
  do rc = connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

void bring_up_loopback() {
  UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("a socket to bring up lo");
  ifreq request{};
  std::strncpy(request.ifr_name, "lo", IFNAMSIZ - 1);
  if (ioctl(fd.get(), SIOCGIFFLAGS, &request) != 0) throw_errno("read the flags of lo");
  if (request.ifr_flags & IFF_UP) return;
  request.ifr_flags = static_cast<short>(request.ifr_flags | IFF_UP);
  if (ioctl(fd.get(), SIOCSIFFLAGS, &request) != 0) throw_errno("bring up lo");
}

UniqueFd listen_loopback_tcp(uint16_t port) {
  const std::string what = "listen on TCP 127.0.0.1:" + std::to_string(port);
  UniqueFd fd(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(what);
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr = loopback(port);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      listen(fd.get(), 128) != 0)
    throw_errno(what);
  return fd;
}

UniqueFd bind_loopback_udp(uint16_t port) {
  const std::string what = "bind UDP 127.0.0.1:" + std::to_string(port);
  UniqueFd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno(what);
  sockaddr_in addr = loopback(port);
  if (bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw_errno(what);
  return fd;
}

std::string identity_line(pid_t pid, const std::string& exe, const std::string& untrusted) {
  nlohmann::ordered_json line = {{"pid", pid}, {"exe", exe}, {"untrusted", untrusted}};
  // Replaced, not refused: a path's bytes need not be UTF-8.
  return line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string identity_of_client(int conn) {
  sockaddr_in peer{}, local{};
  socklen_t peer_len = sizeof peer, local_len = sizeof local;
  if (getpeername(conn, reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0 ||
      getsockname(conn, reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
      peer.sin_family != AF_INET)
    return identity_line(0, "", "");
  auto table = files::try_read("/proc/self/net/tcp");
  uint64_t inode =
      table ? credit::loopback_socket_inode(*table, ntohs(peer.sin_port), ntohs(local.sin_port))
            : 0;
  if (inode == 0) return identity_line(0, "", "");
  // Every process of the guest is searched: the guest is the sandbox. Of
  // several holders (a fork after connect), the newest is the caller, as
  // the egress proxy judges it.
  const std::string wanted = "socket:[" + std::to_string(inode) + "]";
  size_t budget = kIdentityBudget;
  pid_t found = 0;
  uint64_t found_start = 0;
  files::for_each_entry("/proc", [&](const char* name, unsigned char) {
    if (budget == 0) return false;
    --budget;
    auto pid = text::parse_uint(name);
    if (!pid) return true;
    pid_t p = static_cast<pid_t>(*pid);
    if (!credit::holds_socket(p, wanted, &budget)) return true;
    uint64_t start = credit::start_time(p);
    if (found == 0 || start >= found_start) {
      found = p;
      found_start = start;
    }
    return true;
  });
  if (found == 0) return identity_line(0, "", "");
  credit::Judgement judged = credit::judge(found);
  return identity_line(found, judged.exe, judged.untrusted);
}

void splice_both_ways(int a, int b) {
  set_nonblocking(a);
  set_nonblocking(b);
  struct Direction {
    int from, to;
    std::string pending;
    bool eof = false, done = false;
  };
  Direction dirs[2] = {{a, b, {}}, {b, a, {}}};
  char buf[kSpliceBuffer];
  while (!dirs[0].done || !dirs[1].done) {
    pollfd fds[4];
    int read_i[2] = {-1, -1}, write_i[2] = {-1, -1};
    nfds_t count = 0;
    for (int d = 0; d < 2; ++d) {
      if (dirs[d].done) continue;
      if (dirs[d].pending.empty() && !dirs[d].eof) {
        read_i[d] = static_cast<int>(count);
        fds[count++] = {dirs[d].from, POLLIN, 0};
      } else if (!dirs[d].pending.empty()) {
        write_i[d] = static_cast<int>(count);
        fds[count++] = {dirs[d].to, POLLOUT, 0};
      }
    }
    if (poll(fds, count, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    for (int d = 0; d < 2; ++d) {
      Direction& dir = dirs[d];
      if (read_i[d] >= 0 && fds[read_i[d]].revents) {
        ssize_t n = read(dir.from, buf, sizeof buf);
        if (n > 0)
          dir.pending.assign(buf, static_cast<size_t>(n));
        else if (n == 0)
          dir.eof = true;
        else if (errno != EAGAIN && errno != EINTR)
          return;  // reset: the other side learns it from the close
      }
      if (write_i[d] >= 0 && fds[write_i[d]].revents) {
        ssize_t n = send(dir.to, dir.pending.data(), dir.pending.size(), MSG_NOSIGNAL);
        if (n > 0)
          dir.pending.erase(0, static_cast<size_t>(n));
        else if (n < 0 && errno != EAGAIN && errno != EINTR)
          return;
      }
      if (dir.eof && dir.pending.empty() && !dir.done) {
        shutdown(dir.to, SHUT_WR);
        dir.done = true;
      }
    }
  }
}

void relay_connection(UniqueFd conn, uint32_t host_port, const HostConnector& connect) {
  std::string line = identity_of_client(conn.get());
  UniqueFd host = connect(host_port);
  if (!host) {
    files::write_all(
        2,
        "openshell-guest: " +
            errno_message("connect to the host's egress port " + std::to_string(host_port), errno) +
            "\n");
    return;
  }
  if (!send_all(host.get(), line)) return;
  splice_both_ways(conn.get(), host.get());
}

void serve_egress(int listener, uint32_t host_port, const HostConnector& connect,
                  size_t max_connections) {
  signal(SIGCHLD, SIG_DFL);  // its connections' processes are waited for here
  size_t live = 0;
  for (;;) {
    while (live > 0 && waitpid(-1, nullptr, WNOHANG) > 0) --live;
    if (live >= max_connections) {
      if (waitpid(-1, nullptr, 0) > 0) --live;
      continue;
    }
    int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EMFILE || errno == ENFILE) usleep(100 * 1000);
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      _exit(1);
    }
    pid_t pid = fork();
    if (pid == 0) {
      close(listener);
      relay_connection(UniqueFd(conn), host_port, connect);
      _exit(0);
    }
    if (pid > 0) ++live;
    close(conn);
  }
}

void serve_dns(int udp, uint32_t host_port, const HostConnector& connect) {
  using Clock = std::chrono::steady_clock;
  struct Pending {
    uint16_t id;  // the caller's
    sockaddr_storage from;
    socklen_t from_len;
    Clock::time_point deadline;
  };
  std::unordered_map<uint16_t, Pending> pending;  // by the id sent to the host
  uint16_t next_id = static_cast<uint16_t>(getpid());
  UniqueFd stream;
  std::string out, in;
  auto drop_stream = [&] {
    stream.reset();
    out.clear();
    in.clear();
    pending.clear();  // their answers cannot come any more; the callers ask again
  };
  std::vector<char> buf(65536 + 2);
  bool warned = false;
  for (;;) {
    pollfd fds[2];
    nfds_t count = 0;
    int udp_i = -1, stream_i = -1;
    if (out.size() < kDnsQueueLimit) {
      udp_i = static_cast<int>(count);
      fds[count++] = {udp, POLLIN, 0};
    }
    if (stream) {
      stream_i = static_cast<int>(count);
      fds[count++] = {stream.get(), static_cast<short>(POLLIN | (out.empty() ? 0 : POLLOUT)), 0};
    }
    int ready = poll(fds, count, pending.empty() ? -1 : 1000);
    if (ready < 0 && errno != EINTR) _exit(1);
    const Clock::time_point now = Clock::now();
    for (auto it = pending.begin(); it != pending.end();)
      it = it->second.deadline < now ? pending.erase(it) : std::next(it);
    if (ready <= 0) continue;

    if (udp_i >= 0 && fds[udp_i].revents) {
      Pending query{};
      query.from_len = sizeof query.from;
      ssize_t n = recvfrom(udp, buf.data() + 2, 65535, 0, reinterpret_cast<sockaddr*>(&query.from),
                           &query.from_len);
      // Shorter than a DNS header is no query; with every id in use, the
      // caller asks again.
      if (n >= 12 && pending.size() < kDnsPendingLimit) {
        if (!stream) {
          stream = connect(host_port);
          if (!stream) {
            if (!warned)
              files::write_all(
                  2, "openshell-guest: " +
                         errno_message(
                             "connect to the host's DNS port " + std::to_string(host_port), errno) +
                         "\n");
            warned = true;
          } else {
            set_nonblocking(stream.get());
          }
        }
        if (stream) {
          while (pending.count(next_id)) ++next_id;
          char* message = buf.data() + 2;
          query.id = static_cast<uint16_t>((static_cast<uint8_t>(message[0]) << 8) |
                                           static_cast<uint8_t>(message[1]));
          query.deadline = now + kDnsAnswerWait;
          pending[next_id] = query;
          message[0] = static_cast<char>(next_id >> 8);
          message[1] = static_cast<char>(next_id & 0xff);
          buf[0] = static_cast<char>(n >> 8);
          buf[1] = static_cast<char>(n & 0xff);
          out.append(buf.data(), static_cast<size_t>(n) + 2);
          ++next_id;
        }
      }
    }
    if (stream_i >= 0 && (fds[stream_i].revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t n = read(stream.get(), buf.data(), buf.size());
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
        drop_stream();
        continue;
      }
      if (n > 0) in.append(buf.data(), static_cast<size_t>(n));
      while (in.size() >= 2) {
        size_t length =
            (static_cast<size_t>(static_cast<uint8_t>(in[0])) << 8) | static_cast<uint8_t>(in[1]);
        if (in.size() < 2 + length) break;
        std::string answer = in.substr(2, length);
        in.erase(0, 2 + length);
        if (answer.size() < 12) continue;
        uint16_t id = static_cast<uint16_t>((static_cast<uint8_t>(answer[0]) << 8) |
                                            static_cast<uint8_t>(answer[1]));
        auto it = pending.find(id);
        if (it == pending.end()) continue;  // forgotten, or never asked
        answer[0] = static_cast<char>(it->second.id >> 8);
        answer[1] = static_cast<char>(it->second.id & 0xff);
        sendto(udp, answer.data(), answer.size(), 0,
               reinterpret_cast<const sockaddr*>(&it->second.from), it->second.from_len);
        pending.erase(it);
      }
    }
    if (stream && !out.empty() && stream_i >= 0 && (fds[stream_i].revents & POLLOUT)) {
      ssize_t n = send(stream.get(), out.data(), out.size(), MSG_NOSIGNAL);
      if (n > 0)
        out.erase(0, static_cast<size_t>(n));
      else if (n < 0 && errno != EAGAIN && errno != EINTR)
        drop_stream();
    }
  }
}

}  // namespace openshell::runtime::guest
