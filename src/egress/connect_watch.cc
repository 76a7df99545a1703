#include "egress/connect_watch.h"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"

// Linux 6.6; Debian 12's headers predate them.
#ifndef SECCOMP_IOCTL_NOTIF_SET_FLAGS
#define SECCOMP_IOCTL_NOTIF_SET_FLAGS SECCOMP_IOW(4, __u64)
#endif
#ifndef SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP
#define SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP (1UL << 0)
#endif
#ifndef PIDFD_THREAD
#define PIDFD_THREAD O_EXCL
#endif

namespace openshell::egress {

void ConnectLog::erase(std::list<Entry>::iterator entry) {
  bytes_ -= entry->bytes;
  by_inode_.erase(entry->inode);
  entries_.erase(entry);
}

void ConnectLog::expire(Clock::time_point now) {
  while (!entries_.empty() && (entries_.size() > capacity_ || bytes_ > max_bytes_ ||
                               now - entries_.front().when > lifetime_))
    erase(entries_.begin());
}

void ConnectLog::record(uint64_t inode, Caller connector, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Caller> connectors;
  if (auto it = by_inode_.find(inode); it != by_inode_.end()) {
    connectors = std::move(it->second->connectors);
    erase(it->second);
  }
  auto same = [&](const Caller& c) {
    return c.pid == connector.pid && c.exe == connector.exe && c.untrusted == connector.untrusted;
  };
  if (std::none_of(connectors.begin(), connectors.end(), same)) {
    if (connectors.size() + 1 < kMaxConnectors) {
      connectors.push_back(std::move(connector));
    } else if (connectors.size() + 1 == kMaxConnectors) {
      Caller rest;
      rest.untrusted = "more processes connected the socket than are kept";
      connectors.push_back(std::move(rest));
    }
  }
  size_t bytes = sizeof(Entry);
  for (const auto& c : connectors) bytes += sizeof(Caller) + c.exe.size() + c.untrusted.size();
  entries_.push_back(Entry{inode, std::move(connectors), now, bytes});
  bytes_ += bytes;
  by_inode_[inode] = std::prev(entries_.end());
  expire(now);
}

std::vector<Caller> ConnectLog::take(uint64_t inode, Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  expire(now);
  auto it = by_inode_.find(inode);
  if (it == by_inode_.end()) return {};
  std::vector<Caller> connectors = std::move(it->second->connectors);
  erase(it->second);
  return connectors;
}

size_t ConnectLog::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return entries_.size();
}

size_t ConnectLog::bytes() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return bytes_;
}

namespace {

#if defined(__x86_64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_X86_64;
#elif defined(__aarch64__)
constexpr uint32_t kNativeArch = AUDIT_ARCH_AARCH64;
#endif

int pidfd_open(pid_t pid, unsigned flags) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, flags));
}

int pidfd_getfd(int pidfd, int fd) {
  return static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd, fd, 0));
}

// A pidfd of the thread that called (its fd table is the one the call's
// fd argument names), and *leader whether it leads its thread group (its
// tid is then the process's pid). Most connects come from leaders, whose
// pidfd is the plain one; another thread's needs Linux 6.9.
UniqueFd thread_pidfd(pid_t tid, bool* leader) {
  UniqueFd fd(pidfd_open(tid, 0));
  *leader = fd.valid();
  if (!fd && errno == EINVAL) fd.reset(pidfd_open(tid, PIDFD_THREAD));
  return fd;
}

// The thread group (process) of a thread.
pid_t thread_group(pid_t tid) {
  auto status = files::try_read("/proc/" + std::to_string(tid) + "/status");
  if (!status) return 0;
  for (const auto& line : text::split(*status, '\n'))
    if (line.rfind("Tgid:", 0) == 0)
      if (auto tgid = text::parse_uint(text::trim(line.substr(5))))
        return static_cast<pid_t>(*tgid);
  return 0;
}

// Why the kernel will not let this process take the init's fds, or "".
std::string refusal(pid_t init_pid) {
  UniqueFd pidfd(pidfd_open(init_pid, 0));
  if (!pidfd) return std::string("pidfd_open: ") + std::strerror(errno);
  // No such fd when taking is allowed; EPERM when it is not.
  if (pidfd_getfd(pidfd.get(), 0x7fffffff) >= 0 || errno == EBADF) return {};
  return std::string("pidfd_getfd: ") + std::strerror(errno);
}

// Whether the address a connect(2) names (as the process's memory holds it
// now) may have the proxy's port. Only a hint, to spare the crediting rules'
// reads for connects elsewhere: the process may change the address before
// the kernel reads it, but then its record says it was not examined, and
// the proxy does not credit it.
bool names_port(pid_t tid, uint64_t address, uint64_t length, uint16_t port) {
  unsigned char head[4];  // family, then the port (sockaddr_in and _in6 alike)
  if (length < sizeof head) return false;
  iovec local{head, sizeof head};
  iovec remote{reinterpret_cast<void*>(address), sizeof head};
  if (::process_vm_readv(tid, &local, 1, &remote, 1, 0) != static_cast<ssize_t>(sizeof head))
    return true;  // unread: judged, to be sure
  sa_family_t family;
  std::memcpy(&family, head, sizeof family);
  if (family != AF_INET && family != AF_INET6) return false;
  return ((head[2] << 8) | head[3]) == port;
}

}  // namespace

ConnectWatcher::ConnectWatcher(UniqueFd listener, pid_t init_pid, std::shared_ptr<ConnectLog> log,
                               uint16_t proxy_port)
    : listener_(std::move(listener)), log_(std::move(log)), proxy_port_(proxy_port) {
  stop_.reset(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!stop_) throw_errno("eventfd for the connect listener");
  const std::string why = refusal(init_pid);
  active_ = why.empty();
  if (!active_)
    log::warn("egress proxy: the kernel does not let this process look at the sandbox's sockets (" +
              why +
              "): the process that connects is not identified at connect(2), only the processes "
              "that hold the socket at accept and at the request (see docs/policy.md)");
  // The sandbox's process waits for each answer: the kernel runs this
  // thread on its CPU (Linux 6.6), not on another to be woken (a tenth of
  // a millisecond on a virtual machine). Older kernels refuse: no matter.
  ::ioctl(listener_.get(), SECCOMP_IOCTL_NOTIF_SET_FLAGS, SECCOMP_USER_NOTIF_FD_SYNC_WAKE_UP);
  // The thread takes no signals: they are the process's main loop's.
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  thread_ = std::thread([this] { loop(); });
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

ConnectWatcher::~ConnectWatcher() {
  uint64_t one = 1;
  if (stop_) {
    ssize_t ignored = ::write(stop_.get(), &one, sizeof one);
    (void)ignored;
  }
  if (thread_.joinable()) thread_.join();
}

void ConnectWatcher::loop() {
  pollfd fds[2] = {{stop_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      log::error(std::string("egress proxy: poll the connect listener: ") + std::strerror(errno));
      return;
    }
    if (fds[0].revents) return;
    if (fds[1].revents & POLLIN) {
      handle();
    } else if (fds[1].revents) {
      fds[1].fd = -1;  // every process of the sandbox has gone
    }
  }
}

// One connect: looked at, recorded when it is a TCP socket's, and always
// let go on.
void ConnectWatcher::handle() {
  seccomp_notif request;
  std::memset(&request, 0, sizeof request);
  if (::ioctl(listener_.get(), SECCOMP_IOCTL_NOTIF_RECV, &request) != 0) return;  // gone meanwhile

  auto look = [&]() -> void {
    if (!active_ || request.data.arch != kNativeArch || request.data.nr != __NR_connect) return;
    bool leader = false;
    UniqueFd pidfd = thread_pidfd(static_cast<pid_t>(request.pid), &leader);
    if (!pidfd) return;
    UniqueFd socket(pidfd_getfd(pidfd.get(), static_cast<int>(request.data.args[0])));
    if (!socket) return;
    struct stat st {};
    int domain = 0, type = 0;
    socklen_t size = sizeof domain;
    if (::fstat(socket.get(), &st) != 0 || !S_ISSOCK(st.st_mode) ||
        ::getsockopt(socket.get(), SOL_SOCKET, SO_DOMAIN, &domain, &size) != 0 ||
        (domain != AF_INET && domain != AF_INET6))
      return;
    size = sizeof type;
    if (::getsockopt(socket.get(), SOL_SOCKET, SO_TYPE, &type, &size) != 0 || type != SOCK_STREAM)
      return;
    const pid_t tid = static_cast<pid_t>(request.pid);
    bool examine = examine_;
    if (examine && proxy_port_ &&
        !names_port(tid, request.data.args[1], request.data.args[2], proxy_port_))
      examine = false;
    Caller connector = examine_process(tid, examine);
    if (!examine && examine_)
      connector.untrusted =
          "it was not examined (its connect(2) named another port than the proxy's)";
    if (!leader) connector.pid = thread_group(tid);
    // What was read is of the process that asked only while it still waits
    // for the answer: a process that died meanwhile (its pid taken by
    // another) voids the notification.
    if (::ioctl(listener_.get(), SECCOMP_IOCTL_NOTIF_ID_VALID, &request.id) != 0) return;
    log_->record(static_cast<uint64_t>(st.st_ino), std::move(connector));
    ++recorded_;
  };
  look();

  seccomp_notif_resp response;
  std::memset(&response, 0, sizeof response);
  response.id = request.id;
  response.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
  // ENOENT: the process was interrupted (a signal) or has died; it asks again.
  ++answered_;  // first: the process may go on before this thread does
  ::ioctl(listener_.get(), SECCOMP_IOCTL_NOTIF_SEND, &response);
}

}  // namespace openshell::egress
