// egress_bench: the client and the server of bench/run-egress-bench, which
// measures the egress proxy (src/egress/proxy.cc). One static binary, copied
// into the sandbox's root as the client and run on the host as the server.
//
//   egress_bench server [--port N] [--port-file FILE]
//   egress_bench latency --target HOST:PORT [--proxy ADDR:PORT] [--count N] [--warmup N]
//                        [--samples]
//   egress_bench bulk --target HOST:PORT [--proxy ADDR:PORT] --bytes N --direction down|up
//   egress_bench poll --target HOST:PORT --proxy ADDR:PORT [--interval-us N] [--changes N]
//                     [--timeout-s N]
//   egress_bench stamp -- CMD [ARG...]
//   egress_bench https-server --ca-out FILE [--port N] [--port-file FILE]
//   egress_bench tls-requests --target HOST:PORT [--proxy ADDR:PORT] --ca FILE [--count N]
//                             [--warmup N] [--samples]
//   egress_bench tls-connections --target HOST:PORT [--proxy ADDR:PORT] --ca FILE [--count N]
//                                [--warmup N] [--samples]
//   egress_bench tls-bulk --target HOST:PORT [--proxy ADDR:PORT] --ca FILE --bytes N
//
// server: listens on 127.0.0.1 only (port 0: any free one, written to
// --port-file once listening) and serves each connection by its first byte:
//   'E'          echo: sends 'E' back and closes (a new connection's round trip);
//   'D' + u64 n  download: sends n bytes, then closes;
//   'U' + u64 n  upload: reads n bytes, then sends 'K' and closes.
// (u64 little-endian.) Echo is answered on the accepting thread; downloads
// and uploads get a thread each.
//
// Clients connect to --target directly (HOST must be an IPv4 literal; nothing
// is resolved), or, with --proxy, to the proxy, which is asked
// "CONNECT HOST:PORT HTTP/1.1" and must answer 200 before the first byte of
// the protocol above is sent (as curl and other HTTP clients do: they wait
// for the 200). TCP_NODELAY is set on every client socket. Each prints one
// JSON line on stdout.
//
// latency: --count sequential new connections (after --warmup uncounted
// ones), each timed with CLOCK_MONOTONIC from just before connect() to the
// echoed byte's arrival ("total"), split at the end of the tunnel set-up
// ("setup": connect() returned, or the proxy's 200 read) into "setup" and
// "echo". The client closes each connection after the echo. Statistics in
// microseconds, the median of each tenth of the run in order (a drift shows),
// and with --samples every total and setup time.
//
// bulk: one connection (one tunnel); the time from just before the request
// is sent to the last byte read (down) or to the server's 'K' (up: every
// byte has arrived).
//
// poll: a new connection through the proxy every --interval-us (or as fast
// as they complete, when slower), each judged "allow" (200 and the echo),
// "deny" (403) or "error:..."; prints a line for the first attempt and for
// every attempt whose outcome differs from the one before, with the
// attempt's start and end in CLOCK_REALTIME ns (the same clock on the host
// and in the sandbox whatever its namespaces) and the start of the attempt
// before it. Ends after --changes changes, or after --timeout-s.
//
// stamp: reads CLOCK_REALTIME, spawns CMD (stdout to /dev/null), waits for
// it and prints {"start_ns", "end_ns", "status"}: the time right before the
// command starts, for the host's side of the poll measurement.
//
// https-server: HTTPS on 127.0.0.1 (TLS 1.3 only, HTTP/1.1, keep-alive),
// for the layer-7 rows. Its certificate is for IP 127.0.0.1, signed by a CA
// of its own made at start (the same kind of CA and leaf a sandbox's proxy
// makes: ECDSA P-256, egress/tls.h), whose certificate is written to
// --ca-out. GET /small answers "small\n" (6 bytes); GET /bytes?n=N answers
// N bytes with a Content-Length; anything else 404. A thread per connection.
//
// The tls-* clients speak TLS 1.3 to --target (directly, or through the
// proxy's CONNECT tunnel, inside which the TLS is end to end with the server
// for a layer-4 endpoint and with the proxy for an inspected one), trusting
// only the certificates of --ca (a PEM file: the server's CA, or the
// sandbox's CA bundle), checking the name (an IP literal as an IP address),
// offering ALPN http/1.1 as curl does. A fresh handshake every time: no
// session is resumed.
//
// tls-requests: one connection, then --count sequential GET /small (after
// --warmup uncounted ones), each timed from just before the request is
// written to the last byte of the answer.
//
// tls-connections: --count sequential new connections (after --warmup),
// each: connect, the tunnel, the TLS handshake, one GET /small, timed from
// just before connect() to the answer's last byte ("total"), split into
// "tunnel" (connect() returned or the proxy's 200 read), "handshake" and
// "request". Then a close_notify and close.
//
// tls-bulk: one connection, a handshake and one GET /small (not timed),
// then GET /bytes?n=N timed from just before the request to the last byte.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <spawn.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "bench_util.h"
#include "egress/tls.h"

extern char** environ;

namespace {

constexpr const char* kUsage =
    "usage: egress_bench server [--port N] [--port-file FILE]\n"
    "       egress_bench latency --target HOST:PORT [--proxy ADDR:PORT] [--count N] [--warmup N]\n"
    "                            [--samples]\n"
    "       egress_bench bulk --target HOST:PORT [--proxy ADDR:PORT] --bytes N --direction "
    "down|up\n"
    "       egress_bench poll --target HOST:PORT --proxy ADDR:PORT [--interval-us N] [--changes "
    "N]\n"
    "                         [--timeout-s N]\n"
    "       egress_bench stamp -- CMD [ARG...]\n"
    "       egress_bench https-server --ca-out FILE [--port N] [--port-file FILE]\n"
    "       egress_bench tls-requests|tls-connections --target HOST:PORT [--proxy ADDR:PORT]\n"
    "                            --ca FILE [--count N] [--warmup N] [--samples]\n"
    "       egress_bench tls-bulk --target HOST:PORT [--proxy ADDR:PORT] --ca FILE --bytes N\n"
    "\n"
    "Without --proxy, HOST is an IPv4 literal and the client connects to it; with it,\n"
    "the client connects to the proxy and asks CONNECT HOST:PORT. Results are JSON lines.\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "egress_bench: %s\n\n%s", why.c_str(), kUsage);
  std::exit(2);
}

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "egress_bench: %s\n", what.c_str());
  std::exit(1);
}

[[noreturn]] void die_errno(const std::string& what) { die(what + ": " + std::strerror(errno)); }

int64_t now_ns(clockid_t clock = CLOCK_MONOTONIC) {
  timespec ts{};
  ::clock_gettime(clock, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

double cpu_seconds() {
  rusage ru{};
  ::getrusage(RUSAGE_SELF, &ru);
  return static_cast<double>(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
         static_cast<double>(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6;
}

uint64_t parse_number(const std::string& flag, const std::string& text, uint64_t min,
                      uint64_t max) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || text[0] == '-' || v < min || v > max)
    usage_error(flag + " needs a whole number from " + std::to_string(min) + " to " +
                std::to_string(max) + ", not '" + text + "'");
  // Suffixes K, M, G (binary) for sizes.
  uint64_t scale = 1;
  if (*end == 'K' || *end == 'k')
    scale = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    scale = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    scale = 1ull << 30, ++end;
  if (*end != '\0') usage_error(flag + ": '" + text + "' is not a number");
  return v * scale;
}

struct HostPort {
  std::string host;
  uint16_t port = 0;
  std::string text() const { return host + ":" + std::to_string(port); }
};

HostPort parse_host_port(const std::string& flag, const std::string& text) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) usage_error(flag + " needs HOST:PORT");
  HostPort hp;
  hp.host = text.substr(0, colon);
  hp.port = static_cast<uint16_t>(parse_number(flag, text.substr(colon + 1), 1, 65535));
  return hp;
}

sockaddr_in ipv4(const HostPort& hp, const std::string& flag) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(hp.port);
  if (::inet_pton(AF_INET, hp.host.c_str(), &sa.sin_addr) != 1)
    usage_error(flag + ": '" + hp.host + "' is not an IPv4 address (nothing is resolved here)");
  return sa;
}

bool write_all(int fd, const void* data, size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

// Reads exactly size bytes; false on EOF or error first.
bool read_exact(int fd, void* data, size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

void put_u64(char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t get_u64(const char* in) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(in[i])) << (8 * i);
  return v;
}

// ---- server -------------------------------------------------------------------

void serve_download(int fd, uint64_t n) {
  std::vector<char> buf(1 << 20, 'x');
  while (n > 0) {
    size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
    if (!write_all(fd, buf.data(), chunk)) break;
    n -= chunk;
  }
  ::shutdown(fd, SHUT_WR);
  // Until the client has read everything and closed (a close with unread
  // data would reset the connection).
  char sink[4096];
  while (::read(fd, sink, sizeof sink) > 0) {
  }
  ::close(fd);
}

void serve_upload(int fd, uint64_t n) {
  std::vector<char> buf(1 << 20);
  while (n > 0) {
    ssize_t got = ::read(fd, buf.data(), static_cast<size_t>(std::min<uint64_t>(n, buf.size())));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    n -= static_cast<uint64_t>(got);
  }
  if (n == 0) write_all(fd, "K", 1);
  ::close(fd);
}

// Listens on 127.0.0.1:port (0: any free port) and says which port: in
// port_file when given, else on stdout.
int listen_loopback(uint16_t port, const std::string& port_file) {
  int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0) die_errno("socket");
  int one = 1;
  ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);  // loopback only
  if (::bind(listener, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0)
    die_errno("bind 127.0.0.1");
  if (::listen(listener, 4096) != 0) die_errno("listen");
  socklen_t len = sizeof sa;
  ::getsockname(listener, reinterpret_cast<sockaddr*>(&sa), &len);
  port = ntohs(sa.sin_port);
  if (!port_file.empty()) {
    // Written whole, then renamed: a reader never sees half a number.
    std::string tmp = port_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) die_errno(tmp);
    std::fprintf(f, "%u\n", port);
    if (std::fclose(f) != 0 || std::rename(tmp.c_str(), port_file.c_str()) != 0)
      die_errno(port_file);
  } else {
    std::printf("%u\n", port);
    std::fflush(stdout);
  }
  return listener;
}

// A server's options: --port, --port-file and, where ca_out is given,
// --ca-out.
void server_args(int argc, char** argv, const std::string& name, uint16_t* port,
                 std::string* port_file, std::string* ca_out = nullptr) {
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--port")
      *port = static_cast<uint16_t>(parse_number(a, value(), 0, 65535));
    else if (a == "--port-file")
      *port_file = value();
    else if (a == "--ca-out" && ca_out)
      *ca_out = value();
    else
      usage_error(name + ": unexpected argument '" + a + "'");
  }
}

// Serves `listener` for ever: each accepted connection (TCP_NODELAY set)
// to `serve`, which owns its fd.
[[noreturn]] void accept_loop(int listener, const std::function<void(int fd)>& serve) {
  int one = 1;
  std::signal(SIGPIPE, SIG_IGN);
  while (true) {
    int fd = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      die_errno("accept");
    }
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    serve(fd);
  }
}

int run_server(int argc, char** argv) {
  uint16_t port = 0;
  std::string port_file;
  server_args(argc, argv, "server", &port, &port_file);
  accept_loop(listen_loopback(port, port_file), [](int fd) {
    // A client that connects and says nothing is dropped after a second.
    pollfd p{fd, POLLIN, 0};
    char mode = 0;
    if (::poll(&p, 1, 1000) != 1 || ::read(fd, &mode, 1) != 1) {
      ::close(fd);
      return;
    }
    if (mode == 'E') {
      write_all(fd, "E", 1);
      ::close(fd);
    } else if (mode == 'D' || mode == 'U') {
      char size[8];
      if (::poll(&p, 1, 1000) != 1 || !read_exact(fd, size, sizeof size)) {
        ::close(fd);
        return;
      }
      uint64_t n = get_u64(size);
      std::thread(mode == 'D' ? serve_download : serve_upload, fd, n).detach();
    } else {
      ::close(fd);
    }
  });
}

// ---- clients ------------------------------------------------------------------

struct Endpoint {
  HostPort target;  // asked of the proxy, or dialled when there is no proxy
  bool via_proxy = false;
  sockaddr_in dial{};  // the proxy's address, or the target's
};

struct Conn {
  int fd = -1;
  int status = 0;  // the proxy's answer (200 when direct and connected); 0: no answer
  std::string error;
};

// Opens a connection and, through a proxy, the CONNECT tunnel. *setup_done
// (when given) is the CLOCK_MONOTONIC time the tunnel was ready.
Conn open_conn(const Endpoint& e, int64_t* setup_done = nullptr) {
  Conn c;
  c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c.fd < 0) die_errno("socket");
  int one = 1;
  ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  if (::connect(c.fd, reinterpret_cast<const sockaddr*>(&e.dial), sizeof e.dial) != 0) {
    c.error = std::string("connect: ") + std::strerror(errno);
    return c;
  }
  if (!e.via_proxy) {
    c.status = 200;
    if (setup_done) *setup_done = now_ns();
    return c;
  }
  std::string request =
      "CONNECT " + e.target.text() + " HTTP/1.1\r\nHost: " + e.target.text() + "\r\n\r\n";
  if (!write_all(c.fd, request.data(), request.size())) {
    c.error = std::string("send CONNECT: ") + std::strerror(errno);
    return c;
  }
  // The answer's head; the server says nothing before it hears from us, so
  // nothing after the head can have arrived.
  std::string head;
  char buf[1024];
  while (head.find("\r\n\r\n") == std::string::npos) {
    ssize_t n = ::read(c.fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      c.error = n == 0 ? "the proxy closed before answering" : std::strerror(errno);
      return c;
    }
    head.append(buf, static_cast<size_t>(n));
    if (head.size() > 65536) {
      c.error = "the proxy's answer has no end";
      return c;
    }
  }
  if (setup_done) *setup_done = now_ns();
  if (head.compare(0, 9, "HTTP/1.1 ") == 0 || head.compare(0, 9, "HTTP/1.0 ") == 0)
    c.status = std::atoi(head.c_str() + 9);
  if (c.status != 200) {
    // A refusal's body says why (the proxy's reason); what came with the
    // head, and whatever follows within 100 ms, up to 1 KiB.
    std::string body = head.substr(head.find("\r\n\r\n") + 4);
    pollfd p{c.fd, POLLIN, 0};
    while (body.size() < 1024 && ::poll(&p, 1, 100) == 1) {
      ssize_t n = ::read(c.fd, buf, sizeof buf);
      if (n <= 0) break;
      body.append(buf, static_cast<size_t>(n));
    }
    while (!body.empty() && (body.back() == '\n' || body.back() == '\r')) body.pop_back();
    c.error = head.substr(0, head.find("\r\n")) + (body.empty() ? "" : ": " + body.substr(0, 1024));
  }
  return c;
}

using bench::Stats;
using bench::stats_of;

std::string json_stats(const Stats& s) {
  char out[256];
  std::snprintf(out, sizeof out,
                "{\"median\": %.2f, \"p10\": %.2f, \"p90\": %.2f, \"p99\": %.2f, \"mean\": %.2f, "
                "\"min\": %.2f, \"max\": %.2f}",
                s.median, s.p10, s.p90, s.p99, s.mean, s.min, s.max);
  return out;
}

using bench::json_string;

struct ClientOptions {
  Endpoint endpoint;
  uint64_t count = 2000, warmup = 100, bytes = 0;
  std::string direction;
  uint64_t interval_us = 1000, changes = 1, timeout_s = 60;
  bool samples = false;
  std::string ca_file;  // the tls-* modes: the certificates trusted
};

ClientOptions parse_client(const std::string& mode, int argc, char** argv) {
  ClientOptions o;
  const bool tls = mode.compare(0, 4, "tls-") == 0;
  const bool counted = mode == "latency" || mode == "tls-requests" || mode == "tls-connections";
  const bool sized = mode == "bulk" || mode == "tls-bulk";
  bool have_target = false;
  HostPort proxy;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--target") {
      o.endpoint.target = parse_host_port(a, value());
      have_target = true;
    } else if (a == "--proxy") {
      proxy = parse_host_port(a, value());
      o.endpoint.via_proxy = true;
    } else if (a == "--count" && counted) {
      o.count = parse_number(a, value(), 1, 10'000'000);
    } else if (a == "--warmup" && counted) {
      o.warmup = parse_number(a, value(), 0, 10'000'000);
    } else if (a == "--samples" && counted) {
      o.samples = true;
    } else if (a == "--ca" && tls) {
      o.ca_file = value();
    } else if (a == "--bytes" && sized) {
      o.bytes = parse_number(a, value(), 1, 1ull << 50);
    } else if (a == "--direction" && mode == "bulk") {
      o.direction = value();
      if (o.direction != "down" && o.direction != "up")
        usage_error("--direction is down or up, not '" + o.direction + "'");
    } else if (a == "--interval-us" && mode == "poll") {
      o.interval_us = parse_number(a, value(), 0, 10'000'000);
    } else if (a == "--changes" && mode == "poll") {
      o.changes = parse_number(a, value(), 0, 10'000'000);
    } else if (a == "--timeout-s" && mode == "poll") {
      o.timeout_s = parse_number(a, value(), 1, 86400);
    } else {
      usage_error(mode + ": unexpected argument '" + a + "'");
    }
  }
  if (!have_target) usage_error(mode + " needs --target HOST:PORT");
  if (mode == "bulk" && (o.bytes == 0 || o.direction.empty()))
    usage_error("bulk needs --bytes and --direction");
  if (mode == "tls-bulk" && o.bytes == 0) usage_error("tls-bulk needs --bytes");
  if (tls && o.ca_file.empty()) usage_error(mode + " needs --ca FILE");
  if (mode == "poll" && !o.endpoint.via_proxy) usage_error("poll needs --proxy");
  o.endpoint.dial =
      o.endpoint.via_proxy ? ipv4(proxy, "--proxy") : ipv4(o.endpoint.target, "--target");
  return o;
}

int run_latency(const ClientOptions& o) {
  const Endpoint& e = o.endpoint;
  std::vector<double> total, setup, echo;
  total.reserve(o.count);
  setup.reserve(o.count);
  echo.reserve(o.count);
  double cpu0 = 0;
  int64_t wall0 = 0;
  for (uint64_t i = 0; i < o.warmup + o.count; ++i) {
    if (i == o.warmup) {
      cpu0 = cpu_seconds();
      wall0 = now_ns();
    }
    int64_t t0 = now_ns(), t1 = 0;
    Conn c = open_conn(e, &t1);
    if (c.status != 200) die("connection " + std::to_string(i) + ": " + c.error);
    char byte = 0;
    if (!write_all(c.fd, "E", 1) || ::read(c.fd, &byte, 1) != 1 || byte != 'E')
      die("connection " + std::to_string(i) + ": no echo");
    int64_t t2 = now_ns();
    ::close(c.fd);
    if (i < o.warmup) continue;
    total.push_back(static_cast<double>(t2 - t0) / 1e3);
    setup.push_back(static_cast<double>(t1 - t0) / 1e3);
    echo.push_back(static_cast<double>(t2 - t1) / 1e3);
  }
  double wall = static_cast<double>(now_ns() - wall0) / 1e9;
  double cpu = cpu_seconds() - cpu0;
  // The median of each tenth of the run, in order: does it drift?
  std::string tenths = "[";
  for (size_t k = 0; k < 10; ++k) {
    size_t from = total.size() * k / 10, to = total.size() * (k + 1) / 10;
    if (to <= from) continue;
    std::vector<double> part(total.begin() + static_cast<long>(from),
                             total.begin() + static_cast<long>(to));
    char num[32];
    std::snprintf(num, sizeof num, "%s%.2f", tenths.size() > 1 ? ", " : "", stats_of(part).median);
    tenths += num;
  }
  tenths += "]";
  // Every sample, in order (--samples), for pooling several runs.
  std::string samples;
  if (o.samples) {
    for (const char* key : {"total", "setup"}) {
      const std::vector<double>& v = key[0] == 't' ? total : setup;
      samples += std::string(", \"") + key + "_samples_us\": [";
      for (size_t k = 0; k < v.size(); ++k) {
        char num[32];
        std::snprintf(num, sizeof num, "%s%.2f", k ? ", " : "", v[k]);
        samples += num;
      }
      samples += "]";
    }
  }
  std::printf(
      "{\"mode\": \"latency\", \"via\": \"%s\", \"target\": %s, \"count\": %llu, \"warmup\": %llu, "
      "\"total_us\": %s, \"setup_us\": %s, \"echo_us\": %s, \"tenths_median_us\": %s, "
      "\"wall_s\": %.3f, \"client_cpu_s\": %.3f%s}\n",
      e.via_proxy ? "proxy" : "direct", json_string(e.target.text()).c_str(),
      static_cast<unsigned long long>(o.count), static_cast<unsigned long long>(o.warmup),
      json_stats(stats_of(total)).c_str(), json_stats(stats_of(setup)).c_str(),
      json_stats(stats_of(echo)).c_str(), tenths.c_str(), wall, cpu, samples.c_str());
  return 0;
}

int run_bulk(const ClientOptions& o) {
  const Endpoint& e = o.endpoint;
  Conn c = open_conn(e);
  if (c.status != 200) die("bulk: " + c.error);
  char request[9];
  request[0] = o.direction == "down" ? 'D' : 'U';
  put_u64(request + 1, o.bytes);
  std::vector<char> buf(1 << 20, 'y');
  double cpu0 = cpu_seconds();
  int64_t t0 = now_ns();
  if (!write_all(c.fd, request, sizeof request)) die_errno("bulk: send");
  uint64_t moved = 0;
  if (o.direction == "down") {
    while (true) {
      ssize_t n = ::read(c.fd, buf.data(), buf.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) die_errno("bulk: read");
      if (n == 0) break;
      moved += static_cast<uint64_t>(n);
    }
  } else {
    while (moved < o.bytes) {
      size_t chunk = static_cast<size_t>(std::min<uint64_t>(o.bytes - moved, buf.size()));
      if (!write_all(c.fd, buf.data(), chunk)) die_errno("bulk: send");
      moved += chunk;
    }
    char k = 0;
    if (::read(c.fd, &k, 1) != 1 || k != 'K') die("bulk: the server did not confirm the upload");
  }
  int64_t t1 = now_ns();
  double cpu = cpu_seconds() - cpu0;
  ::close(c.fd);
  if (moved != o.bytes)
    die("bulk: moved " + std::to_string(moved) + " of " + std::to_string(o.bytes) + " bytes");
  double seconds = static_cast<double>(t1 - t0) / 1e9;
  std::printf(
      "{\"mode\": \"bulk\", \"via\": \"%s\", \"direction\": \"%s\", \"bytes\": %llu, \"seconds\": "
      "%.4f, \"gb_per_s\": %.4f, \"client_cpu_s\": %.3f}\n",
      e.via_proxy ? "proxy" : "direct", o.direction.c_str(),
      static_cast<unsigned long long>(o.bytes), seconds,
      static_cast<double>(o.bytes) / seconds / 1e9, cpu);
  return 0;
}

// One attempt of poll: "allow", "deny" or "error:...".
std::string attempt(const Endpoint& e) {
  Conn c = open_conn(e);
  std::string outcome;
  if (c.status == 200) {
    char byte = 0;
    outcome = write_all(c.fd, "E", 1) && ::read(c.fd, &byte, 1) == 1 && byte == 'E'
                  ? "allow"
                  : "error:no echo";
  } else if (c.status == 403) {
    outcome = "deny";
  } else {
    outcome = "error:" + c.error;
  }
  if (c.fd >= 0) ::close(c.fd);
  return outcome;
}

int run_poll(const ClientOptions& o) {
  std::string state;
  uint64_t changes = 0, attempts = 0, since_change = 0;
  int64_t prev_start = 0;
  const int64_t deadline = now_ns() + static_cast<int64_t>(o.timeout_s) * 1'000'000'000;
  timespec next{};
  ::clock_gettime(CLOCK_MONOTONIC, &next);
  while (true) {
    int64_t start = now_ns(CLOCK_REALTIME);
    std::string outcome = attempt(o.endpoint);
    int64_t end = now_ns(CLOCK_REALTIME);
    ++attempts;
    ++since_change;
    if (outcome != state) {
      if (!state.empty()) ++changes;
      std::printf(
          "{\"mode\": \"poll\", \"state\": %s, \"change\": %llu, \"start_ns\": %lld, \"end_ns\": "
          "%lld, \"previous_start_ns\": %lld, \"attempts\": %llu, \"attempts_since_change\": "
          "%llu}\n",
          json_string(outcome).c_str(), static_cast<unsigned long long>(changes),
          static_cast<long long>(start), static_cast<long long>(end),
          static_cast<long long>(prev_start), static_cast<unsigned long long>(attempts),
          static_cast<unsigned long long>(since_change));
      std::fflush(stdout);
      state = outcome;
      since_change = 0;
      if (changes >= o.changes && o.changes > 0) return 0;
    }
    prev_start = start;
    if (now_ns() > deadline) {
      std::fprintf(stderr, "egress_bench: poll: %llu changes after %llu s; stopping\n",
                   static_cast<unsigned long long>(changes),
                   static_cast<unsigned long long>(o.timeout_s));
      return 1;
    }
    // The next attempt at the next tick; no bursts to catch up.
    int64_t next_ns = static_cast<int64_t>(next.tv_sec) * 1'000'000'000 + next.tv_nsec +
                      static_cast<int64_t>(o.interval_us) * 1000;
    int64_t now = now_ns();
    if (next_ns < now) next_ns = now;
    next.tv_sec = next_ns / 1'000'000'000;
    next.tv_nsec = next_ns % 1'000'000'000;
    while (::clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &next, nullptr) == EINTR) {
    }
  }
}

// ---- HTTPS ---------------------------------------------------------------------

// OpenSSL's first queued error, for a message ("" when there is none).
std::string ssl_error_text() {
  unsigned long code = ERR_get_error();
  ERR_clear_error();
  if (code == 0) return "";
  char text[256];
  ERR_error_string_n(code, text, sizeof text);
  return text;
}

// One TLS connection, with what was read past the last message (a head is
// read in whole records, which may hold the start of a body).
struct TlsStream {
  int fd = -1;
  SSL* ssl = nullptr;
  std::string pending;

  TlsStream() = default;
  TlsStream(const TlsStream&) = delete;
  TlsStream& operator=(const TlsStream&) = delete;
  ~TlsStream() {
    if (ssl) SSL_free(ssl);
    if (fd >= 0) ::close(fd);
  }

  bool write(const char* data, size_t size) {
    while (size > 0) {
      int n = SSL_write(ssl, data, static_cast<int>(std::min<size_t>(size, 1 << 30)));
      if (n <= 0) return false;
      data += n;
      size -= static_cast<size_t>(n);
    }
    return true;
  }

  // Some bytes (pending ones first) into out; 0 at the end or on an error.
  size_t read_some(char* out, size_t size) {
    if (!pending.empty()) {
      size_t n = std::min(size, pending.size());
      std::memcpy(out, pending.data(), n);
      pending.erase(0, n);
      return n;
    }
    int n = SSL_read(ssl, out, static_cast<int>(std::min<size_t>(size, 1 << 30)));
    return n > 0 ? static_cast<size_t>(n) : 0;
  }

  // A message's head, up to and with its blank line; "" at the end first.
  std::string read_head() {
    char buf[16384];
    size_t end;
    while ((end = pending.find("\r\n\r\n")) == std::string::npos) {
      if (pending.size() > 65536) return "";
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n <= 0) return "";
      pending.append(buf, static_cast<size_t>(n));
    }
    std::string head = pending.substr(0, end + 4);
    pending.erase(0, end + 4);
    return head;
  }

  // One line, without its CRLF; false at the end first.
  bool read_line(std::string& line) {
    char buf[4096];
    size_t end;
    while ((end = pending.find("\r\n")) == std::string::npos) {
      if (pending.size() > 65536) return false;
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n <= 0) return false;
      pending.append(buf, static_cast<size_t>(n));
    }
    line = pending.substr(0, end);
    pending.erase(0, end + 2);
    return true;
  }

  // Reads and drops n bytes; false when the stream ends first.
  bool skip(uint64_t n, std::vector<char>& scratch) {
    while (n > 0) {
      size_t got =
          read_some(scratch.data(), static_cast<size_t>(std::min<uint64_t>(n, scratch.size())));
      if (got == 0) return false;
      n -= got;
    }
    return true;
  }
};

// The value of header `name` (any case) in a head, or "" when absent.
std::string header_value(const std::string& head, const std::string& name) {
  size_t at = head.find("\r\n");
  while (at != std::string::npos && at + 2 < head.size()) {
    size_t line = at + 2, next = head.find("\r\n", line);
    if (next == std::string::npos || next == line) break;
    size_t colon = head.find(':', line);
    if (colon != std::string::npos && colon < next && colon - line == name.size() &&
        strncasecmp(head.data() + line, name.data(), name.size()) == 0) {
      size_t v = colon + 1;
      while (v < next && (head[v] == ' ' || head[v] == '\t')) ++v;
      return head.substr(v, next - v);
    }
    at = next;
  }
  return "";
}

// ---- HTTPS server ----

constexpr const char kSmallBody[] = "small\n";

void serve_https(int fd, SSL_CTX* ctx) {
  TlsStream s;
  s.fd = fd;
  // A connection that stalls (a client gone without closing) does not keep
  // its thread for ever.
  timeval idle{60, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &idle, sizeof idle);
  s.ssl = SSL_new(ctx);
  if (!s.ssl || SSL_set_fd(s.ssl, fd) != 1 || SSL_accept(s.ssl) != 1) return;
  std::vector<char> buf(1 << 20, 'x');
  while (true) {
    std::string head = s.read_head();
    if (head.empty()) break;
    // A body sent with the request is read and dropped.
    std::string length = header_value(head, "Content-Length");
    if (!length.empty() && !s.skip(std::strtoull(length.c_str(), nullptr, 10), buf)) break;
    bool close = strcasecmp(header_value(head, "Connection").c_str(), "close") == 0;
    std::string target = head.substr(0, head.find("\r\n"));
    std::string status = "200 OK";
    uint64_t n = 0;
    const char* small = nullptr;
    if (target.compare(0, 11, "GET /small ") == 0) {
      small = kSmallBody;
      n = sizeof kSmallBody - 1;
    } else if (target.compare(0, 13, "GET /bytes?n=") == 0) {
      char* end = nullptr;
      n = std::strtoull(target.c_str() + 13, &end, 10);
      if (*end != ' ') status = "400 Bad Request", n = 0;
    } else {
      status = "404 Not Found";
    }
    std::string answer = "HTTP/1.1 " + status + "\r\nContent-Length: " + std::to_string(n) +
                         "\r\nContent-Type: application/octet-stream\r\n" +
                         (close ? "Connection: close\r\n" : "") + "\r\n";
    // A small answer in one record; a large body in 1 MiB writes after the head.
    if (small) answer.append(small, n), n = 0;
    if (!s.write(answer.data(), answer.size())) break;
    while (n > 0) {
      size_t chunk = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
      if (!s.write(buf.data(), chunk)) return;
      n -= chunk;
    }
    if (close) break;
  }
  SSL_shutdown(s.ssl);
}

int run_https_server(int argc, char** argv) {
  uint16_t port = 0;
  std::string port_file, ca_out;
  server_args(argc, argv, "https-server", &port, &port_file, &ca_out);
  if (ca_out.empty()) usage_error("https-server needs --ca-out FILE");
  // The server's own CA and its leaf for 127.0.0.1, made as a sandbox's
  // proxy makes its own (the same code), so that the two handshakes of an
  // inspected connection cost alike; TLS 1.3 only.
  std::shared_ptr<SSL_CTX> ctx;
  std::unique_ptr<openshell::egress::tls::SandboxCa> ca;
  try {
    ca = std::make_unique<openshell::egress::tls::SandboxCa>("egress-bench server");
    ctx = ca->leaf_for("127.0.0.1");
  } catch (const std::exception& e) {
    die(std::string("https-server: the certificates: ") + e.what());
  }
  if (SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION) != 1)
    die("https-server: TLS 1.3: " + ssl_error_text());
  {
    std::string tmp = ca_out + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    if (!f) die_errno(tmp);
    std::fputs(ca->cert_pem().c_str(), f);
    if (std::fclose(f) != 0 || std::rename(tmp.c_str(), ca_out.c_str()) != 0) die_errno(ca_out);
  }
  accept_loop(listen_loopback(port, port_file),
              [&](int fd) { std::thread(serve_https, fd, ctx.get()).detach(); });
}

// ---- HTTPS clients ----

struct SslCtxDeleter {
  void operator()(SSL_CTX* ctx) const { SSL_CTX_free(ctx); }
};
using ClientCtx = std::unique_ptr<SSL_CTX, SslCtxDeleter>;

ClientCtx client_context(const std::string& ca_file) {
  ClientCtx ctx(SSL_CTX_new(TLS_client_method()));
  if (!ctx) die("SSL_CTX_new: " + ssl_error_text());
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_3_VERSION);
  if (SSL_CTX_load_verify_locations(ctx.get(), ca_file.c_str(), nullptr) != 1)
    die("--ca " + ca_file + ": " + ssl_error_text());
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  // No session kept: every new connection is a full handshake.
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  static const unsigned char alpn[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
  SSL_CTX_set_alpn_protos(ctx.get(), alpn, sizeof alpn);
  return ctx;
}

// Opens the connection (and tunnel), then TLS. Times (CLOCK_MONOTONIC), when
// asked: the tunnel ready, the handshake done. Dies on any failure.
void open_tls(const Endpoint& e, SSL_CTX* ctx, TlsStream& s, int64_t* tunnel_done = nullptr,
              int64_t* handshake_done = nullptr) {
  Conn c = open_conn(e, tunnel_done);
  s.fd = c.fd;
  if (c.status != 200) die("tunnel to " + e.target.text() + ": " + c.error);
  s.ssl = SSL_new(ctx);
  if (!s.ssl || SSL_set_fd(s.ssl, s.fd) != 1) die("SSL_new: " + ssl_error_text());
  in_addr ip{};
  if (::inet_pton(AF_INET, e.target.host.c_str(), &ip) == 1) {
    // An address: no SNI, the certificate checked for the address.
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s.ssl), e.target.host.c_str());
  } else {
    SSL_set_tlsext_host_name(s.ssl, e.target.host.c_str());
    SSL_set1_host(s.ssl, e.target.host.c_str());
  }
  if (SSL_connect(s.ssl) != 1) {
    long verify = SSL_get_verify_result(s.ssl);
    std::string why =
        verify != X509_V_OK ? X509_verify_cert_error_string(verify) : ssl_error_text();
    die("TLS with " + e.target.text() + (e.via_proxy ? " (through the proxy)" : "") + ": " +
        (why.empty() ? "the peer closed the connection" : why));
  }
  if (handshake_done) *handshake_done = now_ns();
}

// GET target on s; dies unless the answer is 200 with a Content-Length or a
// chunked body.
// Returns the body's size (read and dropped).
uint64_t https_get(TlsStream& s, const std::string& host, const std::string& target,
                   std::vector<char>& scratch) {
  std::string request = "GET " + target + " HTTP/1.1\r\nHost: " + host +
                        "\r\nUser-Agent: egress_bench\r\nAccept: */*\r\n\r\n";
  if (!s.write(request.data(), request.size())) die("GET " + target + ": " + ssl_error_text());
  std::string head = s.read_head();
  if (head.empty()) die("GET " + target + ": the connection ended before an answer");
  int status = head.compare(0, 9, "HTTP/1.1 ") == 0 ? std::atoi(head.c_str() + 9) : 0;
  std::string length = header_value(head, "Content-Length");
  if (status != 200) {
    // The body (a proxy's JSON refusal) says why.
    std::string body = s.pending.substr(0, 400);
    die("GET " + target + ": " + head.substr(0, head.find("\r\n")) + " " + body);
  }
  if (strcasecmp(header_value(head, "Transfer-Encoding").c_str(), "chunked") == 0) {
    // The server sends a Content-Length; a proxy in between may send the
    // body chunked instead, which is read the same (chunks, then trailers).
    uint64_t total = 0;
    std::string line;
    while (true) {
      if (!s.read_line(line)) die("GET " + target + ": the chunked body ended early");
      uint64_t size = std::strtoull(line.c_str(), nullptr, 16);
      if (size == 0) break;
      if (!s.skip(size + 2, scratch)) die("GET " + target + ": the chunked body ended early");
      total += size;
    }
    do {
      if (!s.read_line(line)) die("GET " + target + ": the chunked body ended early");
    } while (!line.empty());
    return total;
  }
  if (length.empty()) die("GET " + target + ": the answer has no Content-Length");
  uint64_t n = std::strtoull(length.c_str(), nullptr, 10);
  if (!s.skip(n, scratch)) die("GET " + target + ": the body ended early");
  return n;
}

std::string tenths_medians(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t k = 0; k < 10; ++k) {
    size_t from = v.size() * k / 10, to = v.size() * (k + 1) / 10;
    if (to <= from) continue;
    std::vector<double> part(v.begin() + static_cast<long>(from),
                             v.begin() + static_cast<long>(to));
    char num[32];
    std::snprintf(num, sizeof num, "%s%.2f", out.size() > 1 ? ", " : "", stats_of(part).median);
    out += num;
  }
  return out + "]";
}

std::string samples_json(const char* key, const std::vector<double>& v) {
  std::string out = std::string(", \"") + key + "_samples_us\": [";
  for (size_t k = 0; k < v.size(); ++k) {
    char num[32];
    std::snprintf(num, sizeof num, "%s%.2f", k ? ", " : "", v[k]);
    out += num;
  }
  return out + "]";
}

int run_tls_requests(const ClientOptions& o) {
  const Endpoint& e = o.endpoint;
  ClientCtx ctx = client_context(o.ca_file);
  TlsStream s;
  open_tls(e, ctx.get(), s);
  std::vector<char> scratch(1 << 16);
  std::vector<double> request;
  request.reserve(o.count);
  double cpu0 = 0;
  int64_t wall0 = 0;
  for (uint64_t i = 0; i < o.warmup + o.count; ++i) {
    if (i == o.warmup) cpu0 = cpu_seconds(), wall0 = now_ns();
    int64_t t0 = now_ns();
    https_get(s, e.target.text(), "/small", scratch);
    int64_t t1 = now_ns();
    if (i >= o.warmup) request.push_back(static_cast<double>(t1 - t0) / 1e3);
  }
  double wall = static_cast<double>(now_ns() - wall0) / 1e9;
  double cpu = cpu_seconds() - cpu0;
  SSL_shutdown(s.ssl);
  std::printf(
      "{\"mode\": \"tls-requests\", \"via\": \"%s\", \"target\": %s, \"count\": %llu, "
      "\"warmup\": %llu, \"request_us\": %s, \"tenths_median_us\": %s, \"wall_s\": %.3f, "
      "\"client_cpu_s\": %.3f%s}\n",
      e.via_proxy ? "proxy" : "direct", json_string(e.target.text()).c_str(),
      static_cast<unsigned long long>(o.count), static_cast<unsigned long long>(o.warmup),
      json_stats(stats_of(request)).c_str(), tenths_medians(request).c_str(), wall, cpu,
      o.samples ? samples_json("request", request).c_str() : "");
  return 0;
}

int run_tls_connections(const ClientOptions& o) {
  const Endpoint& e = o.endpoint;
  ClientCtx ctx = client_context(o.ca_file);
  std::vector<char> scratch(1 << 16);
  std::vector<double> total, tunnel, handshake, request;
  double cpu0 = 0;
  int64_t wall0 = 0;
  for (uint64_t i = 0; i < o.warmup + o.count; ++i) {
    if (i == o.warmup) cpu0 = cpu_seconds(), wall0 = now_ns();
    int64_t t0 = now_ns(), t1 = 0, t2 = 0;
    TlsStream s;
    open_tls(e, ctx.get(), s, &t1, &t2);
    https_get(s, e.target.text(), "/small", scratch);
    int64_t t3 = now_ns();
    SSL_shutdown(s.ssl);
    if (i < o.warmup) continue;
    total.push_back(static_cast<double>(t3 - t0) / 1e3);
    tunnel.push_back(static_cast<double>(t1 - t0) / 1e3);
    handshake.push_back(static_cast<double>(t2 - t1) / 1e3);
    request.push_back(static_cast<double>(t3 - t2) / 1e3);
  }
  double wall = static_cast<double>(now_ns() - wall0) / 1e9;
  double cpu = cpu_seconds() - cpu0;
  std::string samples;
  if (o.samples) samples = samples_json("total", total) + samples_json("handshake", handshake);
  std::printf(
      "{\"mode\": \"tls-connections\", \"via\": \"%s\", \"target\": %s, \"count\": %llu, "
      "\"warmup\": %llu, \"total_us\": %s, \"tunnel_us\": %s, \"handshake_us\": %s, "
      "\"request_us\": %s, \"tenths_median_us\": %s, \"wall_s\": %.3f, \"client_cpu_s\": "
      "%.3f%s}\n",
      e.via_proxy ? "proxy" : "direct", json_string(e.target.text()).c_str(),
      static_cast<unsigned long long>(o.count), static_cast<unsigned long long>(o.warmup),
      json_stats(stats_of(total)).c_str(), json_stats(stats_of(tunnel)).c_str(),
      json_stats(stats_of(handshake)).c_str(), json_stats(stats_of(request)).c_str(),
      tenths_medians(total).c_str(), wall, cpu, samples.c_str());
  return 0;
}

int run_tls_bulk(const ClientOptions& o) {
  const Endpoint& e = o.endpoint;
  ClientCtx ctx = client_context(o.ca_file);
  TlsStream s;
  open_tls(e, ctx.get(), s);
  std::vector<char> scratch(1 << 20);
  https_get(s, e.target.text(), "/small", scratch);  // the connection fully set up first
  double cpu0 = cpu_seconds();
  int64_t t0 = now_ns();
  uint64_t got = https_get(s, e.target.text(), "/bytes?n=" + std::to_string(o.bytes), scratch);
  int64_t t1 = now_ns();
  double cpu = cpu_seconds() - cpu0;
  SSL_shutdown(s.ssl);
  if (got != o.bytes)
    die("tls-bulk: " + std::to_string(got) + " bytes, not " + std::to_string(o.bytes));
  double seconds = static_cast<double>(t1 - t0) / 1e9;
  std::printf(
      "{\"mode\": \"tls-bulk\", \"via\": \"%s\", \"direction\": \"down\", \"bytes\": %llu, "
      "\"seconds\": %.4f, \"gb_per_s\": %.4f, \"client_cpu_s\": %.3f}\n",
      e.via_proxy ? "proxy" : "direct", static_cast<unsigned long long>(o.bytes), seconds,
      static_cast<double>(o.bytes) / seconds / 1e9, cpu);
  return 0;
}

// ---- stamp --------------------------------------------------------------------

int run_stamp(int argc, char** argv) {
  if (argc < 2 || std::string(argv[0]) != "--") usage_error("stamp needs -- CMD [ARG...]");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  int64_t start = now_ns(CLOCK_REALTIME);
  pid_t pid = 0;
  int rc = ::posix_spawnp(&pid, argv[1], &actions, nullptr, argv + 1, environ);
  if (rc != 0) die(std::string(argv[1]) + ": " + std::strerror(rc));
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  int64_t end = now_ns(CLOCK_REALTIME);
  int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::printf("{\"start_ns\": %lld, \"end_ns\": %lld, \"status\": %d}\n",
              static_cast<long long>(start), static_cast<long long>(end), code);
  return code == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage_error("no mode given");
  std::string mode = argv[1];
  if (mode == "-h" || mode == "--help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  std::signal(SIGPIPE, SIG_IGN);
  if (mode == "server") return run_server(argc - 2, argv + 2);
  if (mode == "stamp") return run_stamp(argc - 2, argv + 2);
  if (mode == "https-server") return run_https_server(argc - 2, argv + 2);
  if (mode == "latency" || mode == "bulk" || mode == "poll" || mode == "tls-requests" ||
      mode == "tls-connections" || mode == "tls-bulk") {
    ClientOptions o = parse_client(mode, argc - 2, argv + 2);
    if (mode == "latency") return run_latency(o);
    if (mode == "bulk") return run_bulk(o);
    if (mode == "tls-requests") return run_tls_requests(o);
    if (mode == "tls-connections") return run_tls_connections(o);
    if (mode == "tls-bulk") return run_tls_bulk(o);
    return run_poll(o);
  }
  usage_error("unknown mode '" + mode + "'");
}
