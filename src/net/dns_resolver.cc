// The resolver: hosts file, cache, rate limit, then UDP queries upstream.
#include <sys/random.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>

#include "base/error.h"
#include "net/dns_internal.h"

namespace openshell::net::dns {

using namespace detail;

namespace {

// Query ids must not be guessable (an off-path attacker would have to guess
// the id and the source port to forge an answer).
uint16_t random_id() {
  uint16_t id = 0;
  if (::getrandom(&id, sizeof id, 0) == static_cast<ssize_t>(sizeof id)) return id;
  static std::random_device device;  // getrandom or /dev/urandom in libstdc++
  return static_cast<uint16_t>(device());
}

class Lookup;

using Clock = std::chrono::steady_clock;

// What one lookup through the nameservers ended with.
struct LookupOutcome {
  std::vector<Address> addresses;
  std::string error;
  bool cacheable = false;     // a final answer: addresses, none, or NXDOMAIN
  uint32_t ttl = UINT32_MAX;  // the least TTL of the records used
};
using LookupDone = std::function<void(LookupOutcome)>;

// What the lookups of one Resolver share; they keep it alive.
struct ResolverState {
  asio::io_context& io;
  ResolverConfig config;
  std::vector<udp::endpoint> configured_servers;
  CachedFile<HostsTable> hosts{parse_hosts};
  CachedFile<std::vector<udp::endpoint>> resolv{parse_resolv_conf};
  std::list<std::weak_ptr<Lookup>> active;
  bool closed = false;

  struct CacheEntry {
    std::vector<Address> addresses;
    std::string error;  // NXDOMAIN
    Clock::time_point expires;
    std::list<std::string>::iterator recent;  // its place in `recency`
  };
  std::unordered_map<std::string, CacheEntry> cache;
  std::list<std::string> recency;  // most recently used first
  // Names being looked up, and who waits for each.
  std::unordered_map<std::string, std::vector<std::function<void(Resolution)>>> pending;
  double tokens = 0;
  Clock::time_point refilled;
  bool bucket_started = false;

  ResolverState(asio::io_context& context, ResolverConfig c) : io(context), config(std::move(c)) {
    if (!config.now) config.now = Clock::now;
  }

  const CacheEntry* cached(const std::string& name) {
    auto it = cache.find(name);
    if (it == cache.end()) return nullptr;
    if (config.now() >= it->second.expires) {
      recency.erase(it->second.recent);
      cache.erase(it);
      return nullptr;
    }
    recency.splice(recency.begin(), recency, it->second.recent);
    return &it->second;
  }

  void remember(const std::string& name, const LookupOutcome& outcome) {
    if (config.cache_entries == 0 || !outcome.cacheable) return;
    uint32_t ttl = outcome.addresses.empty() ? config.negative_ttl_s : outcome.ttl;
    ttl = std::max(config.min_ttl_s, std::min(ttl, config.max_ttl_s));
    if (auto it = cache.find(name); it != cache.end()) {
      recency.erase(it->second.recent);
      cache.erase(it);
    }
    while (cache.size() >= config.cache_entries) {
      cache.erase(recency.back());
      recency.pop_back();
    }
    recency.push_front(name);
    cache[name] = {outcome.addresses, outcome.error, config.now() + std::chrono::seconds(ttl),
                   recency.begin()};
  }

  // A token of the bucket for one lookup upstream; false when it is empty.
  bool take_token() {
    if (config.query_rate <= 0) return true;
    Clock::time_point now = config.now();
    if (!bucket_started) {
      bucket_started = true;
      tokens = config.query_burst;
      refilled = now;
    }
    double elapsed = std::chrono::duration<double>(now - refilled).count();
    if (elapsed > 0) {
      tokens = std::min(config.query_burst, tokens + elapsed * config.query_rate);
      refilled = now;
    }
    if (tokens < 1) return false;
    tokens -= 1;
    return true;
  }
};

// One name through the nameservers: an A and an AAAA query to a server at a
// time, the same server again only after all the others (attempts rounds).
// Each server gets its own connected UDP socket with a port the kernel
// picks at random, so answers from elsewhere never reach us.
class Lookup : public std::enable_shared_from_this<Lookup> {
 public:
  Lookup(std::shared_ptr<ResolverState> state, std::string name, std::vector<udp::endpoint> servers,
         LookupDone done)
      : state_(std::move(state)),
        name_(std::move(name)),
        servers_(std::move(servers)),
        done_(std::move(done)),
        timer_(state_->io) {
    sockets_.resize(servers_.size());
  }

  void start() { start_round(); }

  // The resolver went away: no callback, nothing more sent.
  void cancel() {
    finished_ = true;
    done_ = nullptr;
    stop();
  }

 private:
  struct Family {
    explicit Family(uint16_t t) : type(t) {}
    uint16_t type;
    bool answered = false;
    bool failed_this_round = false;
    std::vector<Address> addresses;
    uint32_t ttl = UINT32_MAX;
  };
  struct Sent {
    size_t server;
    uint16_t id;
    size_t family;
    unsigned round;
  };
  struct Socket {
    explicit Socket(asio::io_context& io) : socket(io) {}
    udp::socket socket;
    udp::endpoint sender;
    std::array<char, 65536> buffer;
  };

  void start_round() {
    ++round_;
    const udp::endpoint& server = servers_[server_];
    for (Family& family : families_) family.failed_this_round = false;
    for (size_t f = 0; f < families_.size(); ++f) {
      if (families_[f].answered) continue;
      std::string error = send(f);
      if (!error.empty()) {
        // Also the ICMP error of an earlier query ("Connection refused"):
        // this server answers nothing this round.
        for (Family& family : families_) family.failed_this_round = true;
        failure_ = "sending to " + endpoint_text(server) + ": " + error;
        break;
      }
    }
    timer_.expires_after(std::chrono::milliseconds(std::max(1, state_->config.timeout_ms)));
    timer_.async_wait([self = shared_from_this(), round = round_](boost::system::error_code ec) {
      if (ec || self->finished_ || round != self->round_) return;
      self->next_server();
    });
    if (round_failed()) {
      asio::post(state_->io, [self = shared_from_this(), round = round_] {
        if (!self->finished_ && round == self->round_) self->next_server();
      });
    }
  }

  // "" or why the query could not be sent.
  std::string send(size_t f) {
    if (!sockets_[server_]) {
      auto socket = std::make_unique<Socket>(state_->io);
      boost::system::error_code ec;
      socket->socket.open(servers_[server_].protocol(), ec);
      if (!ec) socket->socket.connect(servers_[server_], ec);
      if (ec) return ec.message();
      sockets_[server_] = std::move(socket);
      receive(server_);
    }
    uint16_t id = random_id();
    for (const Sent& sent : sent_)  // one id per outstanding query of this server
      if (sent.server == server_ && sent.id == id) id = static_cast<uint16_t>(id + 1);
    sent_.push_back({server_, id, f, round_});
    boost::system::error_code ec;
    sockets_[server_]->socket.send(asio::buffer(build_query(id, name_, families_[f].type)), 0, ec);
    return ec ? ec.message() : "";
  }

  void receive(size_t server) {
    Socket& socket = *sockets_[server];
    socket.socket.async_receive_from(
        asio::buffer(socket.buffer), socket.sender,
        [self = shared_from_this(), server](boost::system::error_code ec, size_t size) {
          self->received(server, ec, size);
        });
  }

  void received(size_t server, boost::system::error_code ec, size_t size) {
    if (finished_ || ec == asio::error::operation_aborted) return;
    Socket& socket = *sockets_[server];
    if (ec) {
      // ICMP port unreachable and the like: this server will not answer.
      failure_ = endpoint_text(servers_[server]) + ": " + ec.message();
      if (server == server_) {
        for (Family& family : families_) family.failed_this_round = true;
        next_server();
        if (finished_) return;
      }
    } else if (socket.sender == servers_[server]) {
      answer(server, std::string_view(socket.buffer.data(), size));
      if (finished_) return;
    }
    receive(server);
  }

  void answer(size_t server, std::string_view message) {
    auto response = parse_response(message);
    if (!response || response->question.name != name_ || response->question.klass != kClassIN)
      return;
    auto sent = std::find_if(sent_.begin(), sent_.end(), [&](const Sent& s) {
      return s.server == server && s.id == response->id &&
             families_[s.family].type == response->question.type;
    });
    if (sent == sent_.end()) return;  // not an answer to anything we asked
    Family& family = families_[sent->family];
    if (family.answered) return;
    uint8_t rcode = response->rcode();
    std::vector<Address> addresses;
    uint32_t ttl = UINT32_MAX;
    if (rcode == kRcodeNoError)
      addresses = addresses_for(response->answers, name_, family.type, &ttl);
    if (rcode == kRcodeNxDomain) return finish({}, name_ + ": no such host", true);
    if (rcode == kRcodeNoError && !(response->truncated() && addresses.empty())) {
      // A truncated answer is used for what it holds (no TCP fallback).
      family.answered = true;
      family.addresses = std::move(addresses);
      family.ttl = ttl;
    } else {
      failure_ = endpoint_text(servers_[server]) + " answered " +
                 (rcode == kRcodeNoError ? "a truncated message" : rcode_name(rcode));
      if (sent->round == round_) family.failed_this_round = true;
    }
    if (std::all_of(families_.begin(), families_.end(), [](const Family& f) { return f.answered; }))
      return finish(collect(), "", true);
    if (round_failed()) next_server();
  }

  // Every query still open in this round got a failure: no need to wait.
  bool round_failed() const {
    bool any_open = false;
    for (const Family& family : families_) {
      if (family.answered) continue;
      any_open = true;
      if (!family.failed_this_round) return false;
    }
    return any_open;
  }

  void next_server() {
    if (++server_ == servers_.size()) {
      server_ = 0;
      ++attempt_;
    }
    if (attempt_ >= std::max(1, state_->config.attempts)) return give_up();
    start_round();
  }

  void give_up() {
    std::vector<Address> addresses = collect();
    // One family answered: used, but not kept (the other may answer next time).
    if (!addresses.empty()) return finish(std::move(addresses), "", false);
    if (!failure_.empty()) return finish({}, name_ + ": DNS lookup failed: " + failure_, false);
    finish({}, name_ + ": DNS servers did not answer", false);
  }

  // IPv4 first: a host without an IPv6 route is more common than the opposite.
  std::vector<Address> collect() const {
    std::vector<Address> addresses;
    for (const Family& family : families_)
      addresses.insert(addresses.end(), family.addresses.begin(), family.addresses.end());
    return addresses;
  }

  void finish(std::vector<Address> addresses, std::string error, bool cacheable) {
    finished_ = true;
    stop();
    auto done = std::move(done_);
    done_ = nullptr;
    LookupOutcome outcome{std::move(addresses), std::move(error), cacheable, UINT32_MAX};
    for (const Family& family : families_)
      if (!family.addresses.empty()) outcome.ttl = std::min(outcome.ttl, family.ttl);
    if (done) done(std::move(outcome));
  }

  void stop() {
    ++round_;
    timer_.cancel();
    for (auto& socket : sockets_) {
      if (!socket) continue;
      boost::system::error_code ignored;
      socket->socket.close(ignored);
    }
  }

  std::shared_ptr<ResolverState> state_;
  std::string name_;
  std::vector<udp::endpoint> servers_;
  LookupDone done_;
  asio::steady_timer timer_;
  std::vector<std::unique_ptr<Socket>> sockets_;  // by server, opened on first use
  std::array<Family, 2> families_{Family(kTypeA), Family(kTypeAAAA)};
  std::vector<Sent> sent_;
  size_t server_ = 0;
  int attempt_ = 0;
  unsigned round_ = 0;
  std::string failure_;  // the last thing that went wrong with a server
  bool finished_ = false;
};

}  // namespace

struct Resolver::Impl : ResolverState {
  using ResolverState::ResolverState;
};

Resolver::Resolver(asio::io_context& io, ResolverConfig config)
    : impl_(std::make_shared<Impl>(io, std::move(config))) {
  for (const std::string& text : impl_->config.servers) {
    auto server = parse_server(text);
    if (!server) throw Error("DNS server \"" + text + "\": not an address or address:port");
    impl_->configured_servers.push_back(*server);
  }
}

Resolver::~Resolver() {
  impl_->closed = true;
  for (auto& weak : impl_->active)
    if (auto lookup = weak.lock()) lookup->cancel();
  impl_->active.clear();
}

void Resolver::resolve(const std::string& host, Callback done) {
  lookup(host, [done = std::move(done)](Resolution result) {
    done(std::move(result.addresses), std::move(result.error));
  });
}

void Resolver::lookup(const std::string& host, std::function<void(Resolution)> done) {
  auto impl = impl_;
  // Never call back from inside lookup(): the caller may still be setting up.
  auto later = [impl](std::function<void(Resolution)> callback, Resolution result) {
    asio::post(impl->io,
               [impl, callback = std::move(callback), result = std::move(result)]() mutable {
                 if (!impl->closed) callback(std::move(result));
               });
  };

  if (auto literal = Address::parse(host))
    return later(std::move(done), {{*literal}, "", Source::kLocal});
  auto name = normalize_host_name(host);
  if (!name)
    return later(std::move(done), {{}, "\"" + host + "\": not a valid host name", Source::kLocal});

  const HostsTable& hosts = impl->hosts.get(impl->config.hosts_file);
  if (auto entry = hosts.find(*name); entry != hosts.end())
    return later(std::move(done), {entry->second, "", Source::kLocal});

  if (const auto* entry = impl->cached(*name))
    return later(std::move(done), {entry->addresses, entry->error, Source::kCached});
  if (auto waiting = impl->pending.find(*name); waiting != impl->pending.end()) {
    waiting->second.push_back(std::move(done));  // one query for them all
    return;
  }

  std::vector<udp::endpoint> servers = impl->configured_servers;
  if (servers.empty()) servers = impl->resolv.get(impl->config.resolv_conf);
  if (servers.empty())
    return later(std::move(done),
                 {{},
                  *name + ": no DNS servers (no nameserver in " + impl->config.resolv_conf + ")",
                  Source::kLocal});

  if (!impl->take_token()) {
    std::ostringstream rate;
    rate << impl->config.query_rate;
    return later(std::move(done),
                 {{},
                  *name + ": too many DNS lookups (over " + rate.str() + " a second)",
                  Source::kRateLimited});
  }

  impl->pending[*name].push_back(std::move(done));
  ResolverState* state = impl.get();  // the lookup holds it alive
  auto finished = [state, name = *name](LookupOutcome outcome) {
    state->remember(name, outcome);
    auto waiting = state->pending.find(name);
    if (waiting == state->pending.end()) return;
    auto callbacks = std::move(waiting->second);
    state->pending.erase(waiting);
    Source source = Source::kUpstream;  // the first asked; the others shared its answer
    for (auto& callback : callbacks) {
      if (state->closed) return;
      callback({outcome.addresses, outcome.error, source});
      source = Source::kCached;
    }
  };
  impl->active.remove_if([](const std::weak_ptr<Lookup>& weak) { return weak.expired(); });
  auto lookup = std::make_shared<Lookup>(impl, *name, std::move(servers), std::move(finished));
  impl->active.push_back(lookup);
  lookup->start();
}

const char* source_name(Source source) {
  switch (source) {
    case Source::kLocal:
      return "local";
    case Source::kCached:
      return "cached";
    case Source::kUpstream:
      return "upstream";
    case Source::kRateLimited:
      return "rate_limited";
  }
  return "local";
}

}  // namespace openshell::net::dns
