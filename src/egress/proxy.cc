#include "egress/proxy.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include "base/json_text.h"
#include "base/log.h"
#include "base/text.h"
#include "base/time.h"
#include "egress/connect_watch.h"
#include "egress/credentials.h"
#include "egress/http_session.h"
#include "egress/identity.h"
#include "egress/identity_line.h"
#include "egress/local_names.h"
#include "egress/tls.h"

namespace openshell::egress {

namespace asio = boost::asio;
namespace dns = net::dns;
using asio::ip::tcp;
using asio::ip::udp;
using nlohmann::json;

namespace {

// A client's end of a connection to the proxy: TCP when accepted on the
// listener, a Unix stream socket when a micro-VM's vsock brought it.
using ClientSocket = asio::generic::stream_protocol::socket;

// Who a connection's caller is: found by the identity search (an accepted
// TCP connection), known already (kGiven), or named by the connection's
// first line (kLine: a guest's, identity_line.h).
enum class Identity { kSearch, kGiven, kLine };

// What one connection may cost the proxy (see docs/policy.md for the
// budget): a request head of at most kMaxHead, a response head of at most
// kMaxResponseHead read kResponseChunk at a time, and relay buffers only
// where splice() cannot move a tunnel's bytes.
constexpr size_t kMaxHead = 16 * 1024;
constexpr size_t kMaxResponseHead = 64 * 1024;
constexpr size_t kResponseChunk = 16 * 1024;
constexpr size_t kRelayBuffer = 64 * 1024;
// Memory goes back to the system after this many connections close.
constexpr uint64_t kTrimAfter = 128;
constexpr size_t kSpliceChunk = 1 << 20;  // bytes moved per splice() into the pipe
constexpr int kSpliceRounds = 32;         // splices before the relay yields to other work

// A pipe between two sockets: splice() moves a tunnel's bytes through it
// inside the kernel, without copying them through the proxy.
struct SplicePipe {
  UniqueFd read_end, write_end;
  size_t held = 0;  // bytes in the pipe, not yet passed on
  bool moved = false;
};
constexpr auto kConnectTimeout = std::chrono::seconds(10);
constexpr uint32_t kDnsTtl = 30;
// A guest's DNS streams: how many at once, the longest query (as a datagram
// the UDP stub reads), and the queries one stream may have in hand.
constexpr size_t kMaxDnsStreams = 16;
constexpr size_t kMaxDnsQuery = 1500;
constexpr size_t kMaxDnsPending = 64;
// Longest fields of an audit line: a DNS name has at most 253 characters, a
// path PATH_MAX bytes; a reason quotes a host.
constexpr size_t kMaxAuditHost = 256;
constexpr size_t kMaxAuditPath = 4096;
constexpr size_t kMaxAuditReason = 1024;

std::string qtype_name(uint16_t qtype) {
  return qtype == dns::kTypeA ? "A" : qtype == dns::kTypeAAAA ? "AAAA" : std::to_string(qtype);
}

using text::lower;

// "host:port", "[v6]:port", "host" (default port).
bool split_authority(std::string_view authority, uint16_t default_port, std::string* host,
                     uint16_t* port) {
  std::string_view h = authority, p;
  if (!authority.empty() && authority.front() == '[') {
    auto close = authority.find(']');
    if (close == std::string_view::npos) return false;
    h = authority.substr(1, close - 1);
    std::string_view rest = authority.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return false;
      p = rest.substr(1);
    }
  } else if (auto colon = authority.rfind(':'); colon != std::string_view::npos) {
    h = authority.substr(0, colon);
    p = authority.substr(colon + 1);
  }
  if (h.empty()) return false;
  *host = lower(h);
  if (p.empty()) {
    *port = default_port;
    return default_port != 0;
  }
  auto value = text::parse_uint(p, 65535);
  if (!value || *value == 0) return false;
  *port = static_cast<uint16_t>(*value);
  return true;
}

// The lines of a head that ends with its empty line, without that line.
std::vector<std::string_view> head_lines(std::string_view head) {
  std::vector<std::string_view> lines;
  size_t start = 0;
  for (size_t end; (end = head.find("\r\n", start)) != std::string_view::npos; start = end + 2) {
    if (end == start) break;
    lines.push_back(head.substr(start, end - start));
  }
  return lines;
}

bool starts_with_space(std::string_view line) {
  return !line.empty() && (line[0] == ' ' || line[0] == '\t');
}

std::string field_name(std::string_view line) { return lower(line.substr(0, line.find(':'))); }

// The options of every Connection field, in lower case: "close",
// "upgrade", and the names of hop-by-hop fields.
std::vector<std::string> connection_options(const std::vector<std::string_view>& lines) {
  std::vector<std::string> options;
  for (size_t i = 1; i < lines.size(); ++i) {
    if (starts_with_space(lines[i]) || field_name(lines[i]) != "connection") continue;
    for (const auto& option : text::split(lines[i].substr(lines[i].find(':') + 1), ','))
      if (auto trimmed = text::trim(option); !trimmed.empty()) options.push_back(lower(trimmed));
  }
  return options;
}

bool contains(const std::vector<std::string>& list, std::string_view item) {
  return std::find(list.begin(), list.end(), item) != list.end();
}

// Fields that describe one connection, not the message (RFC 9110 section
// 7.6.1), and the proxy's own.
bool is_hop_by_hop(const std::string& name, const std::vector<std::string>& options) {
  return name == "connection" || name == "keep-alive" || name == "proxy-connection" ||
         name == "proxy-authorization" || contains(options, name);
}

}  // namespace

BodyEnd BodyEnd::none() { return BodyEnd(State::kDone); }

BodyEnd BodyEnd::length(uint64_t bytes) {
  return bytes == 0 ? none() : BodyEnd(State::kLength, bytes);
}

BodyEnd BodyEnd::chunked() { return BodyEnd(State::kChunkSize); }

size_t BodyEnd::feed(std::string_view bytes) {
  constexpr size_t kMaxLine = 8192;
  size_t used = 0;
  while (used < bytes.size()) {
    switch (state_) {
      case State::kDone:
      case State::kFailed:
        return used;
      case State::kLength:
      case State::kChunkData: {
        uint64_t n = std::min<uint64_t>(remaining_, bytes.size() - used);
        used += n;
        remaining_ -= n;
        if (remaining_ == 0)
          state_ = state_ == State::kLength ? State::kDone : State::kChunkDataEnd;
        break;
      }
      case State::kChunkSize:
      case State::kChunkDataEnd:
      case State::kTrailer: {
        char c = bytes[used++];
        if (c != '\n') {
          if (line_.size() >= kMaxLine) state_ = State::kFailed;
          line_ += c;
          break;
        }
        std::string_view line = line_;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (state_ == State::kChunkDataEnd) {
          state_ = line.empty() ? State::kChunkSize : State::kFailed;
        } else if (state_ == State::kTrailer) {
          if (line.empty()) state_ = State::kDone;
        } else {
          // chunk-size [ ";" extensions ]: hex digits, at most 16 of them.
          size_t digits = 0;
          uint64_t size = 0;
          for (; digits < line.size() && std::isxdigit(static_cast<unsigned char>(line[digits]));
               ++digits) {
            const char c = text::lower(line[digits]);
            size = size * 16 + static_cast<uint64_t>(c <= '9' ? c - '0' : c - 'a' + 10);
          }
          std::string_view after = text::trim(line.substr(digits));
          if (digits == 0 || digits > 16 || (!after.empty() && after[0] != ';')) {
            state_ = State::kFailed;
          } else {
            remaining_ = size;
            state_ = size == 0 ? State::kTrailer : State::kChunkData;
          }
        }
        line_.clear();
        break;
      }
    }
  }
  return used;
}

std::string origin_request(std::string_view head, OriginRequest* request) {
  std::vector<std::string_view> lines = head_lines(head);
  for (auto line : lines)
    if (line.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos)
      return "a stray CR, LF or NUL in the request head";
  auto parts = text::split(lines.empty() ? std::string_view() : lines[0], ' ');
  if (parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0) return "not an HTTP/1 request";
  const std::string& target = parts[1];
  if (lower(target.substr(0, 7)) != "http://")
    return "only http:// URLs and CONNECT go through this proxy";
  std::string rest = target.substr(7);
  size_t path_start = rest.find_first_of("/?");
  std::string authority = rest.substr(0, path_start);
  std::string path = path_start == std::string::npos ? "/" : rest.substr(path_start);
  if (path[0] == '?') path = "/" + path;
  if (!split_authority(authority, 80, &request->host, &request->port)) return "bad URL";

  std::vector<std::string> options = connection_options(lines);
  bool has_upgrade = false, has_length = false, has_coding = false;
  uint64_t length = 0;
  std::string last_coding;
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string_view line = lines[i];
    size_t colon = line.find(':');
    if (starts_with_space(line)) return "a folded header line";
    if (colon == std::string_view::npos || colon == 0 ||
        line.substr(0, colon).find_first_of(" \t") != std::string_view::npos)
      return "a malformed header field";
    std::string name = lower(line.substr(0, colon));
    std::string_view value = text::trim(line.substr(colon + 1));
    if (name == "upgrade") has_upgrade = true;
    if (name == "transfer-encoding") {
      has_coding = true;
      for (const auto& coding : text::split(value, ','))
        if (auto trimmed = text::trim(coding); !trimmed.empty()) last_coding = lower(trimmed);
    }
    if (name == "content-length") {
      for (const auto& item : text::split(value, ',')) {
        auto n = text::parse_uint(text::trim(item));
        if (!n || (has_length && *n != length)) return "a bad Content-Length";
        has_length = true;
        length = *n;
      }
    }
  }
  if (has_coding && has_length) return "both Transfer-Encoding and Content-Length";
  if (has_coding && last_coding != "chunked")
    return "a Transfer-Encoding that does not end in chunked";
  request->body = has_coding ? BodyEnd::chunked() : BodyEnd::length(length);
  request->upgrade = has_upgrade && contains(options, "upgrade");

  std::string out = parts[0] + " " + path + " " + parts[2] + "\r\n";
  out += "Host: " + authority + "\r\n";
  for (size_t i = 1; i < lines.size(); ++i) {
    std::string name = field_name(lines[i]);
    if (name == "host" || (name == "upgrade" && !request->upgrade)) continue;
    if (is_hop_by_hop(name, options) && !(name == "upgrade" && request->upgrade)) continue;
    out += std::string(lines[i]) + "\r\n";
  }
  out += request->upgrade ? "Connection: Upgrade\r\n\r\n" : "Connection: close\r\n\r\n";
  request->head = std::move(out);
  return {};
}

int response_status(std::string_view head) {
  // HTTP/1.x SP 3DIGIT
  if (head.size() < 12 || head.substr(0, 7) != "HTTP/1." || head[8] != ' ') return 0;
  int status = 0;
  for (size_t i = 9; i < 12; ++i) {
    if (head[i] < '0' || head[i] > '9') return 0;
    status = status * 10 + (head[i] - '0');
  }
  if (head.size() > 12 && head[12] != ' ' && head[12] != '\r') return 0;
  return status >= 100 ? status : 0;
}

std::string closing_response_head(std::string_view head) {
  std::vector<std::string_view> lines = head_lines(head);
  if (lines.empty()) return std::string(head);
  std::vector<std::string> options = connection_options(lines);
  std::string out = std::string(lines[0]) + "\r\n";
  bool dropping = false;  // a folded line belongs to the field before it
  for (size_t i = 1; i < lines.size(); ++i) {
    if (!starts_with_space(lines[i])) dropping = is_hop_by_hop(field_name(lines[i]), options);
    if (!dropping) out += std::string(lines[i]) + "\r\n";
  }
  return out + "Connection: close\r\n\r\n";
}

// Finds callers off the proxy's thread: a search of the sandbox's processes
// takes milliseconds when they are many, and the proxy's other connections
// and the DNS stub go on meanwhile. One thread, jobs in order; the finder is
// used on it alone. The thread starts with the first job: an idle
// sandbox's supervisor (a thousand of them on a host) keeps no thread, no
// stack, for a search it never asks for.
class Proxy::IdentityWorker {
 public:
  explicit IdentityWorker(std::unique_ptr<CallerFinder> finder) : finder_(std::move(finder)) {}
  ~IdentityWorker() { stop(); }

  bool uses_sock_diag() const { return finder_->uses_sock_diag(); }

  // False once stopped: the job does not run.
  bool submit(std::function<void(CallerFinder&)> job) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return false;
    if (!thread_.joinable()) {
      // The thread takes no signals: they are the process's main loop's.
      sigset_t all, saved;
      sigfillset(&all);
      ::pthread_sigmask(SIG_BLOCK, &all, &saved);
      thread_ = std::thread([this] { loop(); });
      ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
    }
    jobs_.push_back(std::move(job));
    wake_.notify_one();
    return true;
  }

  // Waits for the job that runs; the others are dropped here, not on the thread.
  void stop() {
    std::deque<std::function<void(CallerFinder&)>> dropped;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
      dropped.swap(jobs_);
      wake_.notify_one();
    }
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void(CallerFinder&)> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [this] { return stopping_ || !jobs_.empty(); });
        if (stopping_) return;
        job = std::move(jobs_.front());
        jobs_.pop_front();
      }
      job(*finder_);
    }
  }

  std::unique_ptr<CallerFinder> finder_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void(CallerFinder&)>> jobs_;
  bool stopping_ = false;
  std::thread thread_;
};

struct Proxy::Impl : std::enable_shared_from_this<Impl> {
  asio::io_context& io;
  Options options;
  dns::Resolver resolver;
  std::shared_ptr<const NetworkRules> rules = std::make_shared<NetworkRules>();
  std::shared_ptr<IdentityWorker> worker;  // from serve() on
  // Who connected each socket (connect_watch.h): null when that is not seen.
  std::shared_ptr<ConnectLog> connects;
  tcp::acceptor acceptor;
  udp::socket dns;
  size_t open_connections = 0;  // held against options.max_connections
  bool closed = false;
  uint64_t closed_since_trim = 0;
  // The connections with a server: each is asked, when the policy changes,
  // whether the new one still allows it.
  uint64_t next_id = 0;
  int64_t revision = 0;  // of the rules
  std::map<uint64_t, std::function<void(int64_t revision)>> established;
  // What inspected requests carry filled in (set_credentials()), once for
  // each of where an endpoint lets them be filled: [query + 2 * body].
  std::array<std::shared_ptr<const Credentials>, 4> credentials = {
      std::make_shared<Credentials>(), std::make_shared<Credentials>(),
      std::make_shared<Credentials>(), std::make_shared<Credentials>()};
  // The client contexts of inspected connections upstream, by the extra CA
  // file they trust ("" for none): each reads the host's CA store once.
  std::map<std::string, std::shared_ptr<SSL_CTX>> upstream_contexts;

  std::shared_ptr<SSL_CTX> upstream_context(const std::string& ca_file) {
    auto it = upstream_contexts.find(ca_file);
    if (it != upstream_contexts.end()) return it->second;
    std::shared_ptr<SSL_CTX> ctx(tls::upstream_context(ca_file).release(), tls::SslCtxFree{});
    upstream_contexts.emplace(ca_file, ctx);
    return ctx;
  }

  // Whether callers are identified: sock_diag makes it cheap, and a rule
  // that names binaries makes it needed.
  bool identifies() const {
    return worker && (worker->uses_sock_diag() || rules->names_binaries());
  }

  void connection_closed() {
    --open_connections;
    // A burst of connections leaves free memory in the heap: give it back.
    if (++closed_since_trim >= kTrimAfter || open_connections == 0) {
      if (closed_since_trim > 1) ::malloc_trim(0);
      closed_since_trim = 0;
    }
  }

  // Accepted beyond the limit: told so, and closed.
  void refuse_over_limit(ClientSocket client) {
    if (options.audit) {
      json line = {{"time", time::format_ns(time::now_ns())},
                   {"sandbox", options.sandbox},
                   {"kind", "connect"},
                   {"binary", ""},
                   {"pid", 0},
                   {"host", ""},
                   {"port", 0},
                   {"decision", "deny"},
                   {"rule", ""},
                   {"reason", "too many connections to the proxy (the limit is " +
                                  std::to_string(options.max_connections) + ")"}};
      write_audit(line);
    }
    auto socket = std::make_shared<ClientSocket>(std::move(client));
    const std::string body = "openshell: too many connections to the proxy (the limit is " +
                             std::to_string(options.max_connections) + ")\n";
    auto data = std::make_shared<std::string>(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    asio::async_write(*socket, asio::buffer(*data),
                      [socket, data](const boost::system::error_code&, size_t) {
                        boost::system::error_code ignored;
                        socket->shutdown(asio::socket_base::shutdown_send, ignored);
                        socket->close(ignored);
                      });
  }

  Impl(asio::io_context& io_, Options o, dns::ResolverConfig config)
      : io(io_), options(std::move(o)), resolver(io_, std::move(config)), acceptor(io_), dns(io_) {}

  // The audit is written in the middle of a connection's decision: nothing
  // in it may throw into the connection (which would then hang, unanswered,
  // until its timer).
  void write_audit(const json& line) {
    try {
      options.audit(json_text(line));
    } catch (const std::exception& e) {
      log::error(std::string("egress audit: a line is lost: ") + e.what());
    }
  }

  // `decision` names another outcome than allow or deny ("closed").
  void audit(const std::string& kind, const Caller& caller, const std::string& host, uint16_t port,
             bool allowed, const std::string& rule, const std::string& reason,
             const std::string& address = {}, const char* decision = nullptr,
             const std::string* method = nullptr, const std::string* path = nullptr) {
    if (!options.audit) return;
    // The sandbox chooses the host (up to a whole request head) and the
    // binary's path, in any bytes: each is clipped, and written as UTF-8.
    json line = {{"time", time::format_ns(time::now_ns())},
                 {"sandbox", options.sandbox},
                 {"kind", kind},
                 {"binary", clip(caller.exe, kMaxAuditPath)},
                 {"pid", caller.pid},
                 {"host", clip(host, kMaxAuditHost)},
                 {"port", port},
                 {"decision", decision  ? decision
                              : allowed ? "allow"
                                        : "deny"},
                 {"rule", rule},
                 {"reason", clip(reason, kMaxAuditReason)}};
    if (!address.empty()) line["address"] = address;
    // A request judged at layer 7: its method and normalized path (never
    // its query, whose values may be secrets).
    if (method) line["method"] = clip(*method, kMaxAuditHost);
    if (path) line["path"] = clip(*path, kMaxAuditPath);
    write_audit(line);
  }

  // A query of the DNS stub for a name some rule names: where its answer
  // came from (local, cached, upstream) and how many addresses it got.
  void audit_dns(const std::string& name, uint16_t qtype, const char* decision, size_t answers,
                 const std::string& reason) {
    if (options.audit) write_audit(dns_line(name, qtype, decision, answers, reason));
  }
  json dns_line(const std::string& name, uint16_t qtype, const char* decision, size_t answers,
                const std::string& reason) const {
    return {{"time", time::format_ns(time::now_ns())},
            {"sandbox", options.sandbox},
            {"kind", "dns"},
            {"binary", ""},
            {"pid", 0},
            {"host", clip(name, kMaxAuditHost)},
            {"port", 0},
            {"qtype", qtype_name(qtype)},
            {"decision", decision},
            {"answers", answers},
            {"rule", ""},
            {"reason", clip(reason, kMaxAuditReason)}};
  }

  // Queries refused by the resolver's rate limit: one line a second at
  // most, counting the refusals since the last, so that a flood of queries
  // cannot flood the log too.
  void audit_rate_limited(const std::string& name, uint16_t qtype, const std::string& reason) {
    ++rate_limited_unlogged;
    auto now = std::chrono::steady_clock::now();
    if (rate_limited_logged && now - *rate_limited_logged < std::chrono::seconds(1)) return;
    rate_limited_logged = now;
    if (!options.audit) return;
    json line = dns_line(name, qtype, "rate_limited", 0, reason);
    line["refused"] = rate_limited_unlogged;
    rate_limited_unlogged = 0;
    write_audit(line);
  }
  std::optional<std::chrono::steady_clock::time_point> rate_limited_logged;
  uint64_t rate_limited_unlogged = 0;

  void accept();
  void serve_dns();
  // Answers one DNS message as the stub does (policy, audit): reply gets
  // the answer once, now or later; false, and never called, when the
  // message is not a query the stub answers (it is dropped).
  bool answer_dns(std::string_view message, std::function<void(std::string)> reply);
  // A connection whose caller is known or comes in its first line.
  void serve_client(ClientSocket client, Identity identity, Caller caller);

  // The DNS streams open (a guest's), each closed when the proxy closes.
  std::map<uint64_t, std::function<void()>> dns_streams;
  uint64_t next_dns_stream = 0;
};

namespace {

// One connection to the proxy: a CONNECT tunnel, or one plain-HTTP request.
class Connection : public std::enable_shared_from_this<Connection>, public HttpSessionOwner {
 public:
  Connection(std::shared_ptr<Proxy::Impl> proxy, ClientSocket client,
             Identity identity = Identity::kSearch, Caller caller = {})
      : proxy_(std::move(proxy)),
        client_(std::move(client)),
        upstream_(proxy_->io),
        timer_(proxy_->io),
        id_(++proxy_->next_id),
        identity_(identity) {
    ++proxy_->open_connections;
    if (identity_ == Identity::kGiven) given(std::move(caller));
  }
  ~Connection() {
    proxy_->established.erase(id_);
    proxy_->connection_closed();
  }

  void start() {
    auto self = shared_from_this();
    timer_.expires_after(proxy_->options.head_timeout);
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->abort();
    });
    if (identity_ == Identity::kLine) return read_identity_line();
    // Who holds the socket now, at once, where a rule names binaries: a
    // process that connects and then hands the socket to another (or execs
    // one) has held it.
    if (searches() && proxy_->worker && proxy_->rules->names_binaries()) identify(true);
    read_head();
  }

 private:
  void abort() {
    timer_.cancel();  // its wait holds the connection (and its place under the limit)
    boost::system::error_code ignored;
    client_.close(ignored);
    upstream_.close(ignored);
  }

  bool searches() const { return identity_ == Identity::kSearch; }

  // The caller as the guest (or whoever made the connection) named it: the
  // one holder there is, credited as the crediting rules of its line say.
  void given(Caller caller) { at_request_.processes.push_back(std::move(caller)); }

  // A guest's connection: its identity line, then the request, whose first
  // bytes may have come in the same read as the line.
  void read_identity_line() {
    auto self = shared_from_this();
    client_.async_read_some(asio::buffer(buffer_), [self](const boost::system::error_code& ec,
                                                          size_t n) {
      if (ec) return self->abort();
      self->head_.append(self->buffer_.data(), n);
      size_t end = self->head_.find('\n');
      if (end == std::string::npos && self->head_.size() < kMaxIdentityLine)
        return self->read_identity_line();
      std::string why = "no newline in its first " + std::to_string(kMaxIdentityLine) + " bytes";
      std::optional<Caller> caller;
      if (end != std::string::npos && end < kMaxIdentityLine)
        caller = parse_identity_line(std::string_view(self->head_).substr(0, end), &why);
      if (!caller) {
        // Fail closed: no one is credited with what follows, and it goes nowhere.
        self->proxy_->audit("connect", Caller{}, "", 0, false, "",
                            "the guest's identity line is malformed: " + why);
        return self->refuse(400, "Bad Request", "a malformed identity line: " + why);
      }
      self->head_.erase(0, end + 1);
      self->given(std::move(*caller));
      self->read_head();
    });
  }

  // The request head: from what was read already, else read on.
  void read_head() {
    size_t end = head_.find("\r\n\r\n");
    // The limit holds however the head arrived: also one whose end came
    // in the same read as its 16 KiB and first byte more.
    if ((end == std::string::npos ? head_.size() : end + 4) > kMaxHead)
      return refuse(431, "Request Header Fields Too Large",
                    "a request head longer than " + std::to_string(kMaxHead) + " bytes");
    if (end != std::string::npos) {
      rest_ = head_.substr(end + 4);
      head_.resize(end + 4);
      return handle_head();
    }
    auto self = shared_from_this();
    client_.async_read_some(asio::buffer(buffer_),
                            [self](const boost::system::error_code& ec, size_t n) {
                              if (ec) return self->abort();
                              self->head_.append(self->buffer_.data(), n);
                              self->read_head();
                            });
  }

  void handle_head() {
    // METHOD SP TARGET SP VERSION
    auto parts = text::split(head_.substr(0, head_.find("\r\n")), ' ');
    if (parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0)
      return refuse(400, "Bad Request", "not an HTTP/1 request");
    if (parts[0] == "CONNECT") {
      connect_ = true;
      if (!split_authority(parts[1], 0, &host_, &port_))
        return refuse(400, "Bad Request", "CONNECT needs host:port");
    } else {
      if (auto why = origin_request(head_, &request_); !why.empty())
        return refuse(400, "Bad Request", why);
      host_ = request_.host;
      port_ = request_.port;
    }
    rules_ = proxy_->rules;
    // Who is asking, for the decision and the audit: a netlink round trip
    // and a look at the sandbox's processes, on the identity worker.
    // Without sock_diag it costs milliseconds, so it is then asked only
    // when a rule names binaries (the audit then has no binary).
    request_done_ = true;
    if (searches() && proxy_->identifies()) identify(false);
    decide();  // or, when the worker answers, then
  }

  // Asks the worker who holds the client's socket; false when it cannot.
  bool identify(bool at_accept) {
    boost::system::error_code ec, ec2;
    auto peer = client_.remote_endpoint(ec);
    auto local = client_.local_endpoint(ec2);
    if (ec || ec2 || !proxy_->worker || !is_ip(peer) || !is_ip(local)) return false;
    auto self = shared_from_this();
    asio::io_context* io = &proxy_->io;
    // The search at the request builds on the one at accept: the worker
    // takes its jobs in order, so that one is done by then, and its result
    // is read there, on the worker's thread, before the proxy's sees it.
    if (at_accept) accept_search_ = std::make_shared<Holders>();
    std::shared_ptr<Holders> earlier = accept_search_;
    const bool examine = proxy_->rules->names_binaries();
    bool submitted = proxy_->worker->submit([self, io, at_accept, earlier, examine,
                                             connects = proxy_->connects, client = end_of(peer),
                                             own = end_of(local)](CallerFinder& finder) mutable {
      Holders found;
      if (!at_accept && earlier && earlier->budget_exceeded)
        found.budget_exceeded = true;  // refused where it matters: no second search
      else
        found = finder.holders(client, own, kIdentityBudget, at_accept ? nullptr : earlier.get(),
                               examine);
      // Its record is taken by the first search that finds the socket.
      if (connects && found.inode) found.connectors = connects->take(found.inode);
      if (at_accept) *earlier = found;
      // The connection goes back to the proxy's thread, and ends there.
      asio::post(*io, [self = std::move(self), found = std::move(found), at_accept]() mutable {
        self->identified(std::move(found), at_accept);
      });
    });
    if (!submitted) return false;
    (at_accept ? accept_pending_ : request_pending_) = true;
    return true;
  }

  void identified(Holders found, bool at_accept) {
    (at_accept ? accept_pending_ : request_pending_) = false;
    (at_accept ? at_accept_ : at_request_) = std::move(found);
    if (request_done_) decide();
  }

  // Every process that held the socket, at accept or at the request: one
  // the rule does not name (or names but cannot credit) refuses it.
  void decide() {
    if (accept_pending_ || request_pending_ || decided_) return;
    decided_ = true;
    holders_ = at_accept_.processes;
    for (const auto& c : at_request_.processes) {
      bool seen = false;
      for (const auto& h : holders_)
        seen = seen || (h.pid == c.pid && h.exe == c.exe && h.untrusted == c.untrusted);
      if (!seen) holders_.push_back(c);
    }
    // Named in the audit: the newest process holding it at the request.
    if (!at_request_.processes.empty())
      caller_ = at_request_.processes.back();
    else if (!at_accept_.processes.empty())
      caller_ = at_accept_.processes.back();
    budget_exceeded_ = at_accept_.budget_exceeded || at_request_.budget_exceeded;
    // The connect watcher sees this host's processes, not a guest's.
    connects_seen_ = searches() && proxy_->connects != nullptr;
    connectors_ = at_accept_.connectors;
    connectors_.insert(connectors_.end(), at_request_.connectors.begin(),
                       at_request_.connectors.end());
    Caller blamed;
    Decision d = judge(*rules_, &blamed, &match_);
    if (!d.allowed) {
      caller_ = blamed;
      return deny(d.reason, d.rule);
    }
    inspected_ = !match_.inspect.empty();
    if (inspected_ && connect_) {
      // TLS to the endpoint is inspected with a leaf of the sandbox's CA
      // for the CONNECT's host (never another name the client may give).
      if (!proxy_->options.ca)
        return deny(host_port(host_, port_) +
                        ": its endpoint judges requests (layer 7), which needs the sandbox's own "
                        "CA, and this sandbox has none",
                    d.rule);
      try {
        leaf_ = proxy_->options.ca->leaf_for(host_);
        upstream_tls_ = proxy_->upstream_context(match_.inspect.front()->ca_file);
      } catch (const std::exception& e) {
        return deny(host_port(host_, port_) + ": " + e.what(), d.rule);
      }
    }
    resolve();
  }

  // HttpSessionOwner: each request of an inspected connection is judged by
  // the policy of the moment (the connection's endpoint may have changed).
  Judgement judge_request(std::string_view method, std::string_view target) override {
    Judgement j;
    if (rules_ != proxy_->rules) {
      Caller blamed;
      Decision d;
      if (!still_allowed(proxy_->rules, &blamed, &d)) {
        j.close = true;
        j.close_reason = "policy revision " + std::to_string(proxy_->revision) + ": " + d.reason;
        return j;
      }
    }
    if (match_.inspect.empty()) {
      j.close = true;
      j.close_reason = "policy revision " + std::to_string(proxy_->revision) + ": " +
                       host_port(host_, port_) + " is no longer judged at layer 7";
      return j;
    }
    // Any endpoint that allows the request lets it through (as any that
    // allows a connection does); else the first one's verdict says why.
    bool have = false;
    for (const auto& inspection : match_.inspect) {
      HttpVerdict v = inspection->rules.judge(method, target);
      if (!v.rule.empty()) v.rule = inspection->policy + ": " + v.rule;
      if (v.allowed && !v.audit_only) {
        j.verdict = std::move(v);
        return j;
      }
      if (!have || (v.allowed && !j.verdict.allowed)) j.verdict = std::move(v);
      have = true;
    }
    return j;
  }
  std::shared_ptr<const Credentials> credentials() override {
    // Where the connection's (first) endpoint lets them be filled in.
    const auto& first = match_.inspect.empty() ? nullptr : match_.inspect.front();
    const int places =
        first ? (first->credentials_in_query ? 1 : 0) + (first->credentials_in_body ? 2 : 0) : 0;
    return proxy_->credentials[places];
  }
  void audit_request(const std::string& method, const std::string& path, const char* decision,
                     const std::string& rule, const std::string& reason) override {
    proxy_->audit("request", caller_, host_, port_, std::string_view(decision) == "allow", rule,
                  reason, address_.to_string(), decision, &method, &path);
  }
  const std::string& sandbox_name() const override { return proxy_->options.sandbox; }

  // The decision of `rules` for this connection's holders; *blamed is the
  // holder a refusal is for.
  Decision judge(const NetworkRules& rules, Caller* blamed, Match* match) const {
    if (budget_exceeded_ && rules.names_binaries()) {
      *blamed = caller_;
      return Decision{
          false, "",
          "identity lookup budget exceeded (the sandbox has more processes and fds than " +
              std::to_string(kIdentityBudget) + " /proc entries)"};
    }
    auto credited = [](const Caller& c) { return c.untrusted.empty() ? c.exe : std::string(); };
    auto explain = [&](const Caller& c, Decision d) {
      Match ignored;
      if (!c.untrusted.empty() && rules.check(c.exe, host_, port_, &ignored).allowed)
        d.reason = c.exe + " (pid " + std::to_string(c.pid) +
                   ") is not credited as itself: " + c.untrusted;
      else if (c.pid != caller_.pid || c.exe != caller_.exe)
        d.reason += " (it holds the connection of " +
                    (caller_.exe.empty() ? "an unknown program" : caller_.exe) + ")";
      return d;
    };
    Decision d = rules.check(credited(caller_), host_, port_, match);
    if (!d.allowed) {
      *blamed = caller_;
      return explain(caller_, d);
    }
    for (const auto& c : holders_) {
      Match ignored;
      Decision other = rules.check(credited(c), host_, port_, &ignored);
      if (!other.allowed) {
        *blamed = c;
        return explain(c, other);
      }
    }
    // The process that connected, even if it held the socket when no one
    // looked (connect_watch.h).
    if (connects_seen_) {
      Match ignored;
      if (connectors_.empty()) {
        Decision other = rules.check("", host_, port_, &ignored);
        if (!other.allowed) {
          *blamed = caller_;
          other.reason = "the connecting process is unknown (not seen at connect)";
          return other;
        }
      }
      for (const auto& c : connectors_) {
        Decision other = rules.check(credited(c), host_, port_, &ignored);
        if (other.allowed) continue;
        *blamed = c;
        if (!c.untrusted.empty() && rules.check(c.exe, host_, port_, &ignored).allowed)
          other.reason = c.exe + " (pid " + std::to_string(c.pid) +
                         ") is not credited as itself when it connected: " + c.untrusted;
        else if (c.exe.empty())
          other.reason = "a process that connected is unknown" +
                         (c.untrusted.empty() ? std::string() : ": " + c.untrusted);
        else
          other.reason += " (it made the connection" +
                          (caller_.exe.empty() || (c.pid == caller_.pid && c.exe == caller_.exe)
                               ? std::string()
                               : ", which " + caller_.exe + " holds") +
                          ")";
        return other;
      }
    }
    return d;
  }

  // Whether `rules` allow this connection to address_ (then they become its
  // rules); *blamed and *why say why not.
  bool still_allowed(const std::shared_ptr<const NetworkRules>& rules, Caller* blamed,
                     Decision* why) {
    Match match;
    Decision d = judge(*rules, blamed, &match);
    if (d.allowed) {
      Decision a = rules->check_address(match, address_);
      if (!a.allowed) d = a;
    }
    if (!d.allowed) {
      *why = d;
      return false;
    }
    rules_ = rules;
    match_ = std::move(match);
    return true;
  }

  // A new policy: close this connection when it would refuse it now.
  void recheck(const std::shared_ptr<const NetworkRules>& rules, int64_t revision) {
    Caller blamed;
    Decision d;
    if (still_allowed(rules, &blamed, &d)) {
      // Rules of an inspected connection apply from its next request; one
      // that moved between layer 4 and layer 7 cannot go on as it was.
      if (inspected_ == !match_.inspect.empty()) return;
      d.rule = match_.rule;
      d.reason = host_port(host_, port_) +
                 (inspected_ ? " is no longer judged at layer 7" : " is judged at layer 7 now");
      blamed = caller_;
    }
    proxy_->established.erase(id_);
    proxy_->audit("connect", d.reason.empty() ? caller_ : blamed, host_, port_, false, d.rule,
                  "policy revision " + std::to_string(revision) + ": " + d.reason,
                  address_.to_string(), "closed");
    abort();
  }

  // Whether a client socket's address is TCP's (IPv4 or IPv6, whole).
  static bool is_ip(const asio::generic::stream_protocol::endpoint& endpoint) {
    const int family = endpoint.data()->sa_family;
    return (family == AF_INET && endpoint.size() >= sizeof(sockaddr_in)) ||
           (family == AF_INET6 && endpoint.size() >= sizeof(sockaddr_in6));
  }

  // An address is_ip() holds as a TcpEnd.
  static TcpEnd end_of(const asio::generic::stream_protocol::endpoint& endpoint) {
    TcpEnd end;
    if (endpoint.data()->sa_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(endpoint.data());
      end.port = ntohs(v4->sin_port);
      std::memcpy(end.address.bytes, &v4->sin_addr, 4);
    } else {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(endpoint.data());
      end.port = ntohs(v6->sin6_port);
      end.address.family = AF_INET6;
      std::memcpy(end.address.bytes, &v6->sin6_addr, 16);
    }
    return end;
  }

  void resolve() {
    auto self = shared_from_this();
    proxy_->resolver.resolve(host_, [self](std::vector<Address> addresses, std::string error) {
      if (!error.empty()) return self->refuse_audited(502, "Bad Gateway", error);
      std::string why = self->host_ + ": no address";
      for (const auto& a : addresses) {
        Decision d = self->rules_->check_address(self->match_, a);
        if (d.allowed)
          self->candidates_.push_back(a);
        else
          why = d.reason;
      }
      if (self->candidates_.empty()) return self->deny(why, self->match_.rule);
      self->dial(0);
    });
  }

  void dial(size_t index) {
    if (index >= candidates_.size())
      return refuse_audited(502, "Bad Gateway",
                            "cannot connect to " + host_ + ":" + std::to_string(port_));
    const Address& a = candidates_[index];
    asio::ip::address address =
        a.family == AF_INET
            ? asio::ip::address(asio::ip::address_v4(
                  asio::ip::address_v4::bytes_type{a.bytes[0], a.bytes[1], a.bytes[2], a.bytes[3]}))
            : asio::ip::address(asio::ip::address_v6([&] {
                asio::ip::address_v6::bytes_type b;
                std::copy(a.bytes, a.bytes + 16, b.begin());
                return b;
              }()));
    auto self = shared_from_this();
    timer_.expires_after(kConnectTimeout);
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) {
        boost::system::error_code ignored;
        self->upstream_.close(ignored);
      }
    });
    boost::system::error_code ignored;
    upstream_.close(ignored);
    upstream_.async_connect(tcp::endpoint(address, port_),
                            [self, index](const boost::system::error_code& ec) {
                              if (ec) return self->dial(index + 1);
                              self->timer_.cancel();
                              self->connected(self->candidates_[index]);
                            });
  }

  void connected(const Address& address) {
    address_ = address;
    // A policy that changed while the name resolved and the server answered.
    if (rules_ != proxy_->rules) {
      Caller blamed;
      Decision d;
      if (!still_allowed(proxy_->rules, &blamed, &d)) {
        boost::system::error_code ignored;
        upstream_.close(ignored);
        caller_ = blamed;
        return deny("policy revision " + std::to_string(proxy_->revision) + ": " + d.reason,
                    d.rule);
      }
    }
    proxy_->audit("connect", caller_, host_, port_, true, match_.rule, "", address.to_string());
    std::weak_ptr<Connection> weak = shared_from_this();
    proxy_->established[id_] = [weak, this](int64_t revision) {
      if (auto self = weak.lock()) recheck(proxy_->rules, revision);
    };
    boost::system::error_code ignored;
    upstream_.set_option(tcp::no_delay(true), ignored);
    client_.set_option(tcp::no_delay(true), ignored);
    auto self = shared_from_this();
    if (inspected_) return inspect();
    if (connect_) {
      auto reply = std::make_shared<std::string>("HTTP/1.1 200 Connection established\r\n\r\n");
      asio::async_write(client_, asio::buffer(*reply),
                        [self, reply](const boost::system::error_code& ec, size_t) {
                          if (ec) return self->abort();
                          self->tunnel_client();
                          self->relay(self->upstream_, self->client_, nullptr);
                        });
      return;
    }
    auto head = std::make_shared<std::string>(std::move(request_.head));
    asio::async_write(upstream_, asio::buffer(*head),
                      [self, head](const boost::system::error_code& ec, size_t) {
                        if (ec) return self->abort();
                        self->read_response();
                        self->forward_body();
                      });
  }

  // A connection to a layer-7 endpoint: its requests go through an HTTP
  // session (http_session.h), TLS inspected inside a CONNECT tunnel.
  void inspect() {
    HttpSessionOptions o;
    o.host = text::lower(host_);
    o.port = port_;
    o.head_timeout = proxy_->options.head_timeout;
    o.idle_timeout = proxy_->options.idle_timeout;
    std::shared_ptr<HttpSessionOwner> owner = shared_from_this();
    if (!connect_) {
      // The plain request, as the client sent it, is the session's one.
      o.single_request = true;
      o.initial = head_ + rest_;
      std::string().swap(rest_);
      return start_http_session(std::move(owner), client_, upstream_, std::move(o));
    }
    o.client_tls = leaf_;
    o.upstream_tls = upstream_tls_;
    o.initial = std::move(rest_);
    auto reply = std::make_shared<std::string>("HTTP/1.1 200 Connection established\r\n\r\n");
    asio::async_write(client_, asio::buffer(*reply),
                      [this, owner, reply, o = std::move(o)](const boost::system::error_code& ec,
                                                             size_t) mutable {
                        if (ec) return abort();
                        start_http_session(std::move(owner), client_, upstream_, std::move(o));
                      });
  }

  // Plain HTTP, client to server: the request's body and not a byte more.
  void forward_body() {
    size_t n = request_.body.feed(rest_);
    if (request_.body.failed()) return abort();
    auto self = shared_from_this();
    if (n > 0) {
      auto data = std::make_shared<std::string>(rest_.substr(0, n));
      rest_.erase(0, n);
      asio::async_write(
          upstream_, asio::buffer(*data),
          [self, data](const boost::system::error_code& ec, size_t) {
            if (ec)
              return self->discard();  // the server stopped reading; its response may still come
            self->forward_body();
          });
      return;
    }
    if (request_.body.done()) return request_forwarded();
    client_.async_read_some(asio::buffer(buffer_),
                            [self](const boost::system::error_code& ec, size_t n) {
                              if (ec) {
                                // A body cut short: the server sees it end, and answers or not.
                                if (ec == asio::error::eof) return self->shutdown(self->upstream_);
                                return self->abort();
                              }
                              self->rest_.append(self->buffer_.data(), n);
                              self->forward_body();
                            });
  }

  void request_forwarded() {
    request_forwarded_ = true;
    if (!request_.upgrade) return discard();
    // An upgrade: what the client sends next depends on the response.
    if (response_started_) after_response_head();
  }

  // What the client sends after its request goes nowhere: a next request
  // would have to be checked first, and the client sends it again on a new
  // connection once this one closes. Read only to see the client leave.
  void discard() {
    rest_.clear();
    auto self = shared_from_this();
    client_.async_read_some(asio::buffer(buffer_),
                            [self](const boost::system::error_code& ec, size_t) {
                              if (ec == asio::error::eof) return self->shutdown(self->upstream_);
                              if (ec) return self->abort();
                              self->discard();
                            });
  }

  // Plain HTTP, server to client: interim (1xx) responses as they are, then
  // the final response head with `Connection: close`, then its bytes until
  // the server closes. A 101 to an upgrade request makes a tunnel.
  void read_response() {
    auto self = shared_from_this();
    size_t end = response_.find("\r\n\r\n");
    if (end == std::string::npos && response_.size() <= kMaxResponseHead) {
      if (!from_upstream_) from_upstream_ = std::make_shared<std::vector<char>>(kResponseChunk);
      upstream_.async_read_some(asio::buffer(*from_upstream_),
                                [self](const boost::system::error_code& ec, size_t n) {
                                  if (ec) {
                                    // Closed before a whole head: the client gets what came.
                                    if (ec != asio::error::eof) return self->abort();
                                    return self->final_response(std::move(self->response_), false);
                                  }
                                  self->response_.append(self->from_upstream_->data(), n);
                                  self->read_response();
                                });
      return;
    }
    if (end == std::string::npos) {
      from_upstream_.reset();
      return final_response(std::move(response_), true);  // not HTTP: as it is
    }
    from_upstream_.reset();  // the rest is relayed
    std::string head = response_.substr(0, end + 4);
    int status = response_status(head);
    if (status >= 100 && status < 200 && status != 101) {
      response_.erase(0, end + 4);
      auto data = std::make_shared<std::string>(std::move(head));
      asio::async_write(client_, asio::buffer(*data),
                        [self, data](const boost::system::error_code& ec, size_t) {
                          if (ec) return self->abort();
                          self->read_response();
                        });
      return;
    }
    tunnel_ = status == 101 && request_.upgrade;
    std::string out = tunnel_ || status == 0 ? head : closing_response_head(head);
    final_response(out + response_.substr(end + 4), true);
  }

  // `bytes` to the client, then the relay from the server (when it is still
  // open) until the server closes.
  void final_response(std::string bytes, bool relay) {
    std::string().swap(response_);  // its memory too
    response_started_ = true;
    if (request_forwarded_ && request_.upgrade) after_response_head();
    auto self = shared_from_this();
    auto data = std::make_shared<std::string>(std::move(bytes));
    asio::async_write(client_, asio::buffer(*data),
                      [self, data, relay](const boost::system::error_code& ec, size_t) {
                        if (ec) return self->abort();
                        if (!relay) return self->shutdown(self->client_);
                        self->relay(self->upstream_, self->client_, nullptr);
                      });
  }

  // An upgrade request sent and its response head known: a tunnel, or as
  // after any other request.
  void after_response_head() {
    if (tunnel_)
      tunnel_client();
    else
      discard();
  }

  // Client to server without looking: a CONNECT tunnel or an accepted
  // upgrade. Bytes the client sent after its request head come first.
  void tunnel_client() {
    auto self = shared_from_this();
    std::shared_ptr<std::vector<char>> to_upstream;  // made only if splice() cannot be used
    if (rest_.empty()) return relay(client_, upstream_, to_upstream);
    auto data = std::make_shared<std::string>(std::move(rest_));
    asio::async_write(upstream_, asio::buffer(*data),
                      [self, data, to_upstream](const boost::system::error_code& ec, size_t) {
                        if (ec) return self->abort();
                        self->relay(self->client_, self->upstream_, to_upstream);
                      });
  }

  // from -> to until from ends; then half-close `to`. No idle timeout: a
  // long-lived connection (a WebSocket, a stream) is never cut. Through a
  // pipe with splice() where the kernel allows it, else through `buf`.
  template <typename From, typename To>
  void relay(From& from, To& to, std::shared_ptr<std::vector<char>> buf) {
    int ends[2];
    boost::system::error_code ec, ec2;
    from.native_non_blocking(true, ec);
    to.native_non_blocking(true, ec2);
    if (ec || ec2 || ::pipe2(ends, O_NONBLOCK | O_CLOEXEC) != 0)
      return pump(from, to, std::move(buf));
    auto pipe = std::make_shared<SplicePipe>();
    pipe->read_end.reset(ends[0]);
    pipe->write_end.reset(ends[1]);
    (void)::fcntl(pipe->write_end.get(), F_SETPIPE_SZ,
                  static_cast<int>(kSpliceChunk));  // a bigger pipe when allowed
    splice_step(from, to, std::move(pipe), std::move(buf));
  }

  template <typename From, typename To>
  void splice_step(From& from, To& to, std::shared_ptr<SplicePipe> pipe,
                   std::shared_ptr<std::vector<char>> buf) {
    auto self = shared_from_this();
    for (int round = 0; round < kSpliceRounds; ++round) {
      if (pipe->held > 0) {
        ssize_t n = ::splice(pipe->read_end.get(), nullptr, to.native_handle(), nullptr, pipe->held,
                             SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
        if (n > 0) {
          pipe->held -= static_cast<size_t>(n);
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
          to.async_wait(asio::socket_base::wait_write,
                        [self, &from, &to, pipe, buf](const boost::system::error_code& ec) {
                          if (ec) return self->abort();
                          self->splice_step(from, to, pipe, buf);
                        });
          return;
        }
        return abort();
      }
      ssize_t n = ::splice(from.native_handle(), nullptr, pipe->write_end.get(), nullptr,
                           kSpliceChunk, SPLICE_F_MOVE | SPLICE_F_NONBLOCK);
      if (n > 0) {
        pipe->held = static_cast<size_t>(n);
        pipe->moved = true;
        continue;
      }
      if (n == 0) return shutdown(to);
      if (errno == EINTR) continue;
      if (errno == EAGAIN) {
        from.async_wait(asio::socket_base::wait_read,
                        [self, &from, &to, pipe, buf](const boost::system::error_code& ec) {
                          if (ec) return self->abort();
                          self->splice_step(from, to, pipe, buf);
                        });
        return;
      }
      // A kernel that cannot splice these sockets: copy instead.
      if (errno == EINVAL && !pipe->moved) return pump(from, to, std::move(buf));
      return abort();
    }
    // A fast tunnel yields, so that other connections get their turn.
    asio::post(from.get_executor(),
               [self, &from, &to, pipe, buf] { self->splice_step(from, to, pipe, buf); });
  }

  template <typename From, typename To>
  void pump(From& from, To& to, std::shared_ptr<std::vector<char>> buf) {
    if (!buf) buf = std::make_shared<std::vector<char>>(kRelayBuffer);
    auto self = shared_from_this();
    from.async_read_some(
        asio::buffer(*buf), [self, &from, &to, buf](const boost::system::error_code& ec, size_t n) {
          if (ec) {
            if (ec != asio::error::eof) return self->abort();
            return self->shutdown(to);
          }
          asio::async_write(to, asio::buffer(buf->data(), n),
                            [self, &from, &to, buf](const boost::system::error_code& wec, size_t) {
                              if (wec) return self->abort();
                              self->pump(from, to, buf);
                            });
        });
  }

  template <typename Socket>
  void shutdown(Socket& socket) {
    boost::system::error_code ignored;
    socket.shutdown(asio::socket_base::shutdown_send, ignored);
  }

  void deny(const std::string& reason, const std::string& rule) {
    proxy_->audit("connect", caller_, host_, port_, false, rule, reason);
    respond(403, "Forbidden",
            "openshell: the sandbox's network policy does not allow this connection: " + reason);
  }

  void refuse_audited(int status, const std::string& text, const std::string& reason) {
    proxy_->audit("connect", caller_, host_, port_, false, match_.rule, reason);
    respond(status, text, "openshell: " + reason);
  }

  void refuse(int status, const std::string& text, const std::string& reason) {
    respond(status, text, reason.empty() ? text : "openshell: " + reason);
  }

  void respond(int status, const std::string& text, const std::string& body) {
    timer_.cancel();
    auto self = shared_from_this();
    auto data = std::make_shared<std::string>(
        "HTTP/1.1 " + std::to_string(status) + " " + text +
        "\r\nContent-Type: text/plain\r\nContent-Length: " + std::to_string(body.size() + 1) +
        "\r\nConnection: close\r\n\r\n" + body + "\n");
    asio::async_write(
        client_, asio::buffer(*data),
        [self, data](const boost::system::error_code&, size_t) { self->shutdown(self->client_); });
  }

  std::shared_ptr<Proxy::Impl> proxy_;
  ClientSocket client_;
  tcp::socket upstream_;
  asio::steady_timer timer_;
  std::array<char, 8192> buffer_{};  // reads from the client
  std::shared_ptr<std::vector<char>> from_upstream_;
  std::string head_;      // the client's request head
  std::string rest_;      // client bytes after it, not yet sent on
  std::string response_;  // server bytes of a response head not yet complete
  std::string host_;
  uint16_t port_ = 0;
  bool connect_ = false;
  OriginRequest request_;  // plain HTTP
  bool request_forwarded_ = false, response_started_ = false, tunnel_ = false;
  const uint64_t id_;
  const Identity identity_;
  Caller caller_;                // the process named in the audit
  std::vector<Caller> holders_;  // every process that held the socket
  Holders at_accept_, at_request_;
  std::shared_ptr<Holders> accept_search_;  // written and read on the worker's thread
  bool accept_pending_ = false, request_pending_ = false, request_done_ = false, decided_ = false;
  bool budget_exceeded_ = false;
  bool connects_seen_ = false;      // whether connectors are known (then needed)
  std::vector<Caller> connectors_;  // who connected the socket, when known
  std::shared_ptr<const NetworkRules> rules_;
  Match match_;
  bool inspected_ = false;  // judged at layer 7 (match_.inspect when decided)
  std::shared_ptr<SSL_CTX> leaf_, upstream_tls_;
  std::vector<Address> candidates_;
  Address address_;  // the server's, once connected
};

// A guest's DNS over a stream (DNS-over-TCP framing, RFC 1035 section
// 4.2.2: each message after its length, 2 bytes big-endian): many queries,
// each answered as the UDP stub answers it, the answers in the order they
// are ready. What it holds is bounded: kMaxDnsPending queries in hand, each
// at most kMaxDnsQuery bytes; it reads no more until one is answered.
class DnsStream : public std::enable_shared_from_this<DnsStream> {
 public:
  DnsStream(std::shared_ptr<Proxy::Impl> proxy, ClientSocket socket)
      : proxy_(std::move(proxy)), socket_(std::move(socket)), id_(++proxy_->next_dns_stream) {}
  ~DnsStream() { proxy_->dns_streams.erase(id_); }

  void start() {
    std::weak_ptr<DnsStream> weak = shared_from_this();
    proxy_->dns_streams[id_] = [weak] {
      if (auto self = weak.lock()) self->close();
    };
    take_queries();
  }

  void close() {
    closed_ = true;
    boost::system::error_code ignored;
    socket_.close(ignored);
  }

 private:
  // The whole queries read so far, each handed to the stub; then more.
  void take_queries() {
    if (taking_ || closed_) return;  // an answer that came at once, within the loop below
    taking_ = true;
    while (!closed_ && pending_ < kMaxDnsPending && in_.size() >= 2) {
      const size_t length =
          static_cast<size_t>(static_cast<uint8_t>(in_[0])) << 8 | static_cast<uint8_t>(in_[1]);
      if (length == 0 || length > kMaxDnsQuery) {
        taking_ = false;
        return refuse("a DNS message of " + std::to_string(length) +
                      " bytes on the guest's DNS stream (the most is " +
                      std::to_string(kMaxDnsQuery) + "): the stream is closed");
      }
      if (in_.size() < 2 + length) break;
      std::string query = in_.substr(2, length);
      in_.erase(0, 2 + length);
      ++pending_;
      auto self = shared_from_this();
      if (!proxy_->answer_dns(query, [self](std::string answer) { self->answered(answer); }))
        --pending_;  // dropped, as the UDP stub drops it
    }
    taking_ = false;
    if (!closed_ && !reading_ && !eof_ && pending_ < kMaxDnsPending) read_more();
    finish_when_done();
  }

  void read_more() {
    reading_ = true;
    auto self = shared_from_this();
    socket_.async_read_some(asio::buffer(buffer_),
                            [self](const boost::system::error_code& ec, size_t n) {
                              self->reading_ = false;
                              if (ec == asio::error::eof) {
                                self->eof_ = true;
                                return self->finish_when_done();
                              }
                              if (ec) return self->close();
                              self->in_.append(self->buffer_.data(), n);
                              self->take_queries();
                            });
  }

  void answered(const std::string& answer) {
    --pending_;
    if (closed_) return;
    if (answer.size() > 0xFFFF) return close();  // cannot be framed (the stub's never are)
    std::string framed;
    framed.push_back(static_cast<char>(answer.size() >> 8));
    framed.push_back(static_cast<char>(answer.size() & 0xFF));
    out_.push_back(framed + answer);
    write();
    take_queries();  // reading may have stopped at the limit
  }

  void write() {
    if (writing_ || out_.empty() || closed_) return;
    writing_ = true;
    auto self = shared_from_this();
    asio::async_write(socket_, asio::buffer(out_.front()),
                      [self](const boost::system::error_code& ec, size_t) {
                        self->writing_ = false;
                        self->out_.pop_front();
                        if (ec) return self->close();
                        self->write();
                        self->finish_when_done();
                      });
  }

  // The guest sent its last query and has every answer: the stream ends.
  void finish_when_done() {
    if (closed_ || !eof_ || pending_ > 0 || writing_ || !out_.empty()) return;
    boost::system::error_code ignored;
    socket_.shutdown(asio::socket_base::shutdown_send, ignored);
    close();
  }

  void refuse(const std::string& reason) {
    proxy_->audit("dns", Caller{}, "", 0, false, "", reason);
    close();
  }

  std::shared_ptr<Proxy::Impl> proxy_;
  ClientSocket socket_;
  const uint64_t id_;
  std::array<char, 4096> buffer_{};
  std::string in_;               // bytes read, not yet whole queries
  std::deque<std::string> out_;  // framed answers, the first being written
  size_t pending_ = 0;           // queries handed to the stub, not yet answered
  bool taking_ = false, reading_ = false, writing_ = false, eof_ = false, closed_ = false;
};

// A stream socket's fd as a client socket of the proxy's loop; nullopt
// (the fd closed, the reason logged) when it is not one.
std::optional<ClientSocket> client_socket(asio::io_context& io, UniqueFd fd, const char* what) {
  int domain = 0, type = 0;
  socklen_t size = sizeof domain;
  if (::getsockopt(fd.get(), SOL_SOCKET, SO_DOMAIN, &domain, &size) != 0 ||
      (size = sizeof type, ::getsockopt(fd.get(), SOL_SOCKET, SO_TYPE, &type, &size)) != 0 ||
      type != SOCK_STREAM) {
    log::error(std::string("egress proxy: ") + what + ": not a stream socket");
    return std::nullopt;
  }
  ClientSocket socket(io);
  boost::system::error_code ec;
  socket.assign(asio::generic::stream_protocol(domain, 0), fd.get(), ec);
  if (ec) {
    log::error(std::string("egress proxy: ") + what + ": " + ec.message());
    return std::nullopt;
  }
  (void)fd.release();  // the socket's now
  return socket;
}

}  // namespace

void Proxy::Impl::serve_client(ClientSocket client, Identity identity, Caller caller) {
  if (closed) return;
  if (open_connections >= options.max_connections) return refuse_over_limit(std::move(client));
  std::make_shared<Connection>(shared_from_this(), std::move(client), identity, std::move(caller))
      ->start();
}

void Proxy::Impl::accept() {
  auto self = shared_from_this();
  acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket client) {
    if (self->closed) return;
    if (!ec && self->open_connections >= self->options.max_connections)
      self->refuse_over_limit(std::move(client));
    else if (!ec)
      std::make_shared<Connection>(self, ClientSocket(std::move(client)))->start();
    if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor) return;
    self->accept();
  });
}

void Proxy::Impl::serve_dns() {
  auto self = shared_from_this();
  auto buf = std::make_shared<std::array<char, 1500>>();
  auto from = std::make_shared<udp::endpoint>();
  dns.async_receive_from(
      asio::buffer(*buf), *from, [self, buf, from](const boost::system::error_code& ec, size_t n) {
        if (ec) {
          if (ec != asio::error::operation_aborted && !self->closed) self->serve_dns();
          return;
        }
        self->serve_dns();
        self->answer_dns(std::string_view(buf->data(), n), [self, from](std::string message) {
          auto data = std::make_shared<std::string>(std::move(message));
          self->dns.async_send_to(asio::buffer(*data), *from,
                                  [data](const boost::system::error_code&, size_t) {});
        });
      });
}

bool Proxy::Impl::answer_dns(std::string_view message, std::function<void(std::string)> reply) {
  auto query = dns::parse_query(message);
  if (!query) return false;  // not a query we answer: drop it
  auto self = shared_from_this();
  auto rules = this->rules;
  const std::string name = query->question.name;
  Caller nobody;
  // localhost and the sandbox's own name stay inside: no rule, no denial.
  if (auto local = local_name_addresses(name, options.sandbox)) {
    reply(dns::build_response(*query, dns::kRcodeNoError, *local, kDnsTtl));
    return true;
  }
  if (!rules->knows_host(name)) {
    // Never asked upstream: the name stays on this host.
    audit("dns", nobody, name, 0, false, "", "no rule names this host");
    reply(dns::build_response(*query, dns::kRcodeNxDomain, {}, kDnsTtl));
    return true;
  }
  if (query->question.type != dns::kTypeA && query->question.type != dns::kTypeAAAA) {
    reply(dns::build_response(*query, dns::kRcodeNoError, {}, kDnsTtl));
    return true;
  }
  dns::Query q = *query;
  resolver.lookup(name, [self, q, reply, rules, name](dns::Resolution result) {
    if (result.source == dns::Source::kRateLimited) {
      self->audit_rate_limited(name, q.question.type, result.error);
      return reply(dns::build_response(q, dns::kRcodeRefused, {}, kDnsTtl));
    }
    if (!result.error.empty()) {
      const std::string& error = result.error;
      bool missing =
          error.size() >= 14 && error.compare(error.size() - 14, 14, ": no such host") == 0;
      self->audit_dns(name, q.question.type, dns::source_name(result.source), 0, error);
      return reply(
          dns::build_response(q, missing ? dns::kRcodeNxDomain : dns::kRcodeServFail, {}, kDnsTtl));
    }
    // Only addresses a connection could use (the SSRF guard holds here too).
    std::vector<Address> usable;
    size_t answers = 0;
    int family = q.question.type == dns::kTypeA ? AF_INET : AF_INET6;
    for (const auto& a : result.addresses) {
      if (!rules->address_allowed_for_host(name, a)) continue;
      usable.push_back(a);
      if (a.family == family) ++answers;
    }
    self->audit_dns(name, q.question.type, dns::source_name(result.source), answers, "");
    reply(dns::build_response(q, dns::kRcodeNoError, usable, kDnsTtl));
  });
  return true;
}

namespace {

// OPENSHELL_PROXY_MAX_CONNECTIONS, when set, overrides the limit.
Proxy::Options with_environment(Proxy::Options options) {
  const char* text = std::getenv("OPENSHELL_PROXY_MAX_CONNECTIONS");
  if (!text || !*text) return options;
  auto value = text::parse_uint(text, 1 << 20);
  if (value && *value > 0)
    options.max_connections = static_cast<size_t>(*value);
  else
    log::warn(std::string("OPENSHELL_PROXY_MAX_CONNECTIONS=") + text +
              ": not a number from 1 to 1048576; the limit stays " +
              std::to_string(options.max_connections));
  return options;
}

}  // namespace

Proxy::Proxy(asio::io_context& io, Options options, dns::ResolverConfig resolver)
    : impl_(std::make_shared<Impl>(io, with_environment(std::move(options)), std::move(resolver))) {
}

Proxy::~Proxy() {
  close();
  impl_->worker.reset();
  if (worker_) worker_->stop();
}

void Proxy::set_rules(std::shared_ptr<const NetworkRules> rules, int64_t revision) {
  impl_->rules = rules ? std::move(rules) : std::make_shared<NetworkRules>();
  impl_->revision = revision;
  if (connect_watcher_) connect_watcher_->set_examine(impl_->rules->names_binaries());
  // Each open connection asks whether it is still allowed (and may close,
  // which takes it out of the map: iterate over a copy).
  auto established = impl_->established;
  for (auto& [id, recheck] : established) recheck(revision);
}

void Proxy::set_credentials(std::vector<Credential> credentials) {
  decltype(impl_->credentials) sets;
  for (int places = 0; places < 4; ++places) {
    std::vector<Credential> set = credentials;
    for (auto& c : set) {
      c.in_query = (places & 1) != 0;
      c.in_body = (places & 2) != 0;
    }
    sets[places] = std::make_shared<const Credentials>(std::move(set));
  }
  impl_->credentials = std::move(sets);
}

void Proxy::serve(UniqueFd listener, UniqueFd dns_socket, UniqueFd diag_socket,
                  UniqueFd connect_listener) {
  worker_ = std::make_shared<IdentityWorker>(
      std::make_unique<CallerFinder>(impl_->options.init_pid, std::move(diag_socket)));
  impl_->worker = worker_;
  if (connect_listener) {
    auto log = std::make_shared<ConnectLog>();
    sockaddr_in own{};
    socklen_t size = sizeof own;
    uint16_t port = 0;
    if (listener && ::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&own), &size) == 0 &&
        own.sin_family == AF_INET)
      port = ntohs(own.sin_port);
    connect_watcher_ = std::make_unique<ConnectWatcher>(std::move(connect_listener),
                                                        impl_->options.init_pid, log, port);
    connect_watcher_->set_examine(impl_->rules->names_binaries());
    if (connect_watcher_->active()) impl_->connects = std::move(log);
  }
  if (listener) {
    impl_->acceptor.assign(tcp::v4(), listener.release());
    impl_->accept();
  }
  if (dns_socket) {
    impl_->dns.assign(udp::v4(), dns_socket.release());
    impl_->serve_dns();
  }
}

void Proxy::serve_identified(UniqueFd client, Caller caller) {
  if (auto socket = client_socket(impl_->io, std::move(client), "an identified connection"))
    impl_->serve_client(std::move(*socket), Identity::kGiven, std::move(caller));
}

void Proxy::serve_guest_connection(UniqueFd client) {
  if (auto socket = client_socket(impl_->io, std::move(client), "a guest's connection"))
    impl_->serve_client(std::move(*socket), Identity::kLine, Caller{});
}

void Proxy::serve_dns_stream(UniqueFd stream) {
  auto socket = client_socket(impl_->io, std::move(stream), "a guest's DNS stream");
  if (!socket || impl_->closed) return;
  if (impl_->dns_streams.size() >= kMaxDnsStreams) {
    impl_->audit("dns", Caller{}, "", 0, false, "",
                 "too many DNS streams (the limit is " + std::to_string(kMaxDnsStreams) + ")");
    return;  // closed with the socket
  }
  std::make_shared<DnsStream>(impl_, std::move(*socket))->start();
}

void Proxy::close() {
  impl_->closed = true;
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->dns.close(ignored);
  // Each closes, and leaves the map as it goes: from a copy.
  auto streams = impl_->dns_streams;
  for (auto& [id, close_stream] : streams) close_stream();
}

}  // namespace openshell::egress
