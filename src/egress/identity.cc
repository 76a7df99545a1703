#include "egress/identity.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/openat2.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "base/directory.h"
#include "base/exe_credit.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"
#include "base/unique_fd.h"

namespace openshell::egress {

namespace sock_diag {

namespace {

void put_address(const Address& address, __be32 out[4]) {
  std::memset(out, 0, 4 * sizeof(__be32));
  std::memcpy(out, address.bytes, address.family == AF_INET ? 4 : 16);
}

// ::ffff:a.b.c.d as a.b.c.d: a dual-stack socket connected to an IPv4
// address shows its ends in that form.
Address unmapped(const Address& address) {
  static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (address.family != AF_INET6 || std::memcmp(address.bytes, kMapped, sizeof kMapped) != 0)
    return address;
  Address v4;
  v4.family = AF_INET;
  std::memcpy(v4.bytes, address.bytes + 12, 4);
  return v4;
}

Address address_of(uint8_t family, const __be32 words[4]) {
  Address address;
  address.family = family;
  std::memcpy(address.bytes, words, family == AF_INET ? 4 : 16);
  return unmapped(address);
}

bool same_end(uint8_t family, const __be32 words[4], __be16 port, const TcpEnd& end) {
  return ntohs(port) == end.port && address_of(family, words) == unmapped(end.address);
}

}  // namespace

std::string exact_request(const TcpEnd& local, const TcpEnd& remote, uint32_t sequence) {
  struct {
    nlmsghdr header;
    inet_diag_req_v2 request;
  } message{};
  static_assert(sizeof message == NLMSG_LENGTH(sizeof(inet_diag_req_v2)));
  message.header.nlmsg_len = sizeof message;
  message.header.nlmsg_type = SOCK_DIAG_BY_FAMILY;
  // No NLM_F_DUMP: the kernel looks the one socket up instead of walking
  // every socket of the namespace.
  message.header.nlmsg_flags = NLM_F_REQUEST;
  message.header.nlmsg_seq = sequence;
  inet_diag_req_v2& r = message.request;
  r.sdiag_family = static_cast<uint8_t>(local.address.family);
  r.sdiag_protocol = IPPROTO_TCP;
  r.idiag_states = ~0U;  // any state: the lookup is by the 4-tuple alone
  r.id.idiag_sport = htons(local.port);
  r.id.idiag_dport = htons(remote.port);
  put_address(local.address, r.id.idiag_src);
  put_address(remote.address, r.id.idiag_dst);
  r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
  r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
  return std::string(reinterpret_cast<const char*>(&message), sizeof message);
}

Reply parse_reply(std::string_view bytes, uint32_t sequence, const TcpEnd& local,
                  const TcpEnd& remote) {
  Reply reply;
  nlmsghdr header;
  if (bytes.size() < sizeof header) {
    reply.why =
        "a reply of " + std::to_string(bytes.size()) + " bytes, shorter than a netlink header";
    return reply;
  }
  std::memcpy(&header, bytes.data(), sizeof header);
  if (header.nlmsg_len < sizeof header || header.nlmsg_len > bytes.size()) {
    reply.why = "a netlink message of " + std::to_string(header.nlmsg_len) +
                " bytes in a reply of " + std::to_string(bytes.size());
    return reply;
  }
  if (header.nlmsg_seq != sequence) {
    reply.kind = Reply::Kind::kStale;
    reply.why = "the answer to request " + std::to_string(header.nlmsg_seq) + ", not " +
                std::to_string(sequence);
    return reply;
  }
  const char* payload = bytes.data() + NLMSG_HDRLEN;
  const size_t payload_size =
      header.nlmsg_len >= NLMSG_HDRLEN ? header.nlmsg_len - NLMSG_HDRLEN : 0;
  if (header.nlmsg_type == NLMSG_ERROR) {
    int error = 0;
    if (payload_size < sizeof error) {
      reply.why = "a truncated NLMSG_ERROR";
      return reply;
    }
    std::memcpy(&error, payload, sizeof error);  // nlmsgerr.error: 0 or -errno
    if (error == 0) {
      reply.why = "an acknowledgement without an answer";
      return reply;
    }
    reply.kind = Reply::Kind::kError;
    reply.error = -error;
    return reply;
  }
  if (header.nlmsg_type != SOCK_DIAG_BY_FAMILY) {
    reply.why =
        "a netlink message of type " + std::to_string(header.nlmsg_type) + ", not an answer";
    return reply;
  }
  inet_diag_msg msg;
  if (payload_size < sizeof msg) {
    reply.why = "an inet_diag_msg of " + std::to_string(payload_size) + " bytes";
    return reply;
  }
  std::memcpy(&msg, payload, sizeof msg);
  if (msg.idiag_family != AF_INET && msg.idiag_family != AF_INET6) {
    reply.why = "a socket of family " + std::to_string(msg.idiag_family);
    return reply;
  }
  if (!same_end(msg.idiag_family, msg.id.idiag_src, msg.id.idiag_sport, local) ||
      !same_end(msg.idiag_family, msg.id.idiag_dst, msg.id.idiag_dport, remote)) {
    reply.kind = Reply::Kind::kOther;
    reply.why = "a socket other than the one asked for";
    return reply;
  }
  reply.kind = Reply::Kind::kFound;
  reply.inode = msg.idiag_inode;
  reply.uid = msg.idiag_uid;
  return reply;
}

}  // namespace sock_diag

namespace {

// init and its descendants, through /proc/PID/task/TID/children; each
// thread read counts against *budget.
std::vector<pid_t> sandbox_processes(pid_t init_pid, size_t* budget) {
  std::vector<pid_t> out = {init_pid};
  for (size_t i = 0; i < out.size() && *budget > 0; ++i) {
    std::string tasks = "/proc/" + std::to_string(out[i]) + "/task";
    files::for_each_entry(tasks, [&](const char* name, unsigned char) {
      if (*budget == 0) return false;
      --*budget;
      auto children = files::try_read(tasks + "/" + name + "/children");
      if (!children) return true;
      for (const auto& word : text::split(text::trim(*children), ' '))
        if (auto child = text::parse_uint(word)) out.push_back(static_cast<pid_t>(*child));
      return true;
    });
  }
  return out;
}

Caller caller_of(pid_t pid, bool examine) {
  credit::Judgement judged = credit::judge(pid, examine);
  return Caller{pid, std::move(judged.exe), std::move(judged.untrusted)};
}

}  // namespace

CallerFinder::CallerFinder(pid_t init_pid, UniqueFd diag_socket)
    : init_pid_(init_pid), diag_(std::move(diag_socket)), sock_diag_(diag_.valid()) {}

CallerFinder::Lookup CallerFinder::diag_inode(const TcpEnd& local, const TcpEnd& remote,
                                              uint64_t* inode, std::string* why) {
  const uint32_t sequence = ++sequence_;
  const std::string request = sock_diag::exact_request(local, remote, sequence);
  sockaddr_nl kernel{};
  kernel.nl_family = AF_NETLINK;
  ssize_t sent;
  do
    sent = ::sendto(diag_.get(), request.data(), request.size(), 0,
                    reinterpret_cast<const sockaddr*>(&kernel), sizeof kernel);
  while (sent < 0 && errno == EINTR);
  if (sent != static_cast<ssize_t>(request.size())) {
    *why = std::string("send a sock_diag request: ") + std::strerror(sent < 0 ? errno : EMSGSIZE);
    return Lookup::kUnavailable;
  }
  // The kernel answers within sendto(), so the answer is already queued;
  // the wait is only a safety net. Messages from anyone but the kernel (a
  // process of the sandbox with CAP_NET_ADMIN there could send some) and
  // answers to earlier requests are skipped.
  alignas(nlmsghdr) char buffer[8192];
  for (int message = 0; message < 16; ++message) {
    sockaddr_nl from{};
    iovec iov{buffer, sizeof buffer};
    msghdr msg{};
    msg.msg_name = &from;
    msg.msg_namelen = sizeof from;
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    ssize_t n = ::recvmsg(diag_.get(), &msg, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      pollfd p{diag_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) == 1)
        n = ::recvmsg(diag_.get(), &msg, MSG_DONTWAIT);
      else
        errno = ETIMEDOUT;
    }
    if (n < 0) {
      *why = std::string("receive the sock_diag answer: ") + std::strerror(errno);
      return Lookup::kUnavailable;
    }
    if (from.nl_pid != 0) continue;
    if (msg.msg_flags & MSG_TRUNC) {
      *why = "a sock_diag answer larger than " + std::to_string(sizeof buffer) + " bytes";
      return Lookup::kUnavailable;
    }
    auto reply = sock_diag::parse_reply(std::string_view(buffer, static_cast<size_t>(n)), sequence,
                                        local, remote);
    switch (reply.kind) {
      case sock_diag::Reply::Kind::kFound:
        *inode = reply.inode;
        return Lookup::kFound;
      case sock_diag::Reply::Kind::kError:
        if (reply.error == ENOENT) return Lookup::kGone;
        *why = std::string("sock_diag: ") + std::strerror(reply.error);
        return Lookup::kUnavailable;
      case sock_diag::Reply::Kind::kOther:
        return Lookup::kOther;
      case sock_diag::Reply::Kind::kStale:
        continue;
      case sock_diag::Reply::Kind::kMalformed:
        *why = "sock_diag: " + reply.why;
        return Lookup::kUnavailable;
    }
  }
  *why = "sock_diag: no answer among the messages received";
  return Lookup::kUnavailable;
}

uint64_t CallerFinder::inode_of(const TcpEnd& client, const TcpEnd& proxy) {
  if (diag_) {
    std::string why;
    uint64_t inode = 0;
    switch (diag_inode(client, proxy, &inode, &why)) {
      case Lookup::kFound:
        return inode;  // 0 for a socket no process holds any more
      case Lookup::kOther:
        return 0;
      case Lookup::kGone: {
        // ENOENT is also what a kernel without inet_diag or tcp_diag says.
        // The proxy's own end of the connection is being served, and its
        // listener is open: when neither is found (the lookup falls back
        // to the listener when the connection was reset), sock_diag cannot
        // see this namespace's sockets at all.
        uint64_t ignored = 0;
        Lookup own = diag_inode(proxy, client, &ignored, &why);
        if (own == Lookup::kFound || own == Lookup::kOther) return 0;  // the client has gone
        if (own == Lookup::kGone) why = "sock_diag finds none of the proxy's own sockets";
        break;
      }
      case Lookup::kUnavailable:
        break;
    }
    give_up_sock_diag(why);
  }
  if (!warned_) give_up_sock_diag("no NETLINK_SOCK_DIAG socket in the sandbox's network namespace");
  auto table = files::try_read("/proc/" + std::to_string(init_pid_) + "/net/tcp");
  return table ? credit::loopback_socket_inode(*table, client.port, proxy.port) : 0;
}

void CallerFinder::give_up_sock_diag(const std::string& why) {
  diag_.reset();
  sock_diag_ = false;
  if (warned_) return;
  warned_ = true;
  log::warn("egress proxy: " + why + "; identifying callers through /proc/" +
            std::to_string(init_pid_) +
            "/net/tcp instead, which can take milliseconds per connection");
}

// Reading a process's fd links costs about 20 us (a few fds), so a search
// grows with the sandbox's processes and their fds: it reads at most
// `budget` entries. Every holder counts, not only the first found: a
// process the policy names may hold a socket that another one uses.
Holders CallerFinder::holders(const TcpEnd& client, const TcpEnd& proxy, size_t budget,
                              const Holders* since, bool examine) {
  Holders out;
  const size_t start = budget;
  const uint64_t inode = inode_of(client, proxy);
  out.inode = inode;
  if (!inode) return out;
  const std::string wanted = "socket:[" + std::to_string(inode) + "]";
  std::vector<pid_t> pids = sandbox_processes(init_pid_, &budget);
  const bool incremental = since && !since->budget_exceeded && !since->seen.empty();
  for (pid_t pid : pids) {
    if (budget == 0) break;
    --budget;
    const std::pair<pid_t, uint64_t> process{pid, credit::start_time(pid)};
    out.seen.push_back(process);
    if (incremental && std::binary_search(since->seen.begin(), since->seen.end(), process)) {
      bool held = false;
      for (const auto& c : since->processes) held = held || c.pid == pid;
      if (!held) continue;
    }
    if (credit::holds_socket(pid, wanted, &budget))
      out.processes.push_back(caller_of(pid, examine));
  }
  out.budget_exceeded = budget == 0;
  if (out.budget_exceeded) out.seen.clear();
  std::sort(out.seen.begin(), out.seen.end());
  out.entries = start - budget;
  return out;
}

Caller CallerFinder::find(const TcpEnd& client, const TcpEnd& proxy) {
  Holders found = holders(client, proxy);
  return found.processes.empty() ? Caller{} : found.processes.back();
}

Caller examine_process(pid_t pid, bool examine) { return caller_of(pid, examine); }

std::string resolve_in_sandbox(pid_t init_pid, const std::string& path) {
  std::string root = "/proc/" + std::to_string(init_pid) + "/root";
  UniqueFd root_fd(::open(root.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root_fd) return path;
  open_how how{};
  how.flags = O_PATH | O_CLOEXEC;
  how.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS;
  std::string relative = path.empty() || path[0] != '/' ? path : path.substr(1);
  UniqueFd fd(
      static_cast<int>(::syscall(SYS_openat2, root_fd.get(), relative.c_str(), &how, sizeof how)));
  if (!fd) return path;
  // The kernel names it as the sandbox sees it (its root is the mount's).
  std::string resolved = files::read_link("/proc/self/fd/" + std::to_string(fd.get()));
  return resolved.empty() ? path : resolved;
}

}  // namespace openshell::egress
