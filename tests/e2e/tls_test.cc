// The gateway over TCP with mutual TLS, through the real command line: a
// gateway of home_ listens on 127.0.0.1 (a port the kernel picks) with the
// certificates `gateway generate-certs` made; the commands reach it with
// --gateway-endpoint https://..., from a home of their own whose tls/ holds
// the credentials under test. Refusals each have their own line.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "../tls_certs.h"
#include "harness.h"

using testing::HasSubstr;
using testing::StartsWith;

namespace e2e {
namespace {

using openshell::testing::TestCert;

// A command line run through sh as root, with its status and its output
// (both streams).
Result shell(const std::string& command) {
  Result r;
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) return r;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, n);
  int status = ::pclose(pipe);
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

// One HTTP request over TLS 1.3 with OpenSSL itself, as another client
// would send it (cert "" shows none): what came back, or "<tls: REASON>".
std::string tls_request(const std::string& host_port, const std::string& ca,
                        const std::string& cert, const std::string& key,
                        const std::string& request) {
  const std::string host = host_port.substr(0, host_port.rfind(':'));
  const int port = std::stoi(host_port.substr(host_port.rfind(':') + 1));
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, host.c_str(), &address.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return "<connect failed>";
  }
  timeval timeout{30, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_load_verify_locations(ctx, ca.c_str(), nullptr);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);
  if (!cert.empty()) {
    SSL_CTX_use_certificate_file(ctx, cert.c_str(), SSL_FILETYPE_PEM);
    SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM);
  }
  SSL* ssl = SSL_new(ctx);
  SSL_set_fd(ssl, fd);
  std::string out;
  auto failed = [&] {
    unsigned long code = ERR_get_error();
    const char* reason = code ? ERR_reason_error_string(code) : nullptr;
    out += "<tls: " + std::string(reason ? reason : "closed") + ">";
  };
  if (SSL_connect(ssl) != 1) {
    failed();
  } else if (SSL_write(ssl, request.data(), static_cast<int>(request.size())) <= 0) {
    failed();
  } else {
    char buf[4096];
    for (;;) {
      int n = SSL_read(ssl, buf, sizeof buf);
      if (n > 0) {
        out.append(buf, static_cast<size_t>(n));
        continue;
      }
      if (SSL_get_error(ssl, n) != SSL_ERROR_ZERO_RETURN &&
          SSL_get_error(ssl, n) != SSL_ERROR_SYSCALL)
        failed();
      break;
    }
  }
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  ::close(fd);
  return out;
}

class TlsGateway : public GatewayTest {
 protected:
  TlsGateway() : GatewayTest("tls") {}

  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    static int counter = 0;
    client_home_ =
        make_dir(mode(), "tls-client-" + mode_name(mode()) + "-" + std::to_string(++counter), 0700);
    make_dir(mode(), client_home_.substr(scratch().size() + 1) + "/tls", 0700);
  }
  void TearDown() override {
    if (!client_home_.empty())
      EXPECT_EQ(stop_gateway(mode(), client_home_), std::vector<std::string>{})
          << "the client's home started a gateway";
    GatewayTest::TearDown();
  }

  // Makes the certificates, and starts the gateway with a TLS listener on
  // address (a port the kernel picks); url_ is where it listens.
  void start_tls_gateway(const std::string& address = "127.0.0.1:0",
                         const std::vector<std::string>& sans = {}) {
    std::vector<std::string> generate = {"gateway", "generate-certs"};
    for (const auto& san : sans) generate.insert(generate.end(), {"--server-san", san});
    Result certs = os(generate);
    ASSERT_EQ(certs.status, 0) << certs.out << certs.err;
    write_file(home_ + "/gateway.toml", "[api]\nlisten = [\"" + address + "\"]\n");
    // Any command on the socket starts the gateway, which reads the file.
    Result list = os({"sandbox", "list"});
    ASSERT_EQ(list.status, 0) << list.err;
    url_ = "https://" + listener("tls");
    ASSERT_NE(url_, "https://");
    EXPECT_THAT(os({"gateway", "status"}).out,
                HasSubstr("listening: https " + url_.substr(std::string("https://").size())));
    use_credentials(home_ + "/tls/ca.crt", home_ + "/tls/client.crt", home_ + "/tls/client.key");
  }

  // The address of the gateway's listener of this kind, from GET /v1/gateway.
  std::string listener(const std::string& kind) {
    Result status = os({"gateway", "status", "-o", "json"});
    auto info = nlohmann::json::parse(status.out, nullptr, false);
    if (!info.is_object()) return "";
    for (const auto& l : info.value("listeners", nlohmann::json::array()))
      if (l.value("kind", "") == kind) return l.value("address", "");
    return "";
  }

  std::string gateway_pid() {
    auto info = nlohmann::json::parse(os({"gateway", "status", "-o", "json"}).out, nullptr, false);
    return std::to_string(info.is_object() ? info.value("pid", 0) : 0);
  }

  // The client's credentials: copies in its home's tls/ ("" leaves one out).
  void use_credentials(const std::string& ca, const std::string& cert, const std::string& key) {
    const std::string dir = client_home_ + "/tls";
    for (const char* leaf : {"ca.crt", "client.crt", "client.key"})
      ::unlink((dir + "/" + leaf).c_str());
    auto copy = [&](const std::string& from, const char* leaf) {
      if (from.empty()) return;
      std::string to = dir + "/" + leaf;
      write_file(to, file_contents(from), 0600);
      if (::chown(to.c_str(), uid_of(mode()), gid_of(mode())) != 0) std::perror("chown");
    };
    copy(ca, "ca.crt");
    copy(cert, "client.crt");
    copy(key, "client.key");
  }
  void use_cert(const TestCert& cert, const std::string& ca) {
    const std::string& dir = client_home_;
    TestCert::write_text(dir + "/made.crt", cert.cert_pem());
    TestCert::write_text(dir + "/made.key", cert.key_pem());
    use_credentials(ca, dir + "/made.crt", dir + "/made.key");
  }

  // openshell against url_ (or url) with the client's home.
  Result remote(const std::vector<std::string>& args, Options o = {}, const std::string& url = "") {
    std::vector<std::string> full = {"--gateway-endpoint", url.empty() ? url_ : url};
    full.insert(full.end(), args.begin(), args.end());
    o.env.push_back("OPENSHELL_HOME=" + client_home_);
    return openshell(mode(), full, o);
  }

  std::string client_home_;
  std::string url_;
};
E2E_ALL_MODES(TlsGateway);

TEST_P(TlsGateway, FieldReportOverTls) {
  start_tls_gateway();
  // The sandbox runs, completes, and starts again, as often as asked.
  Result create =
      remote({"sandbox", "create", "--name", "repro1", "--from", rootfs(), "--", "echo", "done"});
  ASSERT_EQ(create.status, 0) << create.err;
  EXPECT_EQ(create.out, "done\n");
  EXPECT_EQ(remote({"sandbox", "get", "repro1", "-o", "json"}).out.find("\"Completed\"") !=
                std::string::npos,
            true);
  Result start = remote({"sandbox", "start", "repro1"});
  ASSERT_EQ(start.status, 0) << start.err;
  ASSERT_TRUE(wait_phase("repro1", "Completed"));
  Result logs = remote({"logs", "repro1"});
  EXPECT_EQ(logs.status, 0) << logs.err;
  EXPECT_EQ(logs.out, "done\ndone\n");
  // events: the sandbox's, through the API
  Result got = remote({"sandbox", "get", "repro1"});
  EXPECT_EQ(got.status, 0) << got.err;
  EXPECT_THAT(got.out, HasSubstr("MainProcessCompleted"));

  // exec: stdin, exit codes, a terminal.
  ASSERT_EQ(remote({"sandbox", "create", "--name", "live", "--from", rootfs(), "-d", "--", "sleep",
                    "300"})
                .status,
            0);
  ASSERT_TRUE(wait_phase("live", "Ready"));
  Options in;
  in.stdin_data = "through tls\n";
  Result exec =
      remote({"sandbox", "exec", "live", "--", "sh", "-c", "cat; echo err >&2; exit 7"}, in);
  EXPECT_EQ(exec.status, 7) << exec.err;
  EXPECT_EQ(exec.out, "through tls\n");
  EXPECT_EQ(exec.err, "err\n");
  Options tty;
  tty.pty = true;
  Result terminal = remote({"sandbox", "exec", "-t", "live", "--", "sh", "-c", "tty; exit 3"}, tty);
  EXPECT_EQ(terminal.status, 3) << terminal.out;
  EXPECT_THAT(terminal.out, HasSubstr("/dev/pts/"));

  // upload and download.
  const std::string dir = make_dir(mode(), "tls-files-" + mode_name(mode()));
  write_file(dir + "/note.txt", "a note\n");
  Result up = remote({"sandbox", "upload", "live", dir + "/note.txt", "/tmp"});
  ASSERT_EQ(up.status, 0) << up.err;
  Result down = remote({"sandbox", "download", "live", "/tmp/note.txt", dir + "/back.txt"});
  ASSERT_EQ(down.status, 0) << down.err;
  EXPECT_EQ(file_contents(dir + "/back.txt"), "a note\n");

  // policy get, update, and its revisions.
  Result update = remote(
      {"policy", "update", "live", "--add-endpoint", "example.test:443", "--binary", "/bin/wget"});
  EXPECT_EQ(update.status, 0) << update.err;
  Result policy = remote({"policy", "get", "live"});
  EXPECT_EQ(policy.status, 0) << policy.err;
  EXPECT_THAT(policy.out, HasSubstr("example.test"));

  // logs -f follows over TLS until the sandbox ends.
  ASSERT_EQ(remote({"sandbox", "create", "--name", "talker", "--from", rootfs(), "-d", "--", "sh",
                    "-c", "echo one; sleep 1; echo two"})
                .status,
            0);
  Result follow = remote({"logs", "talker", "-f"});
  EXPECT_EQ(follow.status, 0) << follow.err;
  EXPECT_THAT(follow.out, HasSubstr("one\ntwo\n"));

  for (const char* name : {"repro1", "live", "talker"})
    EXPECT_EQ(remote({"sandbox", "delete", name}).status, 0);
}

TEST_P(TlsGateway, EachRefusalHasItsOwnLine) {
  start_tls_gateway();
  const std::string tls = home_ + "/tls";
  // The server's certificate is not signed by the CA the client trusts.
  openshell::testing::TestPki other("another CA");
  const std::string other_ca = scratch() + "/tls-other-ca-" + mode_name(mode()) + ".crt";
  TestCert::write_text(other_ca, other.ca.cert_pem());
  ::chmod(other_ca.c_str(), 0644);
  use_credentials(other_ca, tls + "/client.crt", tls + "/client.key");
  Result r = remote({"sandbox", "list"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("the gateway's certificate at " + url_ +
                               " is not signed by the CA in " + client_home_ + "/tls/ca.crt"));
  // A client certificate from another CA.
  use_cert(other.client, tls + "/ca.crt");
  r = remote({"sandbox", "list"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("the gateway at " + url_ +
                               " refused our certificate: it is not signed by a CA the gateway "
                               "trusts"));
  // An expired one, from the gateway's own CA.
  TestCert ca = TestCert::load(tls + "/ca.crt", tls + "/ca.key");
  TestCert expired = openshell::testing::make_cert(
      {.common_name = "expired", .not_before = -7200, .not_after = -3600}, &ca);
  use_cert(expired, tls + "/ca.crt");
  r = remote({"sandbox", "list"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err,
              HasSubstr("the gateway at " + url_ + " refused our certificate: it has expired"));
  // None at all (a client other than ours: ours always shows one; the
  // line it would print is the unit test Tls.NoClientCertificateIsRefused's).
  const std::string host_port = url_.substr(std::string("https://").size());
  EXPECT_EQ(tls_request(host_port, tls + "/ca.crt", "", "",
                        "GET /v1/sandboxes HTTP/1.1\r\nHost: x\r\n\r\n"),
            "<tls: tlsv13 alert certificate required>");
  // Plain HTTP to the TLS port.
  r = remote({"sandbox", "list"}, {}, "http://" + host_port);
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("the gateway at http://" + host_port +
                               " speaks TLS on that port: use https://" + host_port));
  // Nothing listening.
  RefusedPort refused;
  const std::string nowhere = "https://127.0.0.1:" + std::to_string(refused.port());
  use_credentials(tls + "/ca.crt", tls + "/client.crt", tls + "/client.key");
  r = remote({"sandbox", "list"}, {}, nowhere);
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr(nowhere));
  // And the right credentials work.
  r = remote({"sandbox", "list"});
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_P(TlsGateway, SupervisorSessionIsRefusedOverTls) {
  start_tls_gateway();
  const std::string tls = home_ + "/tls";
  std::string answer = tls_request(url_.substr(std::string("https://").size()), tls + "/ca.crt",
                                   tls + "/client.crt", tls + "/client.key",
                                   "GET /v1/supervisor/session HTTP/1.1\r\nHost: x\r\n"
                                   "Connection: Upgrade, close\r\nUpgrade: websocket\r\n"
                                   "Sec-WebSocket-Version: 13\r\n"
                                   "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n");
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 403 Forbidden\r\n"));
  EXPECT_THAT(answer, HasSubstr("{\"error\":{\"code\":\"unix_only\",\"message\":\"a "
                                "supervisor's session is opened on the gateway's Unix "
                                "socket\"}}"));
}

TEST_P(TlsGateway, CertificatesRotateWithoutARestart) {
  start_tls_gateway();
  const std::string pid = gateway_pid();
  ASSERT_NE(pid, "0");
  ASSERT_EQ(remote({"sandbox", "list"}).status, 0);
  const std::string old_ca = scratch() + "/tls-old-ca-" + mode_name(mode()) + ".crt";
  write_file(old_ca, file_contents(home_ + "/tls/ca.crt"), 0644);
  Result again = os({"gateway", "generate-certs", "--force"});
  ASSERT_EQ(again.status, 0) << again.err;
  use_credentials(home_ + "/tls/ca.crt", home_ + "/tls/client.crt", home_ + "/tls/client.key");
  // The gateway looks at its files at most once a second, as connections come.
  Result r;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  do {
    r = remote({"sandbox", "list"});
    if (r.status != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  } while (r.status != 0 && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(r.status, 0) << r.err;
  // The same gateway, and the old CA no longer vouches for it.
  EXPECT_EQ(gateway_pid(), pid);
  use_credentials(old_ca, home_ + "/tls/client.crt", home_ + "/tls/client.key");
  r = remote({"sandbox", "list"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("is not signed by the CA in"));
}

TEST_P(TlsGateway, KilledWhileTlsStreamsAreOpenThenUsedAgain) {
  start_tls_gateway();
  ASSERT_EQ(remote({"sandbox", "create", "--name", "busy", "--from", rootfs(), "-d", "--", "sh",
                    "-c", "while :; do echo tick; sleep 1; done"})
                .status,
            0);
  ASSERT_TRUE(wait_phase("busy", "Ready"));
  const std::string pid = gateway_pid();
  // A follow and an exec over TLS, open when the gateway dies.
  Result follow, exec;
  std::thread follower([&] {
    Options o;
    o.timeout_s = 60;
    follow = remote({"logs", "busy", "-f"}, o);
  });
  std::thread executor([&] {
    Options o;
    o.timeout_s = 60;
    exec = remote({"sandbox", "exec", "busy", "--", "sleep", "40"}, o);
  });
  // Both streams are up once the gateway holds their connections: wait for
  // the sandbox's exec'd sleep to show.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (processes_matching("sleep 40").empty() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(processes_matching("sleep 40").empty());
  ASSERT_TRUE(kill_and_wait(pid));
  follower.join();
  executor.join();
  EXPECT_FALSE(follow.timed_out);
  EXPECT_NE(follow.status, 0);
  EXPECT_FALSE(exec.timed_out);
  // A new gateway (the socket's command starts it), on a new port, serves again.
  ASSERT_EQ(os({"sandbox", "list"}).status, 0);
  url_ = "https://" + listener("tls");
  Result again = remote({"sandbox", "exec", "busy", "--", "echo", "back"});
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.out, "back\n");
  EXPECT_EQ(remote({"sandbox", "delete", "busy"}).status, 0);
}

TEST_P(TlsGateway, AnotherMachineInANetworkNamespaceReachesTheGateway) {
  // The test (root) makes the namespace and the pair; the gateway and the
  // client in the namespace run as the mode's user.
  // Private addresses of their own for this test's pair.
  const std::string n = std::to_string(::getpid() % 200 + 20);
  const std::string ns = "osh-tls-" + std::to_string(::getpid());
  const std::string host_if = "oshtls" + n + "h", far_if = "oshtls" + n + "f";
  const std::string host_ip = "10.213." + n + ".1", far_ip = "10.213." + n + ".2";
  Result made =
      shell("ip netns add " + ns + " && ip link add " + host_if + " type veth peer name " + far_if +
            " && ip link set " + far_if + " netns " + ns + " && ip addr add " + host_ip +
            "/30 dev " + host_if + " && ip link set " + host_if + " up && ip netns exec " + ns +
            " ip addr add " + far_ip + "/30 dev " + far_if + " && ip netns exec " + ns +
            " ip link set " + far_if + " up && ip netns exec " + ns + " ip link set lo up");
  struct Cleanup {
    std::string ns, host_if;
    ~Cleanup() { shell("ip link del " + host_if + "; ip netns del " + ns); }
  } cleanup{ns, host_if};
  if (made.status != 0) GTEST_SKIP() << "no network namespace here: " << made.out;

  start_tls_gateway(host_ip + ":0", {host_ip});
  ASSERT_THAT(url_, StartsWith("https://" + host_ip + ":"));
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "near", "--from", rootfs(), "-d", "--", "sleep", "300"})
          .status,
      0);
  ASSERT_TRUE(wait_phase("near", "Ready"));
  const std::string far = "ip netns exec " + ns +
                          " setpriv --reuid=" + std::to_string(uid_of(mode())) +
                          " --regid=" + std::to_string(gid_of(mode())) +
                          " --clear-groups env OPENSHELL_HOME=" + client_home_ + " " + binary() +
                          " --gateway-endpoint " + url_ + " ";
  Result list = shell(far + "sandbox list");
  EXPECT_EQ(list.status, 0) << list.out;
  EXPECT_THAT(list.out, HasSubstr("near"));
  Result exec = shell("echo from-afar | " + far + "sandbox exec near -- cat");
  EXPECT_EQ(exec.status, 0) << exec.out;
  EXPECT_EQ(exec.out, "from-afar\n");
  EXPECT_EQ(os({"sandbox", "delete", "near"}).status, 0);
}

}  // namespace
}  // namespace e2e
