// Egress: a sandbox reaches only what its policy allows, through its proxy,
// as root and rootless. Every server here is on 127.0.0.1, and the resolver
// is pointed at a test DNS server on 127.0.0.1: no traffic leaves the host.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"

using testing::ElementsAre;
using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

// An HTTP/1.1 server on 127.0.0.1 that keeps connections open and records
// each request it answers as "METHOD TARGET host=HOST body=BODY" (the body
// as sent with Content-Length, or chunked and decoded; a long run of one
// byte as "N bytes of X"). Unlike TestServer, which answers one request a
// connection, it would answer a second request that reached it on the same
// connection, so a test sees that it did.
class KeepAliveServer {
 public:
  KeepAliveServer() : server_([this](int fd) { serve(fd); }) {}
  std::string port() const { return std::to_string(server_.port()); }
  std::vector<std::string> requests() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  static std::string lower(std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  }
  static std::string field(const std::string& head, const std::string& name) {
    size_t at = lower(head).find("\r\n" + name + ":");
    if (at == std::string::npos) return "";
    size_t start = head.find_first_not_of(' ', at + name.size() + 3);
    return head.substr(start, head.find("\r\n", start) - start);
  }
  void serve(int fd) {
    std::string data;
    for (int idle_ms = 0; !server_.stopping() && idle_ms < 10000;) {
      for (size_t end; (end = data.find("\r\n\r\n")) != std::string::npos;) {
        std::string head = data.substr(0, end + 4), body;
        size_t next = 0;
        if (!take_http_body(data, end + 4, lower(field(head, "transfer-encoding")) == "chunked",
                            std::strtoul(field(head, "content-length").c_str(), nullptr, 10), &body,
                            &next))
          break;
        data.erase(0, next);
        std::string line = head.substr(0, head.find(" HTTP/"));
        if (body.size() > 100 && body.find_first_not_of(body[0]) == std::string::npos)
          body = std::to_string(body.size()) + " bytes of " + body[0];
        std::string request = line + " host=" + field(head, "host") + " body=" + body;
        size_t count;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          requests_.push_back(request);
          count = requests_.size();
        }
        std::string reply_body = "request " + std::to_string(count) + ": " + request + "\n";
        std::string reply =
            "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(reply_body.size()) +
            "\r\nKeep-Alive: timeout=10\r\n\r\n" + reply_body;
        if (::write(fd, reply.data(), reply.size()) < 0) break;
      }
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) {
        idle_ms += 100;
        continue;
      }
      char buf[4096];
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      data.append(buf, static_cast<size_t>(n));
      idle_ms = 0;
    }
    ::close(fd);
  }

  mutable std::mutex mutex_;
  std::vector<std::string> requests_;
  LoopbackTcpServer server_;  // last: its threads end before the rest goes
};

// A shell command in the sandbox that sends these bytes (printf escapes:
// \r\n) to the proxy on one connection and prints what comes back.
std::string to_proxy(const std::string& bytes) {
  return "printf '" + bytes + "' | nc 127.0.0.1 3128";
}

// The lines of a network log, each parsed (a line that is not JSON, or not
// UTF-8, fails the test).
std::vector<nlohmann::json> json_lines(const std::string& text) {
  std::vector<nlohmann::json> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    try {
      lines.push_back(nlohmann::json::parse(line));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a JSON line (" << e.what() << "): " << line.substr(0, 200);
    }
  }
  return lines;
}

const std::string kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

// Inside the sandbox: what a sandbox may send its proxy and DNS stub in
// bytes that are not UTF-8. A host of \377\376 for CONNECT, the same in a
// plain request's URL and Host field, a DNS label of them, and a connection
// from a program whose path holds them.
std::string non_utf8_attacks(const std::string& port) {
  return "printf 'CONNECT \\377\\376.example:443 HTTP/1.1\\r\\n\\r\\n' | nc 127.0.0.1 3128; "
         "printf 'GET http://\\377.example.test/ HTTP/1.1\\r\\nHost: \\376\\377\\r\\n\\r\\n' | nc "
         "127.0.0.1 3128; "
         "osh-probe dns-bad-label example.test; "
         "p=/tmp/$(printf '\\377\\376'); cp /usr/bin/osh-probe \"$p\" && \"$p\" proxy-connect "
         "localhost " +
         port + " echo; ";
}

// A refusal by the proxy, for this reason: osh-probe's "proxy: ..." line is
// a 403 and the answer names the reason. Neither an openshell failure (125)
// nor a missing program (127) is a refusal.
void expect_refused(const Result& r, const std::string& reason) {
  EXPECT_NE(r.status, 125) << r.err;
  EXPECT_NE(r.status, 127) << r.err;
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr(reason)) << r.out << r.err;
}

// busybox wget refused by the proxy: its error names the 403 (and it exits
// 1, not 125 or 127).
void expect_wget_refused(const Result& r) {
  EXPECT_EQ(r.status, 1) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("403 Forbidden")) << r.err;
  EXPECT_EQ(r.out, "");
}

size_t count_of(const std::string& text, const std::string& part) {
  size_t count = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++count;
  return count;
}

class Network : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    hosts_ = write_file(scratch() + "/hosts-" + mode_name(mode()),
                        "127.0.0.1 localhost api.test.openshell other.test.openshell "
                        "a.b.test.openshell test.openshell metadata.test.openshell\n");
  }
  Options env() {
    Options o;
    o.env = {"OPENSHELL_HOSTS_FILE=" + hosts_,
             "OPENSHELL_DNS_SERVERS=127.0.0.1:" + std::to_string(dns_.port())};
    return o;
  }
  std::string policy(const std::string& body) {
    static int counter = 0;
    return write_file(
        scratch() + "/net-" + mode_name(mode()) + "-" + std::to_string(++counter) + ".toml",
        "version = 1\n" + body);
  }
  std::string port() const { return std::to_string(server_.port()); }
  // A --network-log file the mode's user may write.
  std::string network_log(const std::string& name) {
    return make_dir(mode(), name + "-" + mode_name(mode()), 0777) + "/network.log";
  }
  std::string local_rule(const std::string& host = "localhost", const std::string& extra = "") {
    return "[network_policies.local]\nendpoints = [ { host = \"" + host + "\", port = " + port() +
           ", allowed_ips = [\"127.0.0.1/32\"] } ]\n" + extra;
  }
  Result run(const std::string& policy_file, const std::vector<std::string>& command,
             const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"--policy", policy_file};
    args.insert(args.end(), more.begin(), more.end());
    return sandbox(mode(), args, command, env());
  }

  TestServer server_;
  TestDnsServer dns_;
  std::string hosts_;
};
E2E_ALL_MODES(Network);

TEST_P(Network, AllowedHostWorksThroughTheProxy) {
  Result r = run(policy(local_rule()), {"wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "hello from the test server\n");
  Result c = run(policy(local_rule()), {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(c.status, 0) << c.out << c.err;
  EXPECT_THAT(c.out, HasSubstr("proxy: HTTP/1.1 200 Connection established"));
  EXPECT_THAT(c.out, HasSubstr("echo: ping through the proxy"));
}

TEST_P(Network, DeniedHostGets403) {
  std::string p = policy(local_rule());
  Result r = run(p, {"wget", "-q", "-O-", "http://other.test.openshell:" + port() + "/"});
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("server returned error: HTTP/1.1 403 Forbidden"));
  Result c = run(p, {"osh-probe", "proxy-connect", "localhost", "1", "status"});
  EXPECT_THAT(c.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden"));
  EXPECT_THAT(c.out, HasSubstr("no rule allows localhost:1"));
  EXPECT_EQ(server_.connections(), 0) << "a refused connection reached the server";
}

TEST_P(Network, DefaultIsDeny) {
  // A policy with a network part that allows nothing here.
  Result r = run(
      policy(
          "[network_policies.elsewhere]\nendpoints = [ { host = \"example.com\", port = 443 } ]\n"),
      {"osh-probe", "proxy-connect", "localhost", port(), "status"});
  EXPECT_THAT(r.out, HasSubstr("403 Forbidden"));
  EXPECT_EQ(server_.connections(), 0);
}

TEST_P(Network, DirectAndIpLiteralBypassFailsAtOnce) {
  std::string p = policy(local_rule());
  // Straight to the server: the sandbox's loopback is not the host's.
  Result direct = run(p, {"osh-probe", "connect", "127.0.0.1", port()});
  // Refused (a reset), not dropped: no wait for a timeout. The time is only
  // reported: a loaded machine may take long over an immediate refusal.
  EXPECT_THAT(direct.out, HasSubstr("denied: ECONNREFUSED"));
  EXPECT_THAT(direct.err, testing::MatchesRegex("connect took [0-9]+ ms\n"));
  // Any other address: no route at all, refused at once.
  Result outside = run(p, {"osh-probe", "connect", "93.184.216.34", "80"});
  EXPECT_THAT(outside.out, HasSubstr("denied: ENETUNREACH"));
  // Through the proxy by IP literal: not what the policy names.
  Result literal = run(p, {"osh-probe", "proxy-connect", "127.0.0.1", port(), "status"});
  EXPECT_THAT(literal.out, HasSubstr("403 Forbidden"));
  EXPECT_EQ(server_.connections(), 0);
}

TEST_P(Network, SsrfTargetsAreDenied) {
  // The rule names the host but gives no allowed_ips: loopback, private,
  // link-local (cloud metadata) and 0.0.0.0 addresses are refused.
  std::string p = policy(
      "[network_policies.open]\nendpoints = [ { host = \"localhost\", port = " + port() +
      " }, { host = \"169.254.169.254\", port = 80 }, { host = \"0.0.0.0\", port = " + port() +
      " }, { host = \"10.1.2.3\", port = 80 } ]\n");
  for (const auto& [host, p2, why] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"localhost", port(), "loopback"},
           {"169.254.169.254", "80", "link-local"},
           {"0.0.0.0", port(), "unspecified"},
           {"10.1.2.3", "80", "private"}}) {
    Result r = run(p, {"osh-probe", "proxy-connect", host, p2, "status"});
    EXPECT_THAT(r.out, HasSubstr("403 Forbidden")) << host;
    EXPECT_THAT(r.out, HasSubstr(why)) << host;
  }
  EXPECT_EQ(server_.connections(), 0);
}

TEST_P(Network, BinaryIdentityAllowsAndDenies) {
  // Only the probe may connect; busybox's wget may not. /usr/bin/wget is a
  // symlink to busybox: naming it allows busybox, the file it leads to.
  std::string probe_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/osh-probe\" } ]\n"));
  Result ok = run(probe_only, {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(ok.status, 0) << ok.out;
  Result no = run(probe_only, {"wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(no.status, 1) << no.err;
  EXPECT_THAT(no.err, HasSubstr("server returned error: HTTP/1.1 403 Forbidden"));
  std::string wget_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/wget\" } ]\n"));
  Result symlinked = run(wget_only, {"wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(symlinked.status, 0) << symlinked.err;
  EXPECT_EQ(symlinked.out, "hello from the test server\n");
  Result glob =
      run(policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/osh-*\" } ]\n")),
          {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(glob.status, 0) << glob.out;
}

// The binaries rule holds for every process that holds the connection: a
// program the policy does not name connects, starts one it names holding
// the inherited socket, and talks itself. The audit names the real one.
TEST_P(Network, BinariesRuleCountsEveryHolderOfTheSocket) {
  std::string wget_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/wget\" } ]\n"));
  std::string log = network_log("handoff");
  Result handoff =
      run(wget_only, {"osh-probe", "proxy-handoff", "localhost", port(), "/bin/sleep", "5"},
          {"--network-log", log});
  EXPECT_THAT(handoff.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << handoff.err;
  EXPECT_THAT(handoff.out,
              HasSubstr("not for /usr/bin/osh-probe (it holds the connection of /bin/busybox)"));
  EXPECT_EQ(server_.connections(), 0) << "the handed-off connection reached the server";
  std::string lines = file_contents(log);
  EXPECT_THAT(lines, HasSubstr("\"binary\":\"/usr/bin/osh-probe\""));
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"deny\""));
  EXPECT_THAT(lines, Not(HasSubstr("\"decision\":\"allow\"")));
  // The named binary alone is still allowed.
  Result alone = run(wget_only, {"wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(alone.status, 0) << alone.err;
  EXPECT_EQ(alone.out, "hello from the test server\n");
}

// The process that connects counts, even when it hides the socket while the
// proxy looks at its holders: it sends its own copy to itself (in flight in
// a socket pair, in no fd table), so that only a program the policy names
// holds it, and then takes it back and talks. The runtime saw it connect.
TEST_P(Network, BinariesRuleCountsTheProcessThatConnected) {
  std::string wget_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/wget\" } ]\n"));
  std::string log = network_log("hide");
  Result hidden =
      run(wget_only, {"osh-probe", "proxy-hide", "localhost", port(), "/bin/sleep", "5"},
          {"--network-log", log});
  EXPECT_THAT(hidden.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << hidden.err;
  // Refused for the process that connected; when the proxy's look at
  // accept came before the socket was hidden (a race the probe usually
  // wins, and then the holders alone would allow it), as its holder.
  EXPECT_THAT(hidden.out,
              testing::AnyOf(HasSubstr("not for /usr/bin/osh-probe (it made the connection"),
                             HasSubstr("not for /usr/bin/osh-probe (it holds the connection")))
      << hidden.out;
  EXPECT_EQ(server_.connections(), 0) << "the hidden connection reached the server";
  std::string lines = file_contents(log);
  EXPECT_THAT(lines, HasSubstr("\"binary\":\"/usr/bin/osh-probe\"")) << lines;
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"deny\""));
  EXPECT_THAT(lines, Not(HasSubstr("\"decision\":\"allow\"")));

  // Handed on for good: a later process takes the hidden socket, runs the
  // shell (a program the policy names) and asks, after the one that
  // connected has exited.
  std::string sh_only = policy(local_rule("localhost", "binaries = [ { path = \"/bin/sh\" } ]\n"));
  std::string pass_log = network_log("pass");
  Result passed =
      run(sh_only, {"osh-probe", "proxy-pass", "localhost", port()}, {"--network-log", pass_log});
  EXPECT_THAT(passed.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << passed.err;
  EXPECT_EQ(server_.connections(), 0) << "the handed-on connection reached the server";
  std::string pass_lines = file_contents(pass_log);
  EXPECT_THAT(pass_lines, HasSubstr("\"binary\":\"/usr/bin/osh-probe\"")) << pass_lines;
  EXPECT_THAT(pass_lines, testing::AnyOf(HasSubstr("(it made the connection"),
                                         HasSubstr("(it holds the connection")));
  EXPECT_THAT(pass_lines, Not(HasSubstr("\"decision\":\"allow\"")));

  // A named program that connects by itself is still allowed.
  Result alone = run(sh_only, {"sh", "-c", "wget -q -O- http://localhost:" + port() + "/"});
  EXPECT_EQ(alone.status, 0) << alone.err;
  EXPECT_EQ(alone.out, "hello from the test server\n");
}

// A socket connected without connect(2) (TCP Fast Open: sendto with
// MSG_FASTOPEN) has no connecting process the runtime saw: where a rule
// names binaries it is refused, even for a program the rule names; a rule
// without binaries still allows it.
TEST_P(Network, ASocketConnectedWithoutConnectIsRefusedWhereBinariesCount) {
  std::string probe_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/osh-probe\" } ]\n"));
  Result fast = run(probe_only, {"osh-probe", "proxy-fastopen", "localhost", port()});
  EXPECT_THAT(fast.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << fast.out << fast.err;
  EXPECT_THAT(fast.out, HasSubstr("the connecting process is unknown (not seen at connect)"));
  Result connected = run(probe_only, {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(connected.status, 0) << connected.out;
  Result any = run(policy(local_rule()), {"osh-probe", "proxy-fastopen", "localhost", port()});
  EXPECT_THAT(any.out, HasSubstr("proxy: HTTP/1.1 200")) << any.out << any.err;
}

// The same in a gateway's sandbox, whose supervisor serves the proxy: the
// process that connected counts for `sandbox exec`'s processes too.
TEST_P(Network, GatewaySandboxCountsTheProcessThatConnected) {
  std::string home = make_dir(mode(), "hidehome-" + mode_name(mode()), 0700);
  GatewayGuard gateway(mode(), home);  // whatever fails below, the gateway goes
  Options o = env();
  o.env.push_back("OPENSHELL_HOME=" + home);
  auto os = [&](const std::vector<std::string>& args) { return openshell(mode(), args, o); };
  std::string wget_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/wget\" } ]\n"));
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "hide", "--from", rootfs(), "--policy", wget_only}).status,
      0);
  Result hidden = os({"sandbox", "exec", "hide", "--", "osh-probe", "proxy-hide", "localhost",
                      port(), "/bin/sleep", "5"});
  EXPECT_THAT(hidden.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << hidden.out << hidden.err;
  EXPECT_THAT(hidden.out, HasSubstr("not for /usr/bin/osh-probe (it ")) << hidden.out;
  EXPECT_EQ(server_.connections(), 0) << "the hidden connection reached the server";
  Result alone = os(
      {"sandbox", "exec", "hide", "--", "wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(alone.status, 0) << alone.err;
  EXPECT_EQ(alone.out, "hello from the test server\n");
  Result audit = os({"logs", "hide", "--source", "network"});
  EXPECT_THAT(audit.out, HasSubstr("\"binary\":\"/usr/bin/osh-probe\"")) << audit.out;
  // The same decisions as OCSF events, one JSON object a line, and as text.
  Result ocsf = os({"logs", "hide", "--source", "network", "-o", "ocsf"});
  EXPECT_EQ(ocsf.status, 0) << ocsf.err;
  EXPECT_THAT(ocsf.out, HasSubstr("\"class_uid\":4001")) << ocsf.out;
  EXPECT_THAT(ocsf.out, HasSubstr("\"disposition\":\"Blocked\"")) << ocsf.out;
  EXPECT_THAT(ocsf.out, HasSubstr("\"path\":\"/usr/bin/osh-probe\"")) << ocsf.out;
  size_t events = 0;
  for (size_t at = 0, end; (end = ocsf.out.find('\n', at)) != std::string::npos; at = end + 1) {
    auto event = nlohmann::json::parse(ocsf.out.substr(at, end - at), nullptr, false);
    EXPECT_TRUE(event.is_object() && event.contains("type_uid")) << ocsf.out.substr(at, end - at);
    ++events;
  }
  EXPECT_GE(events, 2u) << ocsf.out;
  Result text = os({"logs", "hide", "--source", "network", "-o", "text"});
  EXPECT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr(" deny osh-probe(pid ")) << text.out;
  EXPECT_THAT(text.out, HasSubstr("-> localhost:" + port() + "  ")) << text.out;
  EXPECT_THAT(text.out, Not(HasSubstr("{"))) << text.out;
  Result wrong = os({"logs", "hide", "-o", "text"});
  EXPECT_NE(wrong.status, 0);
  EXPECT_THAT(wrong.err, HasSubstr("only the network log (--source network) has formats"));
  // Followed, converted as the lines come, until the sandbox stops.
  Result followed;
  std::thread follower([&] {
    followed = os({"logs", "hide", "--source", "network", "-f", "-o", "text"});
  });
  for (int i = 0; i < 3000 && processes_matching("logs hide --source network -f").empty(); ++i)
    ::usleep(10000);
  EXPECT_EQ(os({"sandbox", "stop", "hide"}).status, 0);
  follower.join();
  EXPECT_EQ(followed.status, 0) << followed.err;
  EXPECT_THAT(followed.out, HasSubstr(" deny osh-probe(pid ")) << followed.out;
  EXPECT_THAT(followed.out, Not(HasSubstr("{"))) << followed.out;
}

// The runtime looks at every connect() of a sandbox with egress: those that
// go elsewhere than the proxy (a server on the sandbox's own loopback) go on
// as before.
TEST_P(Network, ConnectsInsideTheSandboxStillWork) {
  Result r = run(policy(local_rule()), {"osh-probe", "loopback-connects", "200"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("ok: 200 connects")) << r.out;
  Result unix_socket = run(policy(local_rule()), {"osh-probe", "unix-connect"});
  EXPECT_THAT(unix_socket.out, HasSubstr("ok")) << unix_socket.out << unix_socket.err;
}

// A process of a named binary runs code from elsewhere: a preloaded library
// (LD_PRELOAD, LD_AUDIT) or a file mapped executable. It is not credited as
// that binary.
TEST_P(Network, BinariesRuleDoesNotCreditInjectedCode) {
  std::string probe_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/osh-probe\" } ]\n"));
  std::string log = network_log("injected");
  Result mapped =
      run(probe_only,
          {"sh", "-c",
           "cp /usr/bin/osh-probe /tmp/evil.so && osh-probe proxy-connect-mapped /tmp/evil.so "
           "localhost " +
               port()},
          {"--network-log", log});
  EXPECT_THAT(mapped.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << mapped.err;
  EXPECT_THAT(mapped.out, HasSubstr("is not credited as itself: code mapped from /tmp/evil.so"));
  for (const char* variable : {"LD_PRELOAD", "LD_AUDIT"}) {
    Result preloaded = run(probe_only,
                           {"env", std::string(variable) + "=/tmp/evil.so", "osh-probe",
                            "proxy-connect", "localhost", port(), "status"},
                           {"--network-log", log});
    EXPECT_THAT(preloaded.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << variable;
    EXPECT_THAT(preloaded.out, HasSubstr(std::string(variable) + " in its environment"))
        << preloaded.out;
  }
  EXPECT_EQ(server_.connections(), 0);
  std::string lines = file_contents(log);
  EXPECT_EQ(count_of(lines, "\"binary\":\"/usr/bin/osh-probe\""), 3u) << lines;
  EXPECT_EQ(count_of(lines, "\"decision\":\"deny\""), 3u) << lines;
  Result clean = run(probe_only, {"osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(clean.status, 0) << clean.out;
}

// Without a filesystem policy, `run` keeps /proc read-only: no process
// writes another's memory (and so makes a named binary do its bidding).
TEST_P(Network, ProcMemOfAnotherProcessIsNotWritable) {
  Result r = run(policy(local_rule()), {"osh-probe", "mem-write"});
  EXPECT_THAT(r.out, HasSubstr("denied: EROFS")) << r.out << r.err;
  Result none = sandbox(mode(), {}, {"osh-probe", "mem-write"});
  EXPECT_THAT(none.out, HasSubstr("denied: EROFS")) << none.out << none.err;
}

// A sandbox that opens many idle connections costs its proxy little: past
// the limit (512) they are refused with a 503 and an audit line, and the
// memory of those it held goes back when they close.
TEST_P(Network, IdleConnectionsAreCappedAndCostLittle) {
  const std::string hostname = "osh-mem-" + std::to_string(static_cast<int>(mode()));
  std::string log = network_log("idle");
  Result r;
  std::thread runner([&] {
    r = run(policy(local_rule()), {"osh-probe", "hold-connections", "1000", "4", "3", "512"},
            {"--network-log", log, "--hostname", hostname});
  });
  auto rss_kb = [&]() -> long {
    // openshell run itself, which serves the proxy (not the sandbox's processes).
    for (const auto& pid : processes_matching("--network-log " + log + " --hostname " + hostname)) {
      std::string status = file_contents("/proc/" + pid + "/status");
      size_t at = status.find("VmRSS:");
      if (at != std::string::npos) return std::atol(status.c_str() + at + 6);
    }
    return -1;
  };
  long first = -1, peak = 0, last = -1;
  for (int i = 0; i < 1500 && first < 0; ++i, ::usleep(20000)) first = rss_kb();
  for (long now; (now = rss_kb()) >= 0; ::usleep(50000)) {
    peak = std::max(peak, now);
    last = now;
  }
  runner.join();
  ASSERT_GT(first, 0) << "no openshell process found";
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("open 512 refused 488"));
  EXPECT_LT(peak - first, 64 * 1024)
      << "the proxy grew from " << first << " kB to " << peak << " kB";
  EXPECT_LT(last - first, 16 * 1024)
      << "after the connections closed: " << last << " kB, from " << first;
  EXPECT_THAT(file_contents(log),
              HasSubstr("too many connections to the proxy (the limit is 512)"));
}

// Identifying the caller reads a bounded number of /proc entries: a sandbox
// with more processes and fds than that is refused (fail closed) where a rule
// names binaries, quickly, and a small one is identified as before.
TEST_P(Network, IdentityLookupIsBounded) {
  std::string probe_only =
      policy(local_rule("localhost", "binaries = [ { path = \"/usr/bin/osh-probe\" } ]\n"));
  std::string log = network_log("crowd");
  Result crowd = run(probe_only, {"osh-probe", "fd-crowd", "120", "1000", "localhost", port()},
                     {"--network-log", log});
  EXPECT_THAT(crowd.out, HasSubstr("proxy: HTTP/1.1 403 Forbidden")) << crowd.out << crowd.err;
  EXPECT_THAT(crowd.out, HasSubstr("identity lookup budget exceeded"));
  EXPECT_THAT(file_contents(log), HasSubstr("identity lookup budget exceeded"));
  long ms = std::atol(crowd.out.c_str() + crowd.out.find("answered in ") + 12);
  EXPECT_LT(ms, 10000) << crowd.out;
  Result small = run(probe_only, {"osh-probe", "fd-crowd", "20", "100", "localhost", port()});
  EXPECT_THAT(small.out, HasSubstr("proxy: HTTP/1.1 200 Connection established")) << small.out;
}

TEST_P(Network, WildcardHosts) {
  std::string p = policy(local_rule("*.test.openshell"));
  for (const std::string host : {"api.test.openshell", "other.test.openshell"}) {
    Result r = run(p, {"wget", "-q", "-O-", "http://" + host + ":" + port() + "/"});
    EXPECT_EQ(r.status, 0) << host << ": " << r.err;
    EXPECT_EQ(r.out, "hello from the test server\n") << host;
  }
  const int allowed = server_.connections();
  EXPECT_EQ(allowed, 2);
  // Neither the bare domain nor a deeper name: refused by the proxy, as no
  // rule's, and they never reach the server.
  for (const std::string host : {"test.openshell", "a.b.test.openshell"}) {
    expect_wget_refused(run(p, {"wget", "-q", "-O-", "http://" + host + ":" + port() + "/"}));
    expect_refused(run(p, {"osh-probe", "proxy-connect", host, port(), "status"}),
                   "no rule allows " + host + ":" + port());
  }
  EXPECT_EQ(server_.connections(), allowed) << "a refused name reached the server";
}

TEST_P(Network, WebSocketUpgradeAndLongConnections) {
  std::string p = policy(local_rule());
  Result up = run(p, {"osh-probe", "proxy-connect", "localhost", port(), "upgrade"});
  EXPECT_EQ(up.status, 0) << up.out;
  EXPECT_THAT(up.out, HasSubstr("upgrade: HTTP/1.1 101 Switching Protocols"));
  EXPECT_THAT(up.out, HasSubstr("echo: ping through the proxy"));
  Result idle = run(p, {"osh-probe", "proxy-connect", "localhost", port(), "idle"});
  EXPECT_EQ(idle.status, 0) << idle.out;
}

// Plain HTTP with keep-alive: a second request on the same connection to the
// proxy, for another host, must not reach the first request's server. The
// proxy answers the first with `Connection: close` and forwards nothing
// after it; the client sends the second again on a new connection (as curl
// does), where it is checked, refused and logged.
TEST_P(Network, EveryPlainHttpRequestIsChecked) {
  KeepAliveServer server;
  const std::string api = "api.test.openshell:" + server.port();
  const std::string other = "other.test.openshell:" + server.port();
  std::string p =
      policy("[network_policies.api]\nendpoints = [ { host = \"api.test.openshell\", port = " +
             server.port() + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  std::string log = network_log("keepalive");
  const std::string second =
      "GET http://" + other + "/b HTTP/1.1\\r\\nHost: " + other + "\\r\\n\\r\\n";
  Result r = run(p,
                 {"sh", "-c",
                  to_proxy("GET http://" + api + "/a HTTP/1.1\\r\\nHost: " + api +
                           "\\r\\nProxy-Connection: Keep-Alive\\r\\n\\r\\n" + second) +
                      "; echo '-- again'; " + to_proxy(second)},
                 {"--network-log", log});
  EXPECT_EQ(r.status, 0) << r.err;
  std::string first = r.out.substr(0, r.out.find("-- again"));
  std::string again = r.out.substr(first.size());
  EXPECT_EQ(count_of(first, "HTTP/1.1 "), 1u) << r.out;
  EXPECT_THAT(first, HasSubstr("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(first, HasSubstr("\r\nConnection: close\r\n"));
  EXPECT_THAT(first, Not(HasSubstr("Keep-Alive")));
  EXPECT_THAT(first, HasSubstr("request 1: GET /a host=" + api + " body=\n"));
  EXPECT_THAT(again, HasSubstr("HTTP/1.1 403 Forbidden"));
  EXPECT_THAT(again, HasSubstr("no rule allows " + other));
  EXPECT_THAT(server.requests(), ElementsAre("GET /a host=" + api + " body="));
  std::string lines = file_contents(log);
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"allow\",\"host\":\"api.test.openshell\""));
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"deny\",\"host\":\"other.test.openshell\""));
  EXPECT_EQ(count_of(lines, "\n"), 2u) << lines;
}

// Request bodies go through whole, by Content-Length or chunked, and what
// follows a body on the same connection goes nowhere.
TEST_P(Network, PostBodiesGoThroughAndNothingAfterThem) {
  KeepAliveServer server;
  const std::string api = "api.test.openshell:" + server.port();
  const std::string other = "other.test.openshell:" + server.port();
  std::string p =
      policy("[network_policies.api]\nendpoints = [ { host = \"api.test.openshell\", port = " +
             server.port() + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  const std::string smuggled =
      "GET http://" + other + "/smuggled HTTP/1.1\\r\\nHost: " + other + "\\r\\n\\r\\n";
  // 100000 bytes: the body takes several reads on its way through.
  Result large = run(
      p, {"sh", "-c",
          "{ printf 'POST http://" + api + "/large HTTP/1.1\\r\\nHost: " + api +
              "\\r\\nContent-Length: 100000\\r\\n\\r\\n'; head -c 100000 /dev/zero | tr '\\000' x; "
              "printf '" +
              smuggled + "'; } | nc 127.0.0.1 3128"});
  EXPECT_EQ(large.status, 0) << large.err;
  EXPECT_THAT(large.out, HasSubstr("POST /large host=" + api + " body=100000 bytes of x\n"));
  // The Host field comes from the URL: a client's other Host never reaches the server.
  Result length = run(p, {"sh", "-c",
                          to_proxy("POST http://" + api + "/length HTTP/1.1\\r\\nHost: " + other +
                                   "\\r\\nContent-Length: 11\\r\\n\\r\\nhello world" + smuggled)});
  EXPECT_EQ(length.status, 0) << length.err;
  EXPECT_THAT(length.out, HasSubstr("POST /length host=" + api + " body=hello world\n"));
  EXPECT_EQ(count_of(length.out, "HTTP/1.1 "), 1u) << length.out;
  Result chunked = run(p, {"sh", "-c",
                           to_proxy("POST http://" + api + "/chunked HTTP/1.1\\r\\nHost: " + api +
                                    "\\r\\nTransfer-Encoding: chunked\\r\\n\\r\\n"
                                    "5\\r\\nhello\\r\\n6;ext=1\\r\\n world\\r\\n0\\r\\n\\r\\n" +
                                    smuggled)});
  EXPECT_EQ(chunked.status, 0) << chunked.err;
  EXPECT_THAT(chunked.out, HasSubstr("POST /chunked host=" + api + " body=hello world\n"));
  EXPECT_EQ(count_of(chunked.out, "HTTP/1.1 "), 1u) << chunked.out;
  EXPECT_THAT(server.requests(), ElementsAre("POST /large host=" + api + " body=100000 bytes of x",
                                             "POST /length host=" + api + " body=hello world",
                                             "POST /chunked host=" + api + " body=hello world"));
  // A body whose end is ambiguous is refused before anything is sent.
  Result ambiguous = run(p, {"sh", "-c",
                             to_proxy("POST http://" + api +
                                      "/both HTTP/1.1\\r\\nContent-Length: 3\\r\\n"
                                      "Transfer-Encoding: chunked\\r\\n\\r\\n0\\r\\n\\r\\n")});
  EXPECT_THAT(ambiguous.out, HasSubstr("HTTP/1.1 400 Bad Request"));
  EXPECT_EQ(server.requests().size(), 3u);
}

// A WebSocket upgrade over plain HTTP (not in a CONNECT tunnel): after the
// 101, the connection is a tunnel to that server.
TEST_P(Network, PlainHttpWebSocketUpgrade) {
  Result r = run(
      policy(local_rule()),
      {"sh", "-c",
       to_proxy(
           "GET http://localhost:" + port() + "/chat HTTP/1.1\\r\\nHost: localhost:" + port() +
           "\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\\r\\nSec-WebSocket-Version: 13\\r\\n\\r\\n"
           "ping over the upgrade\\n")});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("HTTP/1.1 101 Switching Protocols\r\n"));
  EXPECT_THAT(r.out, HasSubstr("ping over the upgrade\n"));
  EXPECT_EQ(server_.connections(), 1);
}

TEST_P(Network, DnsResolvesOnlyAllowedNames) {
  std::string p = policy(local_rule("*.test.openshell"));
  Result allowed = run(p, {"nslookup", "api.test.openshell"});
  EXPECT_EQ(allowed.status, 0) << allowed.out << allowed.err;
  EXPECT_THAT(allowed.out, HasSubstr("127.0.0.1"));
  int before = dns_.queries();
  Result other = run(p, {"nslookup", "example.com"});
  EXPECT_EQ(other.status, 1) << other.out << other.err;
  EXPECT_THAT(other.out + other.err, HasSubstr("can't find example.com: NXDOMAIN"));
  EXPECT_EQ(dns_.queries(), before) << "a name no rule allows was asked upstream";
  // An allowed name that the hosts file does not have goes upstream.
  Result upstream = run(policy(local_rule("*.example.org")), {"nslookup", "www.example.org"});
  EXPECT_GT(dns_.queries(), before) << upstream.out << upstream.err;
}

TEST_P(Network, EveryDecisionIsAudited) {
  std::string log = scratch() + "/network-" + mode_name(mode()) + ".log";
  ::unlink(log.c_str());
  make_dir(mode(), "audit-" + mode_name(mode()), 0777);
  std::string log_path = scratch() + "/audit-" + mode_name(mode()) + "/network.log";
  run(policy(local_rule()),
      {"sh", "-c",
       "wget -q -O- http://localhost:" + port() +
           "/ >/dev/null; osh-probe proxy-connect localhost 1 status"},
      {"--network-log", log_path});
  std::string lines = file_contents(log_path);
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"allow\""));
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"deny\""));
  for (const char* field : {"\"time\":", "\"sandbox\":", "\"binary\":\"/bin/busybox\"", "\"pid\":",
                            "\"host\":\"localhost\"", "\"port\":", "\"rule\":\"local\""})
    EXPECT_THAT(lines, HasSubstr(field)) << lines;
}

TEST_P(Network, MalformedPoliciesAreRejectedWithLineAndField) {
  std::string bad =
      policy("[network_policies.x]\nendpoints = [ { host = \"*.com\", port = 443 } ]\n");
  Result v = openshell(mode(), {"policy", "validate", bad});
  EXPECT_EQ(v.status, 125);
  EXPECT_THAT(v.err, HasSubstr(bad + ":3: network_policies.x.endpoints[0].host"));
  std::string noport =
      policy("[network_policies.x]\nendpoints = [ { host = \"a.example.com\" } ]\n");
  Result r = run(noport, {"true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("needs a port"));
  // A bad allowed_ips entry is refused when the policy is read, not when the
  // proxy loads it.
  for (const char* entry : {"nonsense", "10.0.0.0/33", "1.2.3.4/"}) {
    std::string ips = policy(
        "[network_policies.x]\nendpoints = [ { host = \"a.example.com\", port = 443, "
        "allowed_ips = [\"10.0.0.0/8\",\n  \"" +
        std::string(entry) + "\"] } ]\n");
    Result invalid = openshell(mode(), {"policy", "validate", ips});
    EXPECT_EQ(invalid.status, 125) << entry;
    EXPECT_THAT(invalid.err,
                HasSubstr(ips + ":4: network_policies.x.endpoints[0].allowed_ips[1]: \"" + entry +
                          "\" is not an IP address or CIDR"));
    Result refused = run(ips, {"true"});
    EXPECT_EQ(refused.status, 125) << entry;
    EXPECT_THAT(refused.err, HasSubstr(ips + ":4: network_policies.x.endpoints[0].allowed_ips[1]"));
  }
  Result ok = openshell(mode(), {"policy", "validate", policy(local_rule())});
  EXPECT_EQ(ok.status, 0) << ok.err;
  EXPECT_THAT(ok.out, HasSubstr("valid (1 network policies, 1 endpoints)"));
}

// Bytes that are not UTF-8 in what the sandbox sends made the audit line's
// JSON dump throw: `openshell run` aborted (134) and a gateway sandbox's
// supervisor died. The run must end with the command's own status, after
// an allowed request still went through, and every audit line must be JSON.
TEST_P(Network, BytesThatAreNotUtf8NeitherEndTheRunNorBreakTheAuditLog) {
  std::string log = network_log("utf8");
  Result r = run(
      policy(local_rule("localhost", "") +
             "[network_policies.wild]\nendpoints = [ { host = \"*.example.test\", port = 80 } ]\n"),
      {"sh", "-c",
       non_utf8_attacks(port()) + "wget -q -O- http://localhost:" + port() + "/ && exit 7"},
      {"--network-log", log});
  EXPECT_EQ(r.status, 7) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("403 Forbidden"));
  EXPECT_THAT(r.out, HasSubstr("no answer"));  // the bad label: dropped, as any malformed query
  EXPECT_THAT(r.out, HasSubstr("proxy: HTTP/1.1 200"));
  EXPECT_THAT(r.out, HasSubstr("echo: ping through the proxy"));
  EXPECT_THAT(r.out, HasSubstr("hello from the test server"));
  bool host_seen = false, binary_seen = false;
  for (const auto& line : json_lines(file_contents(log))) {
    std::string host = line.value("host", ""), binary = line.value("binary", "");
    if (host == kReplacement + kReplacement + ".example" && line["decision"] == "deny")
      host_seen = true;
    if (binary == "/tmp/" + kReplacement + kReplacement && line["decision"] == "allow")
      binary_seen = true;
  }
  EXPECT_TRUE(host_seen) << file_contents(log);
  EXPECT_TRUE(binary_seen) << file_contents(log);
}

TEST_P(Network, BytesThatAreNotUtf8LeaveAGatewaySandboxServing) {
  std::string home = make_dir(mode(), "utf8home-" + mode_name(mode()), 0700);
  GatewayGuard gateway(mode(), home);  // whatever fails below, the gateway goes
  Options o = env();
  o.env.push_back("OPENSHELL_HOME=" + home);
  auto os = [&](const std::vector<std::string>& args) { return openshell(mode(), args, o); };
  ASSERT_EQ(os({"sandbox", "create", "--name", "utf8", "--from", rootfs(), "--policy",
                policy(local_rule())})
                .status,
            0);
  Result attacks =
      os({"sandbox", "exec", "utf8", "--", "sh", "-c", non_utf8_attacks(port()) + "exit 3"});
  EXPECT_EQ(attacks.status, 3) << attacks.out << attacks.err;
  EXPECT_THAT(attacks.out, HasSubstr("403 Forbidden"));
  EXPECT_THAT(attacks.out, HasSubstr("proxy: HTTP/1.1 200"));
  // The supervisor is still there: a later exec and an allowed request work.
  Result after = os(
      {"sandbox", "exec", "utf8", "--", "wget", "-q", "-O-", "http://localhost:" + port() + "/"});
  EXPECT_EQ(after.status, 0) << after.err;
  EXPECT_EQ(after.out, "hello from the test server\n");
  EXPECT_THAT(os({"sandbox", "get", "utf8", "-o", "json"}).out, HasSubstr("\"phase\": \"Ready\""));
  Result audit = os({"logs", "utf8", "--source", "network"});
  std::vector<nlohmann::json> lines = json_lines(audit.out);
  EXPECT_GE(lines.size(), 4u) << audit.out << audit.err;
  EXPECT_THAT(audit.out, HasSubstr(kReplacement + kReplacement + ".example"));
  EXPECT_THAT(audit.out, HasSubstr("\"binary\":\"/tmp/" + kReplacement + kReplacement + "\""));
}

// --network-log followed a link at its path: whoever could plant one made
// the proxy's lines land in a file of their choosing (as root: any file).
TEST_P(Network, TheNetworkLogIsNeverOpenedThroughASymbolicLink) {
  std::string dir = make_dir(mode(), "loglink-" + mode_name(mode()), 0777);
  std::string target = write_file(dir + "/precious", "keep me\n", 0666);
  std::string link = dir + "/network.log";
  ::unlink(link.c_str());
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  std::string p = policy(local_rule());
  Result r = run(p, {"echo", "ran"}, {"--network-log", link});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: --network-log " + link +
                       ": is a symbolic link (a log file is never opened through one)\n");
  EXPECT_EQ(r.out, "") << "nothing ran";
  EXPECT_EQ(file_contents(target), "keep me\n");
  // A dangling link does not create its target either.
  std::string dangling = dir + "/dangling.log";
  ::unlink(dangling.c_str());
  ASSERT_EQ(::symlink((dir + "/created").c_str(), dangling.c_str()), 0);
  EXPECT_EQ(run(p, {"true"}, {"--network-log", dangling}).status, 125);
  EXPECT_EQ(::access((dir + "/created").c_str(), F_OK), -1);
  // Nor a FIFO (a reader's end) or a device.
  std::string fifo = dir + "/fifo";
  ::unlink(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0666), 0);
  ::chmod(fifo.c_str(), 0666);  // the mode's user may open it: only its type is wrong
  Result f = run(p, {"true"}, {"--network-log", fifo});
  EXPECT_EQ(f.status, 125);
  EXPECT_EQ(f.err, "openshell: --network-log " + fifo + ": is not a regular file\n");
  EXPECT_EQ(run(p, {"true"}, {"--network-log", "/dev/null"}).status, 125);
  Result bad = run(p, {"true"}, {"--network-log", dir + "/ok.log", "--network-log-max", "1k"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_EQ(bad.err, "openshell: --network-log-max 1k: not a size of at least 4K (like 16M)\n");
}

// 500 refusals of hosts of 60000 bytes once wrote 60 MB at once: a line was
// as long as its host, twice, and the file had no bound. (A request head is
// now at most 16 KiB, so the hosts here are 16000 bytes.)
TEST_P(Network, TheNetworkLogIsBoundedAndItsLinesShort) {
  std::string log = network_log("logcap");
  ::unlink(log.c_str());
  ::unlink((log + ".1").c_str());
  Result r = run(policy(local_rule()), {"osh-probe", "proxy-flood", "500", "16000"},
                 {"--network-log", log, "--network-log-max", "64K"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("refused=500"));
  struct stat now {
  }, older{};
  ASSERT_EQ(::stat(log.c_str(), &now), 0);
  ASSERT_EQ(::stat((log + ".1").c_str(), &older), 0) << "rotated into FILE.1";
  EXPECT_LE(now.st_size, 64 * 1024);
  EXPECT_LE(older.st_size, 64 * 1024);
  EXPECT_EQ(now.st_mode & 07777, 0600u);
  std::string text = file_contents(log + ".1") + file_contents(log);
  std::vector<nlohmann::json> lines = json_lines(text);
  ASSERT_FALSE(lines.empty());
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) EXPECT_LT(line.size(), 2048u);
  EXPECT_THAT(lines.back()["host"].get<std::string>(), HasSubstr("...(160"));
}

// A wildcard endpoint let a sandbox send names of its choosing upstream,
// each time asked: an exfiltration channel and an amplifier. The same name
// is asked once; a flood of fresh names goes upstream only at the rate.
TEST_P(Network, DnsAnswersAreCachedAndLookupsUpstreamRateLimited) {
  std::string p = policy(
      "[network_policies.wild]\nendpoints = [ { host = \"*.example.test\", port = 443, "
      "allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  int before = dns_.queries();
  Result same = run(p, {"osh-probe", "dns-query", "same.example.test", "20"});
  EXPECT_EQ(same.status, 0) << same.err;
  EXPECT_THAT(same.out, HasSubstr("noerror=20 "));
  EXPECT_EQ(dns_.queries() - before, 2) << "one lookup upstream (an A and an AAAA query), not 20";

  std::string log = network_log("dnsflood");
  ::unlink(log.c_str());
  before = dns_.queries();
  auto start = std::chrono::steady_clock::now();
  Result flood =
      run(p, {"osh-probe", "dns-query", "*.example.test", "200"}, {"--network-log", log});
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(flood.status, 0) << flood.err;
  int upstream = dns_.queries() - before;
  // The default limit: a burst of 50 lookups, then 20 a second.
  EXPECT_LE(upstream, 2 * (50 + 20 * elapsed + 1)) << "over " << elapsed << " s";
  EXPECT_GE(upstream, 2 * 50);
  int noerror = 0, refused = 0;
  std::sscanf(flood.out.c_str(), "noerror=%d nxdomain=%*d refused=%d", &noerror, &refused);
  EXPECT_GT(refused, 0) << flood.out;
  EXPECT_EQ(noerror + refused, 200) << flood.out;
  EXPECT_LE(2 * noerror, upstream) << "each answer took a lookup (an A and an AAAA query)";
  std::vector<nlohmann::json> lines = json_lines(file_contents(log));
  int upstream_lines = 0, limited_lines = 0, limited = 0;
  for (const auto& line : lines) {
    if (line["kind"] != "dns") continue;
    if (line["decision"] == "upstream") {
      ++upstream_lines;
      EXPECT_EQ(line["qtype"], "A");
      EXPECT_EQ(line["answers"], 1);
    }
    if (line["decision"] == "rate_limited") {
      ++limited_lines;
      limited += line["refused"].get<int>();
    }
  }
  EXPECT_EQ(upstream_lines, noerror) << "each lookup upstream is audited";
  EXPECT_GE(limited_lines, 1);
  EXPECT_LE(limited_lines, elapsed + 1) << "at most one rate_limited line a second";
  EXPECT_GE(limited, 1);
  EXPECT_LE(limited, refused);
}

// A client that resets its tunnel while the server still sends makes the
// proxy's next writes fail with EPIPE: the sandbox's supervisor (which
// serves the proxy) must take that as the end of one connection, not die.
TEST_P(Network, AResetTunnelLeavesTheSandboxServing) {
  std::string home = make_dir(mode(), "resethome-" + mode_name(mode()), 0700);
  GatewayGuard gateway(mode(), home);  // whatever fails below, the gateway goes
  Options o = env();
  o.env.push_back("OPENSHELL_HOME=" + home);
  auto os = [&](const std::vector<std::string>& args) { return openshell(mode(), args, o); };
  ASSERT_EQ(os({"sandbox", "create", "--name", "rst", "--from", rootfs(), "--policy",
                policy(local_rule())})
                .status,
            0);
  for (int i = 0; i < 3; ++i) {
    Result reset = os({"sandbox", "exec", "rst", "--", "osh-probe", "proxy-connect", "localhost",
                       port(), "reset"});
    EXPECT_THAT(reset.out, HasSubstr("reset")) << reset.err;
  }
  // The proxy has met each reset (its writes of the echoes failed) once it
  // has closed the tunnel's other end.
  for (int i = 0; i < 3000 && server_.finished() < 3; ++i) ::usleep(10000);
  EXPECT_EQ(server_.finished(), 3) << "the proxy kept a reset tunnel open";
  Result after = os(
      {"sandbox", "exec", "rst", "--", "osh-probe", "proxy-connect", "localhost", port(), "echo"});
  EXPECT_EQ(after.status, 0) << after.out << after.err;
  EXPECT_THAT(os({"sandbox", "get", "rst", "-o", "json"}).out, HasSubstr("\"phase\": \"Ready\""));
}

// Policies of long-lived sandboxes change live: the network part applies to
// new connections at once, revisions are kept, a bad one changes nothing.
TEST_P(Network, LivePolicyUpdatesFlipAllowAndDeny) {
  std::string home = make_dir(mode(), "nethome-" + mode_name(mode()), 0700);
  GatewayGuard gateway(mode(), home);  // whatever fails below, the gateway goes
  Options o = env();
  o.env.push_back("OPENSHELL_HOME=" + home);
  auto os = [&](const std::vector<std::string>& args) { return openshell(mode(), args, o); };
  std::string allow = policy(local_rule());
  std::string deny =
      policy("[network_policies.local]\nendpoints = [ { host = \"localhost\", port = 1 } ]\n");
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "live", "--from", rootfs(), "--policy", allow}).status, 0);
  const std::vector<std::string> fetch = {
      "sandbox", "exec", "live", "--", "wget", "-q", "-O-", "http://localhost:" + port() + "/"};
  const std::vector<std::string> probe = {
      "sandbox", "exec", "live", "--", "osh-probe", "proxy-connect", "localhost", port(), "status"};
  Result first = os(fetch);
  EXPECT_EQ(first.status, 0) << first.err;
  EXPECT_EQ(first.out, "hello from the test server\n");
  for (int round = 0; round < 2; ++round) {
    Result set = os({"policy", "set", "live", "--policy", deny});
    EXPECT_EQ(set.status, 0) << set.err;
    EXPECT_THAT(set.out, HasSubstr("applied to new connections"));
    expect_wget_refused(os(fetch));
    expect_refused(os(probe), "no rule allows localhost:" + port());
    ASSERT_EQ(os({"policy", "set", "live", "--policy", allow}).status, 0);
    Result again = os(fetch);
    EXPECT_EQ(again.status, 0) << again.err;
    EXPECT_EQ(again.out, "hello from the test server\n");
  }
  // Revisions are kept and readable.
  Result list = os({"policy", "list", "live"});
  EXPECT_THAT(list.out, HasSubstr("5 "));
  Result rev2 = os({"policy", "get", "live", "--rev", "2"});
  EXPECT_THAT(rev2.out, HasSubstr("port = 1"));
  // update: add and remove an endpoint.
  Result removed = os({"policy", "update", "live", "--remove-endpoint", "localhost:" + port()});
  EXPECT_EQ(removed.status, 0) << removed.err;
  expect_wget_refused(os(fetch));
  expect_refused(os(probe), "no rule allows localhost:" + port());
  Result added = os({"policy", "update", "live", "--add-endpoint", "localhost:" + port()});
  EXPECT_EQ(added.status, 0) << added.err;
  // Without allowed_ips the SSRF guard refuses loopback: still denied, but by the address check.
  expect_wget_refused(os(fetch));
  Result guarded = os(probe);
  expect_refused(guarded, "loopback");
  EXPECT_THAT(guarded.out, Not(HasSubstr("no rule allows"))) << guarded.out;
  // A bad policy is refused and the running one stays.
  std::string bad = policy("[network_policies.x]\nendpoints = [ { host = \"*\", port = 1 } ]\n");
  Result refused = os({"policy", "set", "live", "--policy", bad});
  EXPECT_EQ(refused.status, 125);
  EXPECT_THAT(refused.err, HasSubstr(":3: network_policies.x.endpoints[0].host"));
  // Changes that race each other are each applied and acknowledged.
  std::vector<Result> racing(4);
  std::vector<std::thread> setters;
  for (size_t i = 0; i < racing.size(); ++i)
    setters.emplace_back([&, i] {
      racing[i] = os({"policy", "set", "live", "--policy", i % 2 ? allow : deny});
    });
  for (auto& t : setters) t.join();
  for (const auto& r : racing) {
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("applied to new connections")) << r.out << r.err;
  }
  ASSERT_EQ(os({"policy", "set", "live", "--policy", allow}).status, 0);
  Result last = os(fetch);
  EXPECT_EQ(last.status, 0) << last.err;
  EXPECT_EQ(last.out, "hello from the test server\n");
  // The audit log, through the gateway.
  Result audit = os({"logs", "live", "--source", "network"});
  EXPECT_THAT(audit.out, HasSubstr("\"decision\":\"deny\""));
  EXPECT_THAT(audit.out, HasSubstr("\"decision\":\"allow\""));
}

// Revoking an endpoint closes the tunnels to it that are open, at once
// (well within the policy update's answer), and audits each close; a
// tunnel the new policy allows stays.
TEST_P(Network, RevokedEndpointClosesItsOpenTunnels) {
  std::string home = make_dir(mode(), "revokehome-" + mode_name(mode()), 0700);
  GatewayGuard gateway(mode(), home);  // whatever fails below, the gateway goes
  Options o = env();
  o.env.push_back("OPENSHELL_HOME=" + home);
  auto os = [&](const std::vector<std::string>& args) { return openshell(mode(), args, o); };
  TestServer other;
  const std::string b_port = std::to_string(other.port());
  std::string both =
      policy("[network_policies.local]\nendpoints = [ { host = \"localhost\", port = " + port() +
             ", allowed_ips = [\"127.0.0.1/32\"] }, { host = \"localhost\", port = " + b_port +
             ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "revoke", "--from", rootfs(), "--policy", both}).status,
      0);
  Result watch;
  std::thread watcher([&] {
    watch = os({"sandbox", "exec", "revoke", "--", "osh-probe", "tunnel-watch", "localhost", port(),
                b_port, "60"});
  });
  // Both tunnels are up once both servers have their connection.
  for (int i = 0; i < 600 && (server_.connections() < 1 || other.connections() < 1); ++i)
    ::usleep(50000);
  EXPECT_EQ(server_.connections(), 1);
  Result removed = os({"policy", "update", "revoke", "--remove-endpoint", "localhost:" + port()});
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  const long updated_ms = static_cast<long>(t.tv_sec) * 1000 + t.tv_nsec / 1000000;
  EXPECT_EQ(removed.status, 0) << removed.err;
  watcher.join();
  EXPECT_THAT(watch.out, HasSubstr("open\n")) << watch.out << watch.err;
  size_t at = watch.out.find("a closed at ");
  ASSERT_NE(at, std::string::npos) << "the revoked tunnel stayed open:\n" << watch.out;
  long closed_ms = std::atol(watch.out.c_str() + at + 12);
  // At once, in fact: the bound leaves room for a loaded machine.
  EXPECT_LT(closed_ms - updated_ms, 10000) << watch.out;
  EXPECT_THAT(watch.out, Not(HasSubstr("b closed")));
  EXPECT_THAT(watch.out, HasSubstr("b echo ok"));
  Result audit = os({"logs", "revoke", "--source", "network"});
  EXPECT_THAT(audit.out, HasSubstr("\"decision\":\"closed\""));
  EXPECT_THAT(audit.out,
              HasSubstr("\"reason\":\"policy revision 2: no rule allows localhost:" + port()));
  EXPECT_EQ(count_of(audit.out, "\"decision\":\"closed\""), 1u) << audit.out;
}

}  // namespace
}  // namespace e2e
