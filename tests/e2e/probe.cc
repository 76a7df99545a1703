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
#include <linux/userfaultfd.h>
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
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

const char* errno_name(int err) {
  switch (err) {
    case EPERM:
      return "EPERM";
    case ENOENT:
      return "ENOENT";
    case ESRCH:
      return "ESRCH";
    case EACCES:
      return "EACCES";
    case EROFS:
      return "EROFS";
    case ENOSYS:
      return "ENOSYS";
    case EAGAIN:
      return "EAGAIN";
    case EINVAL:
      return "EINVAL";
    case ETXTBSY:
      return "ETXTBSY";
    case ECONNREFUSED:
      return "ECONNREFUSED";
    case ECONNRESET:
      return "ECONNRESET";
    case EPIPE:
      return "EPIPE";
    case ENETUNREACH:
      return "ENETUNREACH";
    case EHOSTUNREACH:
      return "EHOSTUNREACH";
    case ETIMEDOUT:
      return "ETIMEDOUT";
    case EAFNOSUPPORT:
      return "EAFNOSUPPORT";
    case ENOTTY:
      return "ENOTTY";
    case EBADF:
      return "EBADF";
    case ENOMEM:
      return "ENOMEM";
    case EEXIST:
      return "EEXIST";
    case ENOTDIR:
      return "ENOTDIR";
    case EISDIR:
      return "EISDIR";
    case EXDEV:
      return "EXDEV";
    case EOVERFLOW:
      return "EOVERFLOW";
    case EOPNOTSUPP:
      return "EOPNOTSUPP";
    case ENOEXEC:
      return "ENOEXEC";
    case EIO:
      return "EIO";
    default:
      return "E?";
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

// A device node as a GPU's user opens it: read and write, then an ioctl
// of the NVIDIA driver's type ('F'). The ioctl's errno says whether it
// reached the driver (a driver without it answers ENOTTY; a filter, EPERM).
int open_device(const char* path) {
  int fd = ::open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) return result(-1);
  char byte = 'x';
  ssize_t n = ::write(fd, &byte, 1);
  if (n != 1) {
    int err = errno;
    ::close(fd);
    errno = err;
    return result(-1);
  }
  errno = 0;
  long rc = ::ioctl(fd, _IOWR('F', 0x2a, int), nullptr);
  int err = errno;
  ::close(fd);
  std::string ioctl_said = rc == 0 ? "0" : errno_name(err);
  return result(0, "opened read-write, wrote 1 byte, ioctl " + ioctl_said);
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

int unix_connect(const char* path, int type) {
  int fd = ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path, sizeof address.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

// Reads what arrives within timeout_ms of quiet, up to EOF.
std::string read_for(int fd, int timeout_ms) {
  std::string out;
  char buf[4096];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// One HTTP request over a Unix socket (an API client, as curl would be):
// prints "ok: " and the answer's status line and body.
int http_unix(const char* path, const char* method, const char* target, const char* body) {
  int fd = unix_connect(path, SOCK_STREAM);
  if (fd < 0) return result(-1);
  std::string request =
      std::string(method) + " " + target + " HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n";
  if (body) {
    request +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(std::strlen(body)) +
        "\r\n\r\n" + body;
  } else {
    request += "\r\n";
  }
  ssize_t ignored = ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  (void)ignored;
  std::string answer = read_for(fd, 5000);
  ::close(fd);
  size_t line_end = answer.find("\r\n");
  size_t body_at = answer.find("\r\n\r\n");
  std::string status = answer.substr(0, line_end);
  std::string rest = body_at == std::string::npos ? "" : answer.substr(body_at + 4);
  return result(0, status + " " + rest);
}

// data with one fd (SCM_RIGHTS) on socket_fd: sendmsg's result.
ssize_t send_with_fd(int socket_fd, const std::string& data, int fd, int flags) {
  iovec iov{const_cast<char*>(data.data()), data.size()};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  cmsg->cmsg_level = SOL_SOCKET;
  cmsg->cmsg_type = SCM_RIGHTS;
  cmsg->cmsg_len = CMSG_LEN(sizeof(int));
  std::memcpy(CMSG_DATA(cmsg), &fd, sizeof fd);
  return ::sendmsg(socket_fd, &msg, flags);
}

// Hands a connection of ours to a supervisor's exec socket as the gateway
// does; "ok: upgraded" when the supervisor took it (answered the upgrade).
int exec_handoff(const char* path) {
  int fd = unix_connect(path, SOCK_SEQPACKET);
  if (fd < 0) return result(-1);
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) return result(-1);
  std::string upgrade =
      "GET /v1/sandboxes/x/exec HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\n"
      "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
      "Sec-WebSocket-Version: 13\r\n\r\n";
  // protocol/exec_handoff.h: the tag line, then the request as it is.
  std::string packet = "openshell exec-handoff 1\n" + upgrade;
  if (send_with_fd(fd, packet, pair[1], MSG_NOSIGNAL) < 0) return result(-1);
  ::close(pair[1]);
  ::close(fd);
  std::string answer = read_for(pair[0], 3000);
  if (answer.rfind("HTTP/1.1 101", 0) == 0) return result(0, "upgraded");
  std::printf("denied: no upgrade (%zu bytes)\n", answer.size());
  return 1;
}

// A TCP server on 127.0.0.1:PORT for the port forward tests, one process
// per connection: every chunk read is written back at once, and at the end
// of the client's writes one more line, "eof after N bytes", then the close
// (so a half-closed client still reads its reply). Prints "serving PORT"
// once it listens; runs until it is killed.
int tcp_serve(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd, 128) != 0)
    return result(-1);
  ::signal(SIGCHLD, SIG_IGN);  // each connection's process reaps itself
  std::printf("serving %d\n", port);
  std::fflush(stdout);
  for (;;) {
    int conn = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) continue;
    if (::fork() == 0) {
      ::close(fd);
      char buf[65536];
      size_t total = 0;
      for (;;) {
        ssize_t n = ::read(conn, buf, sizeof buf);
        if (n <= 0) break;
        total += static_cast<size_t>(n);
        for (ssize_t off = 0; off < n;) {
          ssize_t w = ::write(conn, buf + off, static_cast<size_t>(n - off));
          if (w <= 0) ::_exit(1);
          off += w;
        }
      }
      std::string line = "eof after " + std::to_string(total) + " bytes\n";
      ssize_t ignored = ::write(conn, line.data(), line.size());
      (void)ignored;
      ::_exit(0);
    }
    ::close(conn);
  }
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

// A tar header block (ustar) for one entry.
std::string tar_header(const std::string& name, char type, unsigned mode, size_t size) {
  std::string h(512, '\0');
  std::memcpy(&h[0], name.data(), std::min<size_t>(name.size(), 100));
  std::snprintf(&h[100], 8, "%07o", mode);
  std::snprintf(&h[108], 8, "%07o", 0u);
  std::snprintf(&h[116], 8, "%07o", 0u);
  std::snprintf(&h[124], 12, "%011zo", size);
  std::snprintf(&h[136], 12, "%011o", 1600000000u);
  h[156] = type;
  std::memcpy(&h[257], "ustar", 6);
  std::memcpy(&h[263], "00", 2);
  std::memset(&h[148], ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : h) sum += c;
  std::snprintf(&h[148], 8, "%06o", sum);
  h[155] = ' ';
  return h;
}

void tar_pad(std::string* out) { out->append((512 - out->size() % 512) % 512, '\0'); }

// What a hostile `tar -c` in a sandbox can send instead of the files asked
// for: DIR/ with a set-uid root program that carries a file capability
// (CAP_SETUID, as a pax SCHILY.xattr record) and a set-gid one.
int forge_tar(const char* dir) {
  std::string caps(20, '\0');
  caps[0] = 0x01;                     // VFS_CAP_FLAGS_EFFECTIVE
  caps[3] = 0x02;                     // VFS_CAP_REVISION_2
  caps[4] = static_cast<char>(0x80);  // CAP_SETUID permitted
  const std::string key = "SCHILY.xattr.security.capability";
  const size_t body = key.size() + caps.size() + 3;
  size_t length = body + 2;
  while (std::to_string(length).size() + body != length)
    length = std::to_string(length).size() + body;
  const std::string record = std::to_string(length) + " " + key + "=" + caps + "\n";
  const std::string d = dir;
  std::string out = tar_header(d + "/", '5', 0755, 0);
  out += tar_header("PaxHeaders/capped", 'x', 0644, record.size());
  out += record;
  tar_pad(&out);
  out += tar_header(d + "/capped", '0', 04755, 2);
  out += "x\n";
  tar_pad(&out);
  out += tar_header(d + "/sgid", '0', 02755, 2);
  out += "x\n";
  tar_pad(&out);
  out.append(1024, '\0');
  return std::fwrite(out.data(), 1, out.size(), stdout) == out.size() ? 0 : 1;
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
  std::string request =
      std::string("CONNECT ") + host + ":" + port + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n";
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
                     "\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: "
                     "dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n";
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

// One DNS query for name (type A) to the sandbox's stub, 127.0.0.1:53; the
// answer's rcode, or -1 when none came within wait_ms. name is sent as
// given: its labels may hold any bytes.
int dns_ask(const std::string& name, int wait_ms, uint16_t id) {
  std::string q;
  q.push_back(static_cast<char>(id >> 8));
  q.push_back(static_cast<char>(id & 0xFF));
  q += std::string("\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00", 10);  // RD, one question
  size_t start = 0;
  while (start < name.size()) {
    size_t dot = name.find('.', start);
    if (dot == std::string::npos) dot = name.size();
    q.push_back(static_cast<char>(dot - start));
    q += name.substr(start, dot - start);
    start = dot + 1;
  }
  q += std::string("\x00\x00\x01\x00\x01", 5);  // root, A, IN
  int fd = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(53);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::sendto(fd, q.data(), q.size(), 0, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  int rcode = -1;
  pollfd p{fd, POLLIN, 0};
  char buf[1500];
  while (::poll(&p, 1, wait_ms) == 1) {
    ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n >= 12 && static_cast<uint8_t>(buf[0]) == (id >> 8) &&
        static_cast<uint8_t>(buf[1]) == (id & 0xFF)) {
      rcode = static_cast<uint8_t>(buf[3]) & 0x0F;
      break;
    }
  }
  ::close(fd);
  return rcode;
}

// COUNT A queries of NAME, one after the other; a NAME of "*.SUFFIX" asks a
// fresh random label each time. Prints how the stub answered them.
int dns_query(const std::string& name, int count) {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  std::srand(static_cast<unsigned>(now.tv_nsec ^ ::getpid()));
  int noerror = 0, nxdomain = 0, refused = 0, servfail = 0, none = 0, other = 0;
  for (int i = 0; i < count; ++i) {
    std::string asked = name;
    if (asked.rfind("*.", 0) == 0) {
      asked = "x";
      asked += std::to_string(std::rand());
      asked += "-";
      asked += std::to_string(i);
      asked += name.substr(1);
    }
    switch (dns_ask(asked, 2000, static_cast<uint16_t>(std::rand()))) {
      case 0:
        ++noerror;
        break;
      case 2:
        ++servfail;
        break;
      case 3:
        ++nxdomain;
        break;
      case 5:
        ++refused;
        break;
      case -1:
        ++none;
        break;
      default:
        ++other;
    }
  }
  std::printf("noerror=%d nxdomain=%d refused=%d servfail=%d none=%d other=%d\n", noerror, nxdomain,
              refused, servfail, none, other);
  return 0;
}

// COUNT CONNECTs to the proxy, each for a host of LENGTH bytes (a refusal
// with a long host), one after the other. Prints how many got a 403.
int proxy_flood(int count, int length) {
  int refused = 0;
  for (int i = 0; i < count; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(3128);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return result(-1);
    std::string request = "CONNECT " + std::string(static_cast<size_t>(length), 'h') + "-" +
                          std::to_string(i) + ".example:443 HTTP/1.1\r\n\r\n";
    ::write(fd, request.data(), request.size());
    std::string reply;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) reply.append(buf, static_cast<size_t>(n));
    if (reply.find(" 403 ") != std::string::npos) ++refused;
    ::close(fd);
  }
  std::printf("refused=%d\n", refused);
  return 0;
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

// The proxy's answer to a CONNECT on fd: prints "proxy: STATUS LINE" and
// the body of a refusal; 0 when the tunnel is established.
int connect_reply(int fd) {
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

// CONNECT host:port on fd, and connect_reply.
int connect_request(int fd, const char* host, const char* port) {
  std::string request =
      std::string("CONNECT ") + host + ":" + port + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n";
  ::write(fd, request.data(), request.size());
  return connect_reply(fd);
}

void raise_fd_limit() {
  rlimit r{};
  ::getrlimit(RLIMIT_NOFILE, &r);
  r.rlim_cur = r.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &r);
}

// Waits (up to 30 s) until CHILD has exec'd: its binary is no longer ours.
bool wait_exec(pid_t child) {
  char self[4096], now[4096];
  ssize_t own = ::readlink("/proc/self/exe", self, sizeof self);
  std::string exe = "/proc/" + std::to_string(child) + "/exe";
  for (int i = 0; i < 30000; ++i, ::usleep(1000)) {
    ssize_t n = ::readlink(exe.c_str(), now, sizeof now);
    if (n > 0 && (n != own || std::memcmp(self, now, static_cast<size_t>(n)) != 0)) return true;
  }
  return false;
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
  // The other program runs, holding the socket.
  int rc = wait_exec(child) ? connect_request(fd, host, port) : result(-1);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return rc;
}

// One fd through a socket pair (SCM_RIGHTS); -1 on failure.
int send_fd_to(int socket_fd, int fd) {
  return send_with_fd(socket_fd, std::string(1, 'F'), fd, 0) == 1 ? 0 : -1;
}

int receive_fd_from(int socket_fd) {
  char tag = 0;
  iovec iov{&tag, 1};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  if (::recvmsg(socket_fd, &msg, 0) != 1) return -1;
  cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
  if (!cmsg || cmsg->cmsg_type != SCM_RIGHTS) return -1;
  int fd;
  std::memcpy(&fd, CMSG_DATA(cmsg), sizeof fd);
  return fd;
}

// The binaries rule's bypass by hiding the socket from the proxy's look at
// its holders: this program connects and at once sends its only copy to
// itself (in flight in a socket pair, in no process's fd table) while the
// proxy looks. Then a program the policy names (argv) is started holding
// the socket, and this one takes the socket back and talks: at the request
// the proxy finds only argv, a process new since it first looked.
int proxy_hide(const char* host, const char* port, char** argv) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair) != 0) return result(-1);
  int fd = connect_proxy(false);
  if (fd < 0 || send_fd_to(pair[0], fd) != 0) return result(-1);
  ::close(fd);
  ::usleep(100000);  // the proxy looks at the socket's holders: none
  pid_t child = ::fork();
  if (child == 0) {
    // It holds the socket (inherited through exec), and puts it back in
    // flight for its parent.
    int held = receive_fd_from(pair[1]);
    if (held < 0 || send_fd_to(pair[0], held) != 0) ::_exit(1);
    ::execv(argv[0], argv);
    ::_exit(127);
  }
  // argv runs, holding the socket (the child put it back in flight before exec).
  int back = wait_exec(child) ? receive_fd_from(pair[1]) : -1;
  if (back < 0) return result(-1);
  int rc = connect_request(back, host, port);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  return rc;
}

// The same bypass with the socket handed on for good: a process connects,
// hides the socket in flight, and later a new process takes it, runs
// /bin/sh (which the policy names) and makes the request, after the one
// that connected has exited. The shell prints the proxy's status line.
int proxy_pass(const char* host, const char* port) {
  int done[2];
  if (::pipe(done) != 0) return result(-1);
  pid_t connector = ::fork();
  if (connector == 0) {
    ::close(done[0]);
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0, pair) != 0) ::_exit(1);
    int fd = connect_proxy(false);
    if (fd < 0 || send_fd_to(pair[0], fd) != 0) ::_exit(1);
    ::close(fd);
    ::usleep(300000);  // the proxy looks at the socket's holders: none
    const pid_t connector_pid = ::getpid();
    if (::fork() == 0) {
      int back = receive_fd_from(pair[1]);
      if (back < 0 || ::dup2(back, 3) != 3) ::_exit(1);
      // The request once the process that connected has exited (a zombie
      // has no exe link), 30 s at most.
      std::string script = "i=0; while [ -e /proc/" + std::to_string(connector_pid) +
                           "/exe ] && [ $i -lt 3000 ]; do i=$((i+1)); sleep 0.01; done; " +
                           "printf 'CONNECT " + host + ":" + port + " HTTP/1.1\\r\\nHost: " + host +
                           "\\r\\n\\r\\n' >&3; " + "head -n 1 <&3 | sed 's/^/proxy: /'";
      ::execl("/bin/sh", "sh", "-c", script.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::_exit(0);  // before the request
  }
  ::close(done[1]);
  ::waitpid(connector, nullptr, 0);
  char c;
  while (::read(done[0], &c, 1) > 0) {
  }  // EOF: the shell has ended
  std::fflush(stdout);
  return 0;
}

// CONNECT host:port through the proxy on a socket connected without
// connect(2): TCP Fast Open, the request in the SYN (sendto MSG_FASTOPEN).
int proxy_fastopen(const char* host, const char* port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(3128);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string request =
      std::string("CONNECT ") + host + ":" + port + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n";
  if (fd < 0 || ::sendto(fd, request.data(), request.size(), MSG_FASTOPEN,
                         reinterpret_cast<sockaddr*>(&addr), sizeof addr) < 0)
    return result(-1);
  return connect_reply(fd);
}

// COUNT connect()s to a listener on the sandbox's own loopback; prints how
// long each took on average (the cost of the runtime's look at connect).
int loopback_connects(int count) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t size = sizeof addr;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 128) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &size) != 0)
    return result(-1);
  timespec start{}, end{};
  ::clock_gettime(CLOCK_MONOTONIC, &start);
  double in_connect = 0;
  for (int i = 0; i < count; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timespec a{}, b{};
    ::clock_gettime(CLOCK_MONOTONIC, &a);
    int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::clock_gettime(CLOCK_MONOTONIC, &b);
    if (fd < 0 || rc != 0) return result(-1);
    in_connect += (b.tv_sec - a.tv_sec) * 1e6 + (b.tv_nsec - a.tv_nsec) / 1e3;
    int accepted = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (accepted < 0) return result(-1);
    char byte = 'x';
    if (::write(fd, &byte, 1) != 1 || ::read(accepted, &byte, 1) != 1) return result(-1);
    ::close(accepted);
    ::close(fd);
  }
  ::clock_gettime(CLOCK_MONOTONIC, &end);
  double total = (end.tv_sec - start.tv_sec) * 1e6 + (end.tv_nsec - start.tv_nsec) / 1e3;
  char line[128];
  std::snprintf(line, sizeof line, "%d connects, %.1f us in connect() each, %.1f us a round", count,
                in_connect / count, total / count);
  return result(0, line);
}

// connect() of sockets other than TCP: a Unix socket (abstract name) and
// a UDP socket to the sandbox's loopback.
int unix_connect() {
  int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, "\0osh-probe-unix", 15);
  socklen_t size = offsetof(sockaddr_un, sun_path) + 15;
  if (listener < 0 || ::bind(listener, reinterpret_cast<sockaddr*>(&addr), size) != 0 ||
      ::listen(listener, 1) != 0)
    return result(-1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), size) != 0) return result(-1);
  int udp = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(9);
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (udp < 0 || ::connect(udp, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0)
    return result(-1);
  return result(0, "unix and udp");
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
// AFTER seconds more. Prints "open N refused M" (a refused one gets a 503)
// once no more than EXPECT_OPEN are left unrefused, or after 30 s.
int hold_connections(int count, int hold, int after, int expect_open) {
  raise_fd_limit();
  std::vector<int> fds;
  for (int i = 0; i < count; ++i) {
    int fd = connect_proxy(false);
    if (fd < 0) break;
    fds.push_back(fd);
  }
  int refused = 0;
  std::vector<bool> answered(fds.size());
  for (int round = 0;
       round < 300 && fds.size() - static_cast<size_t>(refused) > static_cast<size_t>(expect_open);
       ++round) {
    std::vector<pollfd> p;
    for (size_t i = 0; i < fds.size(); ++i) p.push_back({answered[i] ? -1 : fds[i], POLLIN, 0});
    if (::poll(p.data(), p.size(), 100) <= 0) continue;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (!p[i].revents) continue;
      answered[i] = true;
      char buf[256];
      ssize_t n = ::read(fds[i], buf, sizeof buf - 1);
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
// until the proxy closes a, for SECONDS at most: prints "a closed at MS" /
// "b closed at MS" (CLOCK_MONOTONIC) when the proxy closes one, and at the
// end "b echo ok" when b still works.
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
  while (now_ms() < end && a_open) {
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

// What a sandbox could do to a terminal it was handed: for each of fd 0-2,
// whether it is a terminal, turning its echo off (tcsetattr), and making it
// the controlling terminal; then opening /dev/tty. One line each.
int tty_attack() {
  for (int fd = 0; fd < 3; ++fd) {
    std::printf("fd %d isatty %d\n", fd, ::isatty(fd));
    termios t{};
    if (::tcgetattr(fd, &t) == 0) {
      t.c_lflag &= ~static_cast<tcflag_t>(ECHO | ICANON);
      int rc = ::tcsetattr(fd, TCSANOW, &t);
      std::printf("fd %d tcsetattr %s\n", fd, rc == 0 ? "ok" : std::strerror(errno));
    } else {
      std::printf("fd %d tcgetattr %s\n", fd, std::strerror(errno));
    }
    int rc = ::ioctl(fd, TIOCSCTTY, 1);
    std::printf("fd %d TIOCSCTTY %s\n", fd, rc == 0 ? "ok" : std::strerror(errno));
  }
  int fd = ::open("/dev/tty", O_RDWR | O_CLOEXEC);
  std::printf("open /dev/tty %s\n", fd >= 0 ? "ok" : std::strerror(errno));
  if (fd >= 0) {
    termios t{};
    if (::tcgetattr(fd, &t) == 0) {
      t.c_lflag &= ~static_cast<tcflag_t>(ECHO);
      std::printf("/dev/tty tcsetattr %s\n",
                  ::tcsetattr(fd, TCSANOW, &t) == 0 ? "ok" : std::strerror(errno));
    }
  }
  std::fflush(stdout);
  return 0;
}

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
  if (action == "ptrace") {
    // "child": a child of the probe's own, which any tracer may attach to
    // where the filter lets ptrace through; else the given pid.
    pid_t child = -1;
    if (std::string(arg(2)) == "child") {
      child = ::fork();
      if (child == 0) {
        ::pause();
        ::_exit(0);
      }
    }
    long rc = ::ptrace(PTRACE_ATTACH, child > 0 ? child : std::atoi(arg(2)), nullptr, nullptr);
    int err = errno;
    if (child > 0) {
      ::kill(child, SIGKILL);
      ::waitpid(child, nullptr, 0);
    }
    errno = err;
    return result(rc);
  }
  if (action == "kill") return result(::kill(std::atoi(arg(2)), 0));
  if (action == "keyctl")
    return result(::syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "osh-probe"));
  if (action == "add_key")
    return result(::syscall(SYS_add_key, "user", "osh", "x", 1, KEY_SPEC_PROCESS_KEYRING));
  if (action == "bpf") {
    union bpf_attr attr {};
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
    // This process only, user space only: what perf_event_paranoid 2 lets
    // an unprivileged process measure.
    attr.exclude_kernel = 1;
    attr.exclude_hv = 1;
    return result(::syscall(SYS_perf_event_open, &attr, 0, -1, -1, 0));
  }
  // User-mode faults only: what vm.unprivileged_userfaultfd=0 still allows.
  if (action == "userfaultfd")
    return result(::syscall(SYS_userfaultfd, O_CLOEXEC | UFFD_USER_MODE_ONLY));
  if (action == "io_uring") {
    io_uring_params params{};
    return result(::syscall(SYS_io_uring_setup, 8, &params));
  }
  // Arguments the kernel refuses only after its permission checks (more
  // segments than KEXEC_SEGMENT_MAX: EINVAL; an empty module: ENOEXEC), so
  // that where they pass, nothing is loaded or unloaded.
  if (action == "kexec_load") return result(::syscall(SYS_kexec_load, 0, 17, nullptr, 0));
  if (action == "init_module") return result(::syscall(SYS_init_module, nullptr, 0, ""));
  if (action == "open_by_handle_at") {
    char buf[sizeof(file_handle) + 128] = {};
    auto* handle = reinterpret_cast<file_handle*>(buf);
    handle->handle_bytes = 8;
    return result(::syscall(SYS_open_by_handle_at, AT_FDCWD, handle, O_RDONLY));
  }
  if (action == "name_to_handle_at") {
    // Needs no privilege: only the profile stands in its way.
    char buf[sizeof(file_handle) + MAX_HANDLE_SZ] = {};
    auto* handle = reinterpret_cast<file_handle*>(buf);
    handle->handle_bytes = MAX_HANDLE_SZ;
    int mount_id = 0;
    return result(::syscall(SYS_name_to_handle_at, AT_FDCWD, arg(2), handle, &mount_id, 0));
  }
  if (action == "raw-socket") return result(::socket(AF_INET, SOCK_RAW, IPPROTO_ICMP));
  if (action == "packet-socket") return result(::socket(AF_PACKET, SOCK_RAW, 0));
  if (action == "tcp-socket") return result(::socket(AF_INET, SOCK_STREAM, 0));
  if (action == "connect") return tcp_connect(arg(2), std::atoi(arg(3)));
  if (action == "tcp-serve") return tcp_serve(std::atoi(arg(2)));
  if (action == "http-unix") return http_unix(arg(2), arg(3), arg(4), argc > 5 ? argv[5] : nullptr);
  if (action == "exec-handoff") return exec_handoff(arg(2));
  if (action == "write") return write_file(arg(2), argc > 3 ? argv[3] : "osh-probe\n");
  if (action == "read") return read_file(arg(2));
  if (action == "open-device") return open_device(arg(2));
  if (action == "mknod") return result(::mknod(arg(2), S_IFCHR | 0600, makedev(1, 3)));
  if (action == "setcap") {
    // A file capability (vfs_cap_data, VFS_CAP_REVISION_2): CAP_SETUID
    // permitted and effective, as `setcap cap_setuid+ep FILE` writes it.
    unsigned char caps[20] = {};
    caps[0] = 0x01;  // VFS_CAP_FLAGS_EFFECTIVE
    caps[3] = 0x02;  // VFS_CAP_REVISION_2
    caps[4] = 0x80;  // permitted: bit 7, CAP_SETUID
    return result(::setxattr(arg(2), "security.capability", caps, sizeof caps, 0));
  }
  if (action == "setxattr")
    return result(::setxattr(arg(2), arg(3), arg(4), std::strlen(arg(4)), 0));
  if (action == "forge-tar") return forge_tar(arg(2));
  if (action == "chroot") return result(::chroot(arg(2)));
  if (action == "setuid") return result(::setuid(static_cast<uid_t>(std::atoi(arg(2)))));
  if (action == "sethostname") return result(::sethostname("escaped", 7));
  if (action == "tiocsti") {
    char c = 'x';
    return result(::ioctl(0, TIOCSTI, &c));
  }
  if (action == "syscall") return result(::syscall(std::atol(arg(2)), 0, 0, 0, 0, 0));
  if (action == "fork") return fork_many(std::atoi(arg(2)));
  if (action == "tty-attack") return tty_attack();
  if (action == "alloc") return alloc_mb(std::atol(arg(2)));
  if (action == "fds") return list_fds();
  if (action == "spin") return spin_cpu(std::atol(arg(2)));
  if (action == "exe-reopen") return exe_reopen(arg(2));
  if (action == "proxy-connect") return proxy_connect(arg(2), arg(3), argc > 4 ? argv[4] : "echo");
  if (action == "dns-query") return dns_query(arg(2), std::atoi(arg(3)));
  if (action == "dns-bad-label") {
    // A label of bytes that are neither a host name's nor UTF-8.
    int rcode = dns_ask(std::string("\xff\xfe.") + arg(2), 500, 0x4242);
    std::printf(rcode < 0 ? "no answer\n" : "rcode %d\n", rcode);
    return 0;
  }
  if (action == "proxy-flood") return proxy_flood(std::atoi(arg(2)), std::atoi(arg(3)));
  if (action == "proxy-handoff" && argc > 4) return proxy_handoff(arg(2), arg(3), argv + 4);
  if (action == "proxy-hide" && argc > 4) return proxy_hide(arg(2), arg(3), argv + 4);
  if (action == "unix-connect") return unix_connect();
  if (action == "proxy-fastopen") return proxy_fastopen(arg(2), arg(3));
  if (action == "proxy-pass") return proxy_pass(arg(2), arg(3));
  if (action == "loopback-connects") return loopback_connects(std::atoi(arg(2)));
  if (action == "proxy-connect-mapped") return proxy_connect_mapped(arg(2), arg(3), arg(4));
  if (action == "hold-connections")
    return hold_connections(std::atoi(arg(2)), std::atoi(arg(3)), std::atoi(arg(4)),
                            std::atoi(arg(5)));
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
  if (action == "exe-seals") {
    // The seals of a program's image (a memfd's; EINVAL for a plain file).
    int fd = ::open(arg(2), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return result(-1);
    const int seals = ::fcntl(fd, F_GET_SEALS);
    if (seals < 0) return result(-1);
    const int all = F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE;
    return result(0, (seals & all) == all ? "sealed" : "not sealed");
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
