// osh-probe: runs inside a sandbox and tries one thing, reporting whether the
// kernel let it. Used by the end-to-end tests to try to break out.
//
//   osh-probe ACTION [ARGS...]
//
// Prints "ok[: detail]" and exits 0 when the action succeeded; prints
// "denied: ERRNO_NAME (text)" and exits 1 when it failed; exits 2 on bad use.
// A statically linked binary, so that it runs in a busybox root.
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <linux/io_uring.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* errno_name(int err) {
  switch (err) {
    case EPERM: return "EPERM";
    case ENOENT: return "ENOENT";
    case ESRCH: return "ESRCH";
    case EACCES: return "EACCES";
    case EROFS: return "EROFS";
    case ENOSYS: return "ENOSYS";
    case EAGAIN: return "EAGAIN";
    case EINVAL: return "EINVAL";
    case ETXTBSY: return "ETXTBSY";
    case ECONNREFUSED: return "ECONNREFUSED";
    case ENETUNREACH: return "ENETUNREACH";
    case EHOSTUNREACH: return "EHOSTUNREACH";
    case ETIMEDOUT: return "ETIMEDOUT";
    case EAFNOSUPPORT: return "EAFNOSUPPORT";
    case ENOTTY: return "ENOTTY";
    case EBADF: return "EBADF";
    case ENOMEM: return "ENOMEM";
    case EEXIST: return "EEXIST";
    case ENOTDIR: return "ENOTDIR";
    case EISDIR: return "EISDIR";
    case EXDEV: return "EXDEV";
    case EOVERFLOW: return "EOVERFLOW";
    default: return "E?";
  }
}

int result(long rc, const std::string& detail = "") {
  if (rc >= 0) {
    std::printf("ok%s%s\n", detail.empty() ? "" : ": ", detail.c_str());
    return 0;
  }
  int err = errno;
  std::printf("denied: %s (%s)\n", errno_name(err), std::strerror(err));
  return 1;
}

int write_file(const char* path, const char* data) {
  int fd = ::open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return result(-1);
  ssize_t n = ::write(fd, data, std::strlen(data));
  int err = errno;
  ::close(fd);
  errno = err;
  return result(n < 0 ? -1 : 0);
}

int read_file(const char* path) {
  int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return result(-1);
  char buf[65536];
  long total = 0;
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) total += n;
  int err = errno;
  ::close(fd);
  errno = err;
  return result(n < 0 ? -1 : 0, std::to_string(total) + " bytes");
}

int tcp_connect(const char* host, int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return result(-1);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
    errno = EINVAL;
    return result(-1);
  }
  timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc < 0 && errno == EINPROGRESS) {
    pollfd p{fd, POLLOUT, 0};
    rc = ::poll(&p, 1, 3000);
    if (rc == 0) {
      errno = ETIMEDOUT;
      rc = -1;
    } else {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      errno = err;
      rc = err ? -1 : 0;
    }
  }
  int err = errno;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  long ms = (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000;
  std::fprintf(stderr, "connect took %ld ms\n", ms);
  errno = err;
  return result(rc);
}

int fork_many(int count) {
  std::vector<pid_t> children;
  int err = 0;
  for (int i = 0; i < count; ++i) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::pause();
      ::_exit(0);
    }
    if (pid < 0) {
      err = errno;
      break;
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) ::kill(pid, SIGKILL);
  for (pid_t pid : children) ::waitpid(pid, nullptr, 0);
  if (err) {
    std::printf("forked %zu\n", children.size());
    errno = err;
    return result(-1);
  }
  return result(0, "forked " + std::to_string(children.size()));
}

int alloc_mb(long mb) {
  const size_t chunk = 1 << 20;
  for (long i = 0; i < mb; ++i) {
    char* p = static_cast<char*>(std::malloc(chunk));
    if (!p) {
      errno = ENOMEM;
      return result(-1);
    }
    std::memset(p, 1, chunk);
  }
  return result(0, "allocated " + std::to_string(mb) + " MiB");
}

int list_fds() {
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return result(-1);
  std::string fds;
  int self = ::dirfd(dir);
  while (dirent* e = ::readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    if (std::atoi(e->d_name) == self) continue;
    if (!fds.empty()) fds += ",";
    fds += e->d_name;
  }
  ::closedir(dir);
  return result(0, fds);
}

int spin_cpu(long wall_ms) {
  timespec start, now, cpu;
  clock_gettime(CLOCK_MONOTONIC, &start);
  volatile unsigned long x = 0;
  for (;;) {
    for (int i = 0; i < 100000; ++i) x = x + static_cast<unsigned long>(i);
    clock_gettime(CLOCK_MONOTONIC, &now);
    long ms = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
    if (ms >= wall_ms) break;
  }
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  return result(0, "cpu_ms " + std::to_string(cpu.tv_sec * 1000 + cpu.tv_nsec / 1000000));
}

// Through the sandbox's egress proxy (127.0.0.1:3128): CONNECT host:port,
// print the proxy's status line, then per mode: "status" (nothing more),
// "echo" (a line there and back), "upgrade" (an HTTP upgrade request, a 101,
// then a line there and back), "idle" (wait 2 s, then a line there and back).
int proxy_connect(const char* host, const char* port, const std::string& mode) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(3128);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return result(-1);
  std::string request = std::string("CONNECT ") + host + ":" + port + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n";
  ::write(fd, request.data(), request.size());
  std::string head;
  char c;
  while (head.find("\r\n\r\n") == std::string::npos && ::read(fd, &c, 1) == 1) head += c;
  std::string status = head.substr(0, head.find("\r\n"));
  std::printf("proxy: %s\n", status.c_str());
  if (status.find(" 200 ") == std::string::npos || mode == "status") {
    std::string body;
    char buf[512];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) body.append(buf, static_cast<size_t>(n));
    if (!body.empty()) std::printf("body: %s", body.c_str());
    return status.find(" 200 ") == std::string::npos ? 1 : 0;
  }
  auto line_through = [&](const std::string& line) {
    ::write(fd, line.data(), line.size());
    std::string back;
    while (back.size() < line.size() && ::read(fd, &c, 1) == 1) back += c;
    std::printf("echo: %s", back.c_str());
    return back == line;
  };
  if (mode == "upgrade") {
    std::string up = std::string("GET /chat HTTP/1.1\r\nHost: ") + host +
                     "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
    ::write(fd, up.data(), up.size());
    std::string reply;
    while (reply.find("\r\n\r\n") == std::string::npos && ::read(fd, &c, 1) == 1) reply += c;
    std::printf("upgrade: %s\n", reply.substr(0, reply.find("\r\n")).c_str());
    if (reply.find(" 101 ") == std::string::npos) return 1;
  }
  if (mode == "idle") ::sleep(2);
  if (mode == "reset") {
    // Send for an echo server, read nothing back, then reset the
    // connection while echoes are still on their way: the proxy's next
    // writes to this socket fail (EPIPE), which must not end it.
    std::string chunk(64 * 1024, 'r');
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    for (int i = 0; i < 64; ++i) {
      if (::write(fd, chunk.data(), chunk.size()) < 0 && errno != EAGAIN) break;
      ::usleep(2000);
    }
    linger hard{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &hard, sizeof hard);
    ::close(fd);
    std::printf("reset\n");
    return 0;
  }
  return line_through("ping through the proxy\n") ? 0 : 1;
}

// A TCP connection to the sandbox's proxy (127.0.0.1:3128), inherited by
// children and programs run (no close-on-exec); -1 when it fails.
int connect_proxy(bool inherited) {
  int fd = ::socket(AF_INET, SOCK_STREAM | (inherited ? 0 : SOCK_CLOEXEC), 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(3128);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return -1;
  return fd;
}

// CONNECT host:port on fd; prints "proxy: STATUS LINE" and the body of a
// refusal; 0 when the tunnel is established.
int connect_request(int fd, const char* host, const char* port) {
  std::string request =
      std::string("CONNECT ") + host + ":" + port + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n";
  ::write(fd, request.data(), request.size());
  std::string head;
  char c;
  while (head.find("\r\n\r\n") == std::string::npos && ::read(fd, &c, 1) == 1) head += c;
  std::string status = head.substr(0, head.find("\r\n"));
  std::printf("proxy: %s\n", status.c_str());
  if (status.find(" 200 ") != std::string::npos) return 0;
  std::string body;
  char buf[512];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) body.append(buf, static_cast<size_t>(n));
  if (!body.empty()) std::printf("body: %s", body.c_str());
  return 1;
}

void raise_fd_limit() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
}

// The binaries rule's bypass: this program connects, a program the policy
// names (argv) is started holding the inherited socket, and this one talks.
int proxy_handoff(const char* host, const char* port, char** argv) {
  int fd = connect_proxy(true);
  if (fd < 0) return result(-1);
  pid_t child = ::fork();
  if (child == 0) {
    ::execv(argv[0], argv);
    ::_exit(127);
  }
  ::usleep(300000);  // the other program runs, holding the socket
  int rc = connect_request(fd, host, port);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return rc;
}

// Code from another file in this process (as a preloaded library would be):
// FILE mapped executable, then CONNECT through the proxy.
int proxy_connect_mapped(const char* file, const char* host, const char* port) {
  int lib = ::open(file, O_RDONLY | O_CLOEXEC);
  if (lib < 0) return result(-1);
  void* code = ::mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, lib, 0);
  if (code == MAP_FAILED) return result(-1);
  int fd = connect_proxy(false);
  if (fd < 0) return result(-1);
  return connect_request(fd, host, port);
}

// COUNT connections to the proxy, held HOLD seconds, then closed, then
// AFTER seconds more. Prints "open N refused M" (a refused one gets a 503).
int hold_connections(int count, int hold, int after) {
  raise_fd_limit();
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    int fd = connect_proxy(false);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  ::usleep(1000000);  // refusals arrive
  int refused = 0;
  for (int fd : fds) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 0) == 1) {
      char buf[256];
      ssize_t n = ::read(fd, buf, sizeof buf - 1);
      if (n > 0 && std::string(buf, static_cast<size_t>(n)).find(" 503 ") != std::string::npos)
        ++refused;
    }
  }
  std::printf("open %zu refused %d\n", fds.size() - static_cast<size_t>(refused), refused);
  std::fflush(stdout);
  ::sleep(static_cast<unsigned>(hold));
  for (int fd : fds) ::close(fd);
  std::printf("closed\n");
  std::fflush(stdout);
  ::sleep(static_cast<unsigned>(after));
  return 0;
}

// PROCS processes holding FDS fds each, then CONNECT host:port; prints how
// long the proxy took to answer.
int fd_crowd(int procs, int fds, const char* host, const char* port) {
  raise_fd_limit();
  int ready[2];
  if (::pipe(ready) != 0) return result(-1);
  std::vector<pid_t> children;
  for (int i = 0; i < procs; ++i) {
    pid_t child = ::fork();
    if (child == 0) {
      for (int j = 0; j < fds; ++j)
        if (::dup(ready[1]) < 0) break;
      ::write(ready[1], "x", 1);
      ::pause();
      ::_exit(0);
    }
    if (child < 0) break;
    children.push_back(child);
  }
  char c;
  for (size_t i = 0; i < children.size(); ++i) ::read(ready[0], &c, 1);
  timespec t0, t1;
  clock_gettime(CLOCK_MONOTONIC, &t0);
  int fd = connect_proxy(false);
  int rc = fd < 0 ? result(-1) : connect_request(fd, host, port);
  clock_gettime(CLOCK_MONOTONIC, &t1);
  std::printf("answered in %ld ms\n",
              (t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
  for (pid_t child : children) ::kill(child, SIGKILL);
  for (pid_t child : children) ::waitpid(child, nullptr, 0);
  return rc;
}

// Two CONNECT tunnels (host:port_a, host:port_b) to echo servers, watched
// for SECONDS: prints "a closed at MS" / "b closed at MS" (CLOCK_MONOTONIC)
// when the proxy closes one, and at the end "b echo ok" when b still works.
int tunnel_watch(const char* host, const char* port_a, const char* port_b, int seconds) {
  int a = connect_proxy(false), b = connect_proxy(false);
  if (a < 0 || b < 0 || connect_request(a, host, port_a) != 0 ||
      connect_request(b, host, port_b) != 0)
    return 1;
  std::printf("open\n");
  std::fflush(stdout);
  auto now_ms = [] {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return static_cast<long>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
  };
  const long end = now_ms() + seconds * 1000L;
  bool a_open = true, b_open = true;
  while (now_ms() < end && (a_open || b_open)) {
    pollfd p[2] = {{a_open ? a : -1, POLLIN, 0}, {b_open ? b : -1, POLLIN, 0}};
    if (::poll(p, 2, 50) <= 0) continue;
    char buf[256];
    for (int i = 0; i < 2; ++i) {
      if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      if (::read(p[i].fd, buf, sizeof buf) > 0) continue;
      std::printf("%s closed at %ld\n", i == 0 ? "a" : "b", now_ms());
      (i == 0 ? a_open : b_open) = false;
    }
  }
  if (b_open) {
    const std::string line = "still here\n";
    ::write(b, line.data(), line.size());
    std::string back;
    char c;
    while (back.size() < line.size() && ::read(b, &c, 1) == 1) back += c;
    if (back == line) std::printf("b echo ok\n");
  }
  return 0;
}

// CVE-2019-5736's step: get a handle on the init's binary, then try to
// reopen it for writing.
int exe_reopen(const char* pid) {
  std::string path = std::string("/proc/") + pid + "/exe";
  int fd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (fd < 0) {
    std::printf("open %s O_PATH: ", path.c_str());
    return result(-1);
  }
  std::string again = "/proc/self/fd/" + std::to_string(fd);
  int w = ::open(again.c_str(), O_WRONLY | O_CLOEXEC);
  std::printf("reopen for writing: ");
  return result(w);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: osh-probe ACTION [ARGS...]\n");
    return 2;
  }
  std::string action = argv[1];
  auto arg = [&](int i) -> const char* {
    if (i >= argc) {
      std::fprintf(stderr, "osh-probe %s: missing argument\n", action.c_str());
      std::exit(2);
    }
    return argv[i];
  };

  if (action == "mount") return result(::mount("none", "/tmp", "tmpfs", 0, nullptr));
  if (action == "umount") return result(::umount2(arg(2), MNT_DETACH));
  if (action == "unshare-user") return result(::unshare(CLONE_NEWUSER));
  if (action == "unshare-mount") return result(::unshare(CLONE_NEWNS));
  if (action == "clone-newuser") {
    long pid = ::syscall(SYS_clone, CLONE_NEWUSER | SIGCHLD, nullptr, nullptr, nullptr, 0);
    if (pid == 0) ::_exit(0);
    if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
    return result(pid);
  }
  if (action == "clone3") {
    struct {
      uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    } args{};
    args.exit_signal = SIGCHLD;
    long pid = ::syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0) ::_exit(0);
    if (pid > 0) ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
    return result(pid);
  }
  if (action == "setns") return result(::setns(::open("/proc/1/ns/net", O_RDONLY), 0));
  if (action == "ptrace") return result(::ptrace(PTRACE_ATTACH, std::atoi(arg(2)), nullptr, nullptr));
  if (action == "kill") return result(::kill(std::atoi(arg(2)), 0));
  if (action == "keyctl")
    return result(::syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "osh-probe"));
  if (action == "add_key")
    return result(::syscall(SYS_add_key, "user", "osh", "x", 1, KEY_SPEC_PROCESS_KEYRING));
  if (action == "bpf") {
    union bpf_attr attr{};
    attr.map_type = BPF_MAP_TYPE_ARRAY;
    attr.key_size = 4;
    attr.value_size = 4;
    attr.max_entries = 1;
    return result(::syscall(SYS_bpf, BPF_MAP_CREATE, &attr, sizeof attr));
  }
  if (action == "perf_event_open") {
    perf_event_attr attr{};
    attr.size = sizeof attr;
    attr.type = PERF_TYPE_SOFTWARE;
    attr.config = PERF_COUNT_SW_CPU_CLOCK;
    return result(::syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
  }
  if (action == "userfaultfd") return result(::syscall(SYS_userfaultfd, O_CLOEXEC));
  if (action == "io_uring") {
    io_uring_params params{};
    return result(::syscall(SYS_io_uring_setup, 8, &params));
  }
  if (action == "kexec_load") return result(::syscall(SYS_kexec_load, 0, 0, nullptr, 0));
  if (action == "init_module") return result(::syscall(SYS_init_module, nullptr, 0, ""));
  if (action == "open_by_handle_at") {
    char buf[sizeof(file_handle) + 128] = {};
    auto* handle = reinterpret_cast<file_handle*>(buf);
    handle->handle_bytes = 8;
    return result(::syscall(SYS_open_by_handle_at, AT_FDCWD, handle, O_RDONLY));
  }
  if (action == "raw-socket") return result(::socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
  if (action == "packet-socket") return result(::socket(AF_PACKET, SOCK_RAW, 0));
  if (action == "tcp-socket") return result(::socket(AF_INET, SOCK_STREAM, 0));
  if (action == "connect") return tcp_connect(arg(2), std::atoi(arg(3)));
  if (action == "write") return write_file(arg(2), argc > 3 ? argv[3] : "osh-probe\n");
  if (action == "read") return read_file(arg(2));
  if (action == "mknod") return result(::mknod(arg(2), S_IFCHR | 0600, makedev(1, 3)));
  if (action == "chroot") return result(::chroot(arg(2)));
  if (action == "setuid") return result(::setuid(static_cast<uid_t>(std::atoi(arg(2)))));
  if (action == "sethostname") return result(::sethostname("escaped", 7));
  if (action == "tiocsti") {
    char c = 'x';
    return result(::ioctl(0, TIOCSTI, &c));
  }
  if (action == "syscall") return result(::syscall(std::atol(arg(2)), 0, 0, 0, 0, 0));
  if (action == "fork") return fork_many(std::atoi(arg(2)));
  if (action == "alloc") return alloc_mb(std::atol(arg(2)));
  if (action == "fds") return list_fds();
  if (action == "spin") return spin_cpu(std::atol(arg(2)));
  if (action == "exe-reopen") return exe_reopen(arg(2));
  if (action == "proxy-connect") return proxy_connect(arg(2), arg(3), argc > 4 ? argv[4] : "echo");
  if (action == "proxy-handoff" && argc > 4) return proxy_handoff(arg(2), arg(3), argv + 4);
  if (action == "proxy-connect-mapped") return proxy_connect_mapped(arg(2), arg(3), arg(4));
  if (action == "hold-connections")
    return hold_connections(std::atoi(arg(2)), std::atoi(arg(3)), std::atoi(arg(4)));
  if (action == "fd-crowd") return fd_crowd(std::atoi(arg(2)), std::atoi(arg(3)), arg(4), arg(5));
  if (action == "mem-write") {
    // A child's memory, as a program would write a binary's it started.
    pid_t child = ::fork();
    if (child == 0) {
      ::pause();
      ::_exit(0);
    }
    std::string path = "/proc/" + std::to_string(child) + "/mem";
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    int err = errno;
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
    errno = err;
    return result(fd);
  }
  if (action == "tunnel-watch") return tunnel_watch(arg(2), arg(3), arg(4), std::atoi(arg(5)));
  if (action == "exe-write") {
    int fd = ::open(arg(2), O_WRONLY | O_CLOEXEC);
    return result(fd);
  }
  if (action == "statvfs-ro") {
    struct statvfs st;
    if (::statvfs(arg(2), &st) != 0) return result(-1);
    return result(0, (st.f_flag & ST_RDONLY) ? "read-only" : "writable");
  }
  if (action == "status") {
    // The lines of /proc/self/status that say how confined we are.
    FILE* f = std::fopen("/proc/self/status", "r");
    if (!f) return result(-1);
    char line[256];
    while (std::fgets(line, sizeof line, f))
      if (!std::strncmp(line, "Cap", 3) || !std::strncmp(line, "NoNewPrivs", 10) ||
          !std::strncmp(line, "Seccomp:", 8) || !std::strncmp(line, "Uid", 3) ||
          !std::strncmp(line, "Gid", 3) || !std::strncmp(line, "Groups", 6))
        std::fputs(line, stdout);
    std::fclose(f);
    return 0;
  }
  std::fprintf(stderr, "osh-probe: unknown action %s\n", action.c_str());
  return 2;
}
