// clang-format off
#include <utility>  // before Asio with GCC 12 in C++20
// clang-format on

#include "egress/proxy.h"

#include <boost/asio.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>

#include "base/logfile.h"
#include "base/text.h"
#include "egress/identity.h"

namespace openshell::egress {

namespace asio = boost::asio;
using asio::ip::tcp;
using asio::ip::udp;
using nlohmann::json;

namespace {

constexpr size_t kMaxHead = 64 * 1024;
constexpr size_t kRelayBuffer = 256 * 1024;
constexpr auto kHeadTimeout = std::chrono::seconds(30);
constexpr auto kConnectTimeout = std::chrono::seconds(10);
constexpr uint32_t kDnsTtl = 30;

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

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

}  // namespace

struct Proxy::Impl : std::enable_shared_from_this<Impl> {
  asio::io_context& io;
  Options options;
  Resolver resolver;
  std::shared_ptr<const NetworkRules> rules = std::make_shared<NetworkRules>();
  tcp::acceptor acceptor;
  udp::socket dns;
  Counters counters;
  bool closed = false;

  Impl(asio::io_context& io_, Options o, ResolverConfig config)
      : io(io_), options(std::move(o)), resolver(io_, std::move(config)), acceptor(io_), dns(io_) {}

  void audit(const std::string& kind, const Caller& caller, const std::string& host, uint16_t port,
             bool allowed, const std::string& rule, const std::string& reason,
             const std::string& address = {}) {
    if (allowed)
      ++counters.allowed;
    else
      ++counters.denied;
    if (!options.audit) return;
    json line = {{"time", logfile::format_time(logfile::now_ns())},
                 {"sandbox", options.sandbox},
                 {"kind", kind},
                 {"binary", caller.exe},
                 {"pid", caller.pid},
                 {"host", host},
                 {"port", port},
                 {"decision", allowed ? "allow" : "deny"},
                 {"rule", rule},
                 {"reason", reason}};
    if (!address.empty()) line["address"] = address;
    options.audit(line.dump());
  }

  void accept();
  void serve_dns();
};

namespace {

// One proxied connection.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(std::shared_ptr<Proxy::Impl> proxy, tcp::socket client)
      : proxy_(std::move(proxy)), client_(std::move(client)), upstream_(proxy_->io),
        timer_(proxy_->io) {}

  void start() {
    auto self = shared_from_this();
    timer_.expires_after(kHeadTimeout);
    timer_.async_wait([self](const boost::system::error_code& ec) {
      if (!ec) self->abort();
    });
    read_head();
  }

 private:
  void abort() {
    boost::system::error_code ignored;
    client_.close(ignored);
    upstream_.close(ignored);
  }

  void read_head() {
    auto self = shared_from_this();
    client_.async_read_some(asio::buffer(buffer_), [self](const boost::system::error_code& ec, size_t n) {
      if (ec) return self->abort();
      self->head_.append(self->buffer_.data(), n);
      size_t end = self->head_.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (self->head_.size() > kMaxHead) return self->refuse(431, "Request Header Fields Too Large", "");
        return self->read_head();
      }
      self->rest_ = self->head_.substr(end + 4);
      self->head_.resize(end + 4);
      self->handle_head();
    });
  }

  void handle_head() {
    // METHOD SP TARGET SP VERSION
    size_t line_end = head_.find("\r\n");
    std::string line = head_.substr(0, line_end);
    auto parts = text::split(line, ' ');
    if (parts.size() != 3 || parts[2].rfind("HTTP/1.", 0) != 0)
      return refuse(400, "Bad Request", "not an HTTP/1 request");
    method_ = parts[0];
    const std::string& target = parts[1];
    if (method_ == "CONNECT") {
      connect_ = true;
      if (!split_authority(target, 0, &host_, &port_))
        return refuse(400, "Bad Request", "CONNECT needs host:port");
    } else {
      // Plain HTTP through a proxy: an absolute URL.
      if (lower(target.substr(0, 7)) != "http://")
        return refuse(400, "Bad Request", "only http:// URLs and CONNECT go through this proxy");
      std::string rest = target.substr(7);
      size_t slash = rest.find('/');
      std::string authority = rest.substr(0, slash);
      path_ = slash == std::string::npos ? "/" : rest.substr(slash);
      if (!split_authority(authority, 80, &host_, &port_)) return refuse(400, "Bad Request", "bad URL");
    }
    // Who is asking.
    boost::system::error_code ec;
    auto peer = client_.remote_endpoint(ec);
    auto local = client_.local_endpoint(ec);
    if (!ec) caller_ = identify_tcp_client(proxy_->options.init_pid, peer.port(), local.port());
    rules_ = proxy_->rules;
    Decision d = rules_->check(caller_.exe, host_, port_, &match_);
    if (!d.allowed) return deny(d.reason, d.rule);
    resolve();
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
      return refuse_audited(502, "Bad Gateway", "cannot connect to " + host_ + ":" + std::to_string(port_));
    const Address& a = candidates_[index];
    asio::ip::address address =
        a.family == AF_INET
            ? asio::ip::address(asio::ip::address_v4(asio::ip::address_v4::bytes_type{a.bytes[0], a.bytes[1], a.bytes[2], a.bytes[3]}))
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
    upstream_.async_connect(tcp::endpoint(address, port_), [self, index](const boost::system::error_code& ec) {
      if (ec) return self->dial(index + 1);
      self->timer_.cancel();
      self->connected(self->candidates_[index]);
    });
  }

  void connected(const Address& address) {
    proxy_->audit("connect", caller_, host_, port_, true, match_.rule, "", address.to_string());
    boost::system::error_code ignored;
    upstream_.set_option(tcp::no_delay(true), ignored);
    client_.set_option(tcp::no_delay(true), ignored);
    auto self = shared_from_this();
    if (connect_) {
      auto reply = std::make_shared<std::string>("HTTP/1.1 200 Connection established\r\n\r\n");
      asio::async_write(client_, asio::buffer(*reply), [self, reply](const boost::system::error_code& ec, size_t) {
        if (ec) return self->abort();
        self->relay_pending();
      });
      return;
    }
    // The request again, in origin form, without the proxy's own headers.
    std::string request = method_ + " " + path_ + " " + text::split(head_.substr(0, head_.find("\r\n")), ' ')[2] + "\r\n";
    size_t start = head_.find("\r\n") + 2;
    while (start < head_.size()) {
      size_t end = head_.find("\r\n", start);
      std::string header = head_.substr(start, end - start);
      start = end + 2;
      if (header.empty()) break;
      std::string name = lower(header.substr(0, header.find(':')));
      if (name == "proxy-connection" || name == "proxy-authorization") continue;
      request += header + "\r\n";
    }
    request += "\r\n";
    auto data = std::make_shared<std::string>(std::move(request));
    asio::async_write(upstream_, asio::buffer(*data), [self, data](const boost::system::error_code& ec, size_t) {
      if (ec) return self->abort();
      self->relay_pending();
    });
  }

  // Bytes the client sent after its request head, then the relay both ways.
  void relay_pending() {
    auto self = shared_from_this();
    if (rest_.empty()) return relay();
    auto data = std::make_shared<std::string>(std::move(rest_));
    asio::async_write(upstream_, asio::buffer(*data), [self, data](const boost::system::error_code& ec, size_t) {
      if (ec) return self->abort();
      self->relay();
    });
  }

  void relay() {
    auto up = std::make_shared<std::vector<char>>(kRelayBuffer);
    auto down = std::make_shared<std::vector<char>>(kRelayBuffer);
    pump(client_, upstream_, up);
    pump(upstream_, client_, down);
  }

  // from -> to until from ends; then half-close `to`. No idle timeout: a
  // long-lived connection (a WebSocket, a stream) is never cut.
  void pump(tcp::socket& from, tcp::socket& to, std::shared_ptr<std::vector<char>> buf) {
    auto self = shared_from_this();
    from.async_read_some(asio::buffer(*buf), [self, &from, &to, buf](const boost::system::error_code& ec, size_t n) {
      if (ec) {
        boost::system::error_code ignored;
        to.shutdown(tcp::socket::shutdown_send, ignored);
        if (ec != asio::error::eof) self->abort();
        return;
      }
      self->proxy_->counters.bytes += n;
      asio::async_write(to, asio::buffer(buf->data(), n), [self, &from, &to, buf](const boost::system::error_code& wec, size_t) {
        if (wec) return self->abort();
        self->pump(from, to, buf);
      });
    });
  }

  void deny(const std::string& reason, const std::string& rule) {
    proxy_->audit("connect", caller_, host_, port_, false, rule, reason);
    respond(403, "Forbidden", "openshell: the sandbox's network policy does not allow this connection: " + reason);
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
    auto data = std::make_shared<std::string>("HTTP/1.1 " + std::to_string(status) + " " + text +
                                              "\r\nContent-Type: text/plain\r\nContent-Length: " +
                                              std::to_string(body.size() + 1) +
                                              "\r\nConnection: close\r\n\r\n" + body + "\n");
    asio::async_write(client_, asio::buffer(*data), [self, data](const boost::system::error_code&, size_t) {
      boost::system::error_code ignored;
      self->client_.shutdown(tcp::socket::shutdown_send, ignored);
    });
  }

  std::shared_ptr<Proxy::Impl> proxy_;
  tcp::socket client_;
  tcp::socket upstream_;
  asio::steady_timer timer_;
  std::array<char, 8192> buffer_{};
  std::string head_, rest_;
  std::string method_, path_, host_;
  uint16_t port_ = 0;
  bool connect_ = false;
  Caller caller_;
  std::shared_ptr<const NetworkRules> rules_;
  Match match_;
  std::vector<Address> candidates_;
};

}  // namespace

void Proxy::Impl::accept() {
  auto self = shared_from_this();
  acceptor.async_accept([self](const boost::system::error_code& ec, tcp::socket client) {
    if (self->closed) return;
    if (!ec) std::make_shared<Connection>(self, std::move(client))->start();
    if (ec == asio::error::operation_aborted || ec == asio::error::bad_descriptor) return;
    self->accept();
  });
}

void Proxy::Impl::serve_dns() {
  auto self = shared_from_this();
  auto buf = std::make_shared<std::array<char, 1500>>();
  auto from = std::make_shared<udp::endpoint>();
  dns.async_receive_from(asio::buffer(*buf), *from, [self, buf, from](const boost::system::error_code& ec, size_t n) {
    if (ec) {
      if (ec != asio::error::operation_aborted && !self->closed) self->serve_dns();
      return;
    }
    self->serve_dns();
    auto query = parse_query(std::string_view(buf->data(), n));
    if (!query) return;  // not a query we answer: drop it
    auto reply = [self, from](std::string message) {
      auto data = std::make_shared<std::string>(std::move(message));
      self->dns.async_send_to(asio::buffer(*data), *from, [data](const boost::system::error_code&, size_t) {});
    };
    auto rules = self->rules;
    const std::string name = query->question.name;
    Caller nobody;
    if (!rules->knows_host(name)) {
      // Never asked upstream: the name stays on this host.
      self->audit("dns", nobody, name, 0, false, "", "no rule names this host");
      return reply(build_response(*query, kRcodeNxDomain, {}, kDnsTtl));
    }
    if (query->question.type != kTypeA && query->question.type != kTypeAAAA)
      return reply(build_response(*query, kRcodeNoError, {}, kDnsTtl));
    Query q = *query;
    self->resolver.resolve(name, [self, q, reply, rules, name](std::vector<Address> addresses, std::string error) {
      if (!error.empty()) {
        bool missing = error.size() >= 14 && error.compare(error.size() - 14, 14, ": no such host") == 0;
        return reply(build_response(q, missing ? kRcodeNxDomain : kRcodeServFail, {}, kDnsTtl));
      }
      // Only addresses a connection could use (the SSRF guard holds here too).
      std::vector<Address> usable;
      for (const auto& a : addresses)
        if (rules->address_allowed_for_host(name, a)) usable.push_back(a);
      Caller nobody;
      self->audit("dns", nobody, name, 0, true, "", "");
      reply(build_response(q, kRcodeNoError, usable, kDnsTtl));
    });
  });
}

Proxy::Proxy(asio::io_context& io, Options options, ResolverConfig resolver)
    : impl_(std::make_shared<Impl>(io, std::move(options), std::move(resolver))) {}

Proxy::~Proxy() { close(); }

void Proxy::set_rules(std::shared_ptr<const NetworkRules> rules) {
  impl_->rules = rules ? std::move(rules) : std::make_shared<NetworkRules>();
}

void Proxy::serve(UniqueFd listener, UniqueFd dns_socket) {
  if (listener) {
    impl_->acceptor.assign(tcp::v4(), listener.release());
    impl_->accept();
  }
  if (dns_socket) {
    impl_->dns.assign(udp::v4(), dns_socket.release());
    impl_->serve_dns();
  }
}

void Proxy::close() {
  impl_->closed = true;
  boost::system::error_code ignored;
  impl_->acceptor.close(ignored);
  impl_->dns.close(ignored);
}

Proxy::Counters Proxy::counters() const { return impl_->counters; }

}  // namespace openshell::egress
