// Which gateway a command talks to: --gateway-endpoint, -g, OPENSHELL_GATEWAY
// and the registry (`gateway add/list/select/info/remove`), here against the
// Unix socket of another OPENSHELL_HOME's gateway; as root and rootless.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pwd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

// The gateway of home_ serves; the commands run with a home of their own
// (client_home_, whose own gateway must never start) and a registry of
// their own (config_, system_).
class GatewayChoice : public GatewayTest {
 protected:
  GatewayChoice() : GatewayTest("choice") {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    static int counter = 0;
    const std::string n = mode_name(mode()) + "-" + std::to_string(++counter);
    client_home_ = make_dir(mode(), "choice-client-" + n, 0700);
    config_ = make_dir(mode(), "choice-config-" + n, 0700);
    system_ = make_dir(mode(), "choice-system-" + n, 0755);
    socket_url_ = "unix://" + home_ + "/run/gateway.sock";
  }
  void TearDown() override {
    if (!client_home_.empty()) {
      EXPECT_EQ(stop_gateway(mode(), client_home_), std::vector<std::string>{})
          << "the client's home started a gateway";
    }
    GatewayTest::TearDown();
  }
  // openshell as the client: its own home and registries.
  Result client(const std::vector<std::string>& args, Options o = {}) {
    o.env.push_back("OPENSHELL_HOME=" + client_home_);
    o.env.push_back("XDG_CONFIG_HOME=" + config_);
    o.env.push_back("OPENSHELL_SYSTEM_CONFIG_DIR=" + system_);
    return openshell(mode(), args, o);
  }
  // A Ready sandbox on the serving gateway.
  void serve_sandbox(const std::string& name) {
    ASSERT_EQ(
        os({"sandbox", "create", "--name", name, "--from", rootfs(), "-d", "--", "sleep", "300"})
            .status,
        0);
    ASSERT_TRUE(wait_phase(name, "Ready"));
  }
  bool client_gateway_started() { return !gateway_processes(client_home_).empty(); }

  std::string client_home_, config_, system_, socket_url_;
};
E2E_ALL_MODES(GatewayChoice);

TEST_P(GatewayChoice, EndpointFlagReachesAnotherHomesGatewayWithEveryStream) {
  serve_sandbox("far");
  Result list = client({"--gateway-endpoint", socket_url_, "sandbox", "list"});
  ASSERT_EQ(list.status, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("far"));
  // After the command's name too.
  Result get = client({"sandbox", "get", "far", "--gateway-endpoint", socket_url_});
  EXPECT_EQ(get.status, 0) << get.err;
  // exec's stdio and exit status, over the chosen socket.
  Options in;
  in.stdin_data = "through\n";
  Result exec = client({"--gateway-endpoint", socket_url_, "sandbox", "exec", "far", "--", "sh",
                        "-c", "cat; echo out; echo err >&2; exit 7"},
                       in);
  EXPECT_EQ(exec.status, 7) << exec.err;
  EXPECT_EQ(exec.out, "through\nout\n");
  EXPECT_EQ(exec.err, "err\n");
  // upload and download: exec streams of their own.
  const std::string dir = make_dir(mode(), "choice-files-" + mode_name(mode()));
  write_file(dir + "/note.txt", "a note\n");
  Result up = client(
      {"--gateway-endpoint", socket_url_, "sandbox", "upload", "far", dir + "/note.txt", "/tmp"});
  ASSERT_EQ(up.status, 0) << up.err;
  Result down = client({"--gateway-endpoint", socket_url_, "sandbox", "download", "far",
                        "/tmp/note.txt", dir + "/back.txt"});
  ASSERT_EQ(down.status, 0) << down.err;
  EXPECT_EQ(file_contents(dir + "/back.txt"), "a note\n");
  // create shows the main process's output through a log stream.
  Result once = client({"--gateway-endpoint", socket_url_, "sandbox", "create", "--name", "once",
                        "--from", rootfs(), "--", "echo", "hello from afar"});
  EXPECT_EQ(once.status, 0) << once.err;
  EXPECT_EQ(once.out, "hello from afar\n");
  Result logs = client({"--gateway-endpoint", socket_url_, "logs", "once"});
  EXPECT_EQ(logs.status, 0) << logs.err;
  EXPECT_EQ(logs.out, "hello from afar\n");
  for (const char* name : {"far", "once"})
    EXPECT_EQ(client({"--gateway-endpoint", socket_url_, "sandbox", "delete", name}).status, 0);
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayChoice, ExplicitEndpointWithNothingListeningIsNeverStarted) {
  const std::string own = "unix://" + client_home_ + "/run/gateway.sock";
  Result r = client({"--gateway-endpoint", own, "sandbox", "list"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: no gateway listens at " + own + "\n");
  // The same through the environment.
  Options env;
  env.env.push_back("OPENSHELL_GATEWAY=" + own);
  r = client({"sandbox", "list"}, env);
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: no gateway listens at " + own + "\n");
  EXPECT_FALSE(client_gateway_started());
  EXPECT_NE(::access((client_home_ + "/run/gateway.sock").c_str(), F_OK), 0);
}

TEST_P(GatewayChoice, EnvironmentChoosesAndTheFlagWins) {
  serve_sandbox("envy");
  Options env;
  env.env.push_back("OPENSHELL_GATEWAY=" + socket_url_);
  Result list = client({"sandbox", "list"}, env);
  ASSERT_EQ(list.status, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("envy"));
  // The flag over the environment: an unknown name is refused, not ignored.
  Result named = client({"-g", "nowhere", "sandbox", "list"}, env);
  EXPECT_EQ(named.status, 125);
  EXPECT_EQ(named.err,
            "openshell: --gateway nowhere: no such gateway is registered (see 'openshell gateway "
            "list')\n");
  Result both = client({"-g", "x", "--gateway-endpoint", socket_url_, "sandbox", "list"});
  EXPECT_EQ(both.status, 125);
  EXPECT_THAT(both.err, HasSubstr("give one"));
  Result bad = client({"--gateway-endpoint", "ftp://x", "sandbox", "list"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_THAT(bad.err, HasSubstr("the scheme must be unix, https or http"));
  EXPECT_EQ(os({"sandbox", "delete", "envy"}).status, 0);
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayChoice, NothingChosenKeepsTheLocalAutostartingGateway) {
  Result list = client({"sandbox", "list"});
  ASSERT_EQ(list.status, 0) << list.err;
  EXPECT_TRUE(client_gateway_started());
  EXPECT_EQ(stop_gateway(mode(), client_home_), std::vector<std::string>{});
}

std::string user_name(uid_t uid) {
  struct passwd* pw = ::getpwuid(uid);
  return pw ? pw->pw_name : "uid-" + std::to_string(uid);
}

TEST_P(GatewayChoice, AddListSelectInfoRemoveAgainstAUnixGateway) {
  serve_sandbox("reg");
  Result add = client({"gateway", "add", socket_url_, "--name", "near"});
  ASSERT_EQ(add.status, 0) << add.err;
  EXPECT_EQ(add.out, "Connected (Unix socket, as " + user_name(uid_of(mode())) +
                         ")\nRegistered gateway 'near' (" + socket_url_ +
                         "), now the active one\n");
  struct stat st {};
  ASSERT_EQ(::stat((config_ + "/openshell/gateways/near").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  // The active gateway is the one every command uses now.
  Result list = client({"sandbox", "list", "--names"});
  ASSERT_EQ(list.status, 0) << list.err;
  EXPECT_EQ(list.out, "reg\n");
  EXPECT_FALSE(client_gateway_started());
  // A second entry is not active until selected; -g picks it per command.
  Result second = client({"gateway", "add", socket_url_, "--name", "again"});
  ASSERT_EQ(second.status, 0) << second.err;
  EXPECT_THAT(second.out, Not(HasSubstr("active")));
  EXPECT_EQ(client({"-g", "again", "sandbox", "list", "--names"}).out, "reg\n");
  Result table = client({"gateway", "list"});
  EXPECT_EQ(table.out, "NAME    ENDPOINT" + std::string(socket_url_.size() - 8 + 3, ' ') +
                           "ACTIVE   SOURCE\n"
                           "again   " +
                           socket_url_ +
                           "            user\n"
                           "near    " +
                           socket_url_ + "   *        user\n");
  Result select = client({"gateway", "select", "again"});
  EXPECT_EQ(select.out, "Active gateway: again (" + socket_url_ + ")\n");
  Result json = client({"gateway", "list", "-o", "json"});
  EXPECT_THAT(json.out, HasSubstr("\"name\": \"again\""));
  EXPECT_THAT(json.out, HasSubstr("\"active\": true"));
  Result info = client({"gateway", "info"});
  EXPECT_THAT(info.out, HasSubstr("name: again\nendpoint: " + socket_url_ + "\nactive: yes\n"));
  Result dup = client({"gateway", "add", socket_url_, "--name", "again"});
  EXPECT_EQ(dup.status, 125);
  EXPECT_THAT(dup.err, HasSubstr("gateway 'again' is registered already"));
  EXPECT_EQ(client({"gateway", "remove", "again"}).out, "Removed gateway 'again'\n");
  // With none active, the local default again (started on demand).
  EXPECT_EQ(client({"gateway", "info"}).out,
            "endpoint: unix://" + client_home_ + "/run/gateway.sock (not registered)\n");
  EXPECT_EQ(os({"sandbox", "delete", "reg"}).status, 0);
}

TEST_P(GatewayChoice, SystemEntriesAreReadOnlyAndShadowedByTheUsers) {
  // What a package writes: an entry and the system's active mark.
  const std::string entry = system_ + "/gateways/shared";
  ASSERT_EQ(::mkdir((system_ + "/gateways").c_str(), 0755), 0);
  ASSERT_EQ(::mkdir(entry.c_str(), 0755), 0);
  write_file(entry + "/endpoint.json", "{\"endpoint\": \"" + socket_url_ + "\"}\n");
  write_file(system_ + "/active", "shared\n");
  serve_sandbox("sys");
  Result list = client({"sandbox", "list", "--names"});
  ASSERT_EQ(list.status, 0) << list.err;
  EXPECT_EQ(list.out, "sys\n");
  EXPECT_THAT(client({"gateway", "list"}).out, HasSubstr("*        system\n"));
  Result remove = client({"gateway", "remove", "shared"});
  EXPECT_EQ(remove.status, 125);
  EXPECT_EQ(remove.err, "openshell: gateway 'shared' is in the system registry (" + system_ +
                            "/gateways), which only its package changes; add one of that name "
                            "to shadow it\n");
  // A user entry of the same name shadows it: here, one whose gateway is
  // not there, so that which entry answers is plain.
  const std::string entry_dir = config_ + "/openshell/gateways/shared";
  const std::string nowhere = "unix://" + client_home_ + "/nothing.sock";
  ASSERT_EQ(client({"gateway", "add", socket_url_, "--name", "shared"}).status, 0);
  write_file(entry_dir + "/endpoint.json", "{\"endpoint\": \"" + nowhere + "\"}\n");
  Result shadowed = client({"sandbox", "list"});
  EXPECT_EQ(shadowed.status, 125);
  EXPECT_EQ(shadowed.err, "openshell: no gateway listens at gateway 'shared' (" + nowhere + ")\n");
  EXPECT_THAT(client({"gateway", "list"}).out, HasSubstr(nowhere + "   *        user\n"));
  // Removing the user's entry uncovers the system's again.
  EXPECT_EQ(client({"gateway", "remove", "shared"}).status, 0);
  EXPECT_EQ(client({"sandbox", "list", "--names"}).out, "sys\n");
  EXPECT_THAT(client({"gateway", "list"}).out, HasSubstr("*        system\n"));
  EXPECT_EQ(os({"sandbox", "delete", "sys"}).status, 0);
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayChoice, AddSaysWhyNotAndRegistersNothing) {
  const std::string nowhere = "unix://" + client_home_ + "/run/gateway.sock";
  Result r = client({"gateway", "add", nowhere});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: no gateway listens at " + nowhere + "\n");
  r = client({"gateway", "add", "https://127.0.0.1:17670"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err,
            "openshell: https://127.0.0.1:17670: a TLS gateway needs --local, or --ca, --cert "
            "and --key (its CA, your certificate and your key)\n");
  r = client({"gateway", "add", "https://127.0.0.1:17670", "--local"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: --local: " + client_home_ +
                       "/tls/ca.crt: no such file (make this user's with 'openshell gateway "
                       "generate-certs')\n");
  r = client({"gateway", "add", socket_url_, "--local"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("only an https gateway takes certificates"));
  r = client({"gateway", "add", "ftp://x"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("the scheme must be unix, https or http"));
  EXPECT_EQ(client({"gateway", "list", "-o", "json"}).out, "[]\n");
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayChoice, StatusNamesTheGatewayWhoWeAreAndItsSandboxes) {
  // Nothing running, nothing registered: a friendly line, exit 0, and
  // nothing started.
  Result none = client({"status"});
  EXPECT_EQ(none.status, 0) << none.err;
  EXPECT_THAT(none.out, HasSubstr("No gateway is running and none is registered"));
  EXPECT_THAT(none.out, HasSubstr("openshell gateway add"));
  EXPECT_FALSE(client_gateway_started());
  serve_sandbox("counted");
  Result status = client({"--gateway-endpoint", socket_url_, "status"});
  ASSERT_EQ(status.status, 0) << status.err;
  EXPECT_THAT(status.out, HasSubstr("Gateway: " + socket_url_ + "\n"));
  EXPECT_THAT(status.out,
              HasSubstr("Status: Connected (Unix socket, as " + user_name(uid_of(mode())) + ")"));
  EXPECT_THAT(status.out, HasSubstr("Version: "));
  EXPECT_THAT(status.out, HasSubstr("Sandboxes: 1 (Ready 1)\n"));
  EXPECT_THAT(status.out, HasSubstr("You: "));
  Result json = client({"--gateway-endpoint", socket_url_, "status", "-o", "json"});
  EXPECT_THAT(json.out, HasSubstr("\"reachable\": true"));
  EXPECT_THAT(json.out, HasSubstr("\"Ready\": 1"));
  // A chosen gateway that does not answer: said, exit 1.
  const std::string own = "unix://" + client_home_ + "/run/gateway.sock";
  Result down = client({"--gateway-endpoint", own, "status"});
  EXPECT_EQ(down.status, 1);
  EXPECT_EQ(down.out,
            "Gateway: " + own + "\nStatus: not reachable: no gateway listens at " + own + "\n");
  EXPECT_EQ(os({"sandbox", "delete", "counted"}).status, 0);
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayChoice, GenerateCertsSaysWhatItFoundAndIssuesClients) {
  Result made = client({"gateway", "generate-certs", "--server-san", "gw.example.org"});
  ASSERT_EQ(made.status, 0) << made.err;
  const std::string tls = client_home_ + "/tls";
  EXPECT_EQ(made.out, "Made in " + tls +
                          ": a CA, a server certificate for localhost, 127.0.0.1, ::1, "
                          "gw.example.org, and the client certificate of " +
                          user_name(uid_of(mode())) + " (admin)\n");
  Result again = client({"gateway", "generate-certs"});
  EXPECT_EQ(again.status, 0);
  EXPECT_EQ(again.out, "The certificates in " + tls +
                           " are complete (ca.crt, ca.key, server.crt, server.key, client.crt, "
                           "client.key): left as they are (--force makes a new set)\n");
  ::unlink((tls + "/client.key").c_str());
  Result partial = client({"gateway", "generate-certs"});
  EXPECT_EQ(partial.status, 125);
  EXPECT_EQ(partial.err, "openshell: the certificates in " + tls +
                             " are incomplete (missing client.key): --force makes a new set, "
                             "which clients of the old CA no longer trust\n");
  EXPECT_EQ(client({"gateway", "generate-certs", "--force"}).status, 0);
  Result issued = client({"gateway", "issue-client", "--name", "alice"});
  EXPECT_EQ(issued.status, 0) << issued.err;
  EXPECT_EQ(issued.out, "Issued a client certificate for alice in " + tls +
                            "/clients/alice: client.crt, client.key, ca.crt\n");
  struct stat st {};
  ASSERT_EQ(::stat((tls + "/clients/alice/client.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, uid_of(mode()));
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayChoice, ARemoteGatewayIsNeverAskedToReadThisMachinesFiles) {
  // Refused before anything connects: no gateway need listen there (an
  // address for documentation, RFC 5737, never reached).
  const std::string remote = "https://192.0.2.1:17670";
  const std::string dir = make_dir(mode(), "choice-root-" + mode_name(mode()));
  Result from_dir =
      client({"--gateway-endpoint", remote, "sandbox", "create", "--from", dir, "--", "true"});
  EXPECT_EQ(from_dir.status, 125);
  EXPECT_EQ(from_dir.err, "openshell: --from " + dir +
                              ": a remote gateway cannot read this machine's directories; push "
                              "an image to a registry instead\n");
  Result bind = client({"--gateway-endpoint", remote, "sandbox", "create", "--from", "base",
                        "--bind", dir + ":/data", "--", "true"});
  EXPECT_EQ(bind.status, 125);
  EXPECT_EQ(bind.err, "openshell: --bind " + dir +
                          ":/data: a remote gateway cannot bind this machine's paths (its "
                          "sandboxes see only its own host's)\n");
  Result images = client({"--gateway-endpoint", remote, "image", "list"});
  EXPECT_EQ(images.status, 125);
  EXPECT_EQ(images.err,
            "openshell: image: " + remote +
                " is remote: its image store is on its own host, out of this machine's reach "
                "(run the image command there, or push the image to a registry it pulls from)\n");
  // Another local gateway's socket: its own store, which it names.
  ASSERT_EQ(os({"sandbox", "list"}).status, 0);
  Result local_images = client({"--gateway-endpoint", socket_url_, "image", "list", "-o", "json"});
  EXPECT_EQ(local_images.status, 0) << local_images.err;
  EXPECT_FALSE(client_gateway_started());
}

}  // namespace
}  // namespace e2e

namespace e2e {
namespace {

// A port on 127.0.0.1 that the kernel says is free now (the gateway binds
// it a moment later).
uint16_t free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// The gateway of home_ serves TLS (and plain HTTP on another loopback port)
// with the certificates generate-certs made for its user.
class GatewayTlsChoice : public GatewayChoice {
 protected:
  void SetUp() override {
    GatewayChoice::SetUp();
    if (IsSkipped()) return;
    tls_port_ = free_port();
    plain_port_ = free_port();
    tls_url_ = "https://127.0.0.1:" + std::to_string(tls_port_);
    plain_url_ = "http://127.0.0.1:" + std::to_string(plain_port_);
    ASSERT_EQ(os({"gateway", "generate-certs"}).status, 0);
    write_file(home_ + "/gateway.toml",
               "[api]\nlisten = [\"127.0.0.1:" + std::to_string(tls_port_) +
                   "\"]\ninsecure_listen = [\"127.0.0.1:" + std::to_string(plain_port_) + "\"]\n");
    Result started = os({"sandbox", "list"});
    ASSERT_EQ(started.status, 0) << started.err;
  }
  // openshell as the gateway's own user on its host: its home, our registry.
  Result owner(const std::vector<std::string>& args) {
    Options o;
    o.env.push_back("OPENSHELL_HOME=" + home_);
    o.env.push_back("XDG_CONFIG_HOME=" + config_);
    o.env.push_back("OPENSHELL_SYSTEM_CONFIG_DIR=" + system_);
    return openshell(mode(), args, o);
  }
  std::vector<std::string> with_files(std::vector<std::string> args, const std::string& ca,
                                      const std::string& cert, const std::string& key) {
    args.insert(args.end(), {"--ca", ca, "--cert", cert, "--key", key});
    return args;
  }
  uint16_t tls_port_ = 0, plain_port_ = 0;
  std::string tls_url_, plain_url_;
};
E2E_ALL_MODES(GatewayTlsChoice);

TEST_P(GatewayTlsChoice, AddLocalThenEveryCommandOverMutualTls) {
  Result add = owner({"gateway", "add", tls_url_, "--local", "--name", "openshell"});
  ASSERT_EQ(add.status, 0) << add.err;
  EXPECT_EQ(add.out, "Connected / Authenticated (mTLS)\nRegistered gateway 'openshell' (" +
                         tls_url_ + "), now the active one\n");
  // The client needs nothing of the gateway's files from here on: its own
  // home has none, its registry holds copies.
  Result info = client({"gateway", "info"});
  EXPECT_THAT(info.out,
              HasSubstr("certificate: " + user_name(uid_of(mode())) + " (admin), valid until "));
  struct stat st {};
  ASSERT_EQ(::stat((config_ + "/openshell/gateways/openshell/client.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  Result status = client({"status"});
  ASSERT_EQ(status.status, 0) << status.err;
  const std::string head =
      "Gateway: gateway 'openshell' (" + tls_url_ + ")\nStatus: Connected / Authenticated (mTLS)\n";
  // Who we are: the certificate's principal, an admin's (a gateway without
  // GET /v1/whoami says "unknown").
  EXPECT_THAT(status.out, testing::AnyOf(HasSubstr(head + "You: " + user_name(uid_of(mode())) +
                                                   " (admin), over tls\n"),
                                         HasSubstr(head + "You: unknown\n")));
  // A root the gateway's host has (a directory there) comes by the local
  // socket; the sandbox is then used over TLS.
  ASSERT_EQ(
      os({"sandbox", "create", "--name", "tls", "--from", rootfs(), "-d", "--", "sleep", "300"})
          .status,
      0);
  ASSERT_TRUE(wait_phase("tls", "Ready"));
  Options in;
  in.stdin_data = "over tls\n";
  Result exec = client({"sandbox", "exec", "tls", "--", "sh", "-c", "cat; echo e >&2; exit 3"}, in);
  EXPECT_EQ(exec.status, 3) << exec.err;
  EXPECT_EQ(exec.out, "over tls\n");
  EXPECT_EQ(exec.err, "e\n");
  Result once = client({"--gateway-endpoint", tls_url_, "sandbox", "list", "--names"});
  EXPECT_EQ(once.status, 0) << once.err;
  EXPECT_THAT(once.out, HasSubstr("tls\n"));
  EXPECT_EQ(client({"sandbox", "delete", "tls"}).status, 0);
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayTlsChoice, TwoGatewaysChosenPerCommand) {
  const std::string other =
      make_dir(mode(), "choice-other-" + mode_name(mode()) + "-" + std::to_string(tls_port_), 0700);
  GatewayGuard guard(mode(), other);
  Options at_other;
  at_other.env.push_back("OPENSHELL_HOME=" + other);
  ASSERT_EQ(openshell(mode(),
                      {"sandbox", "create", "--name", "on-b", "--from", rootfs(), "-d", "--",
                       "sleep", "300"},
                      at_other)
                .status,
            0);
  serve_sandbox("on-a");
  const std::string tls = home_ + "/tls";
  ASSERT_EQ(client(with_files({"gateway", "add", tls_url_, "--name", "one"}, tls + "/ca.crt",
                              tls + "/client.crt", tls + "/client.key"))
                .status,
            0);
  ASSERT_EQ(
      client({"gateway", "add", "unix://" + other + "/run/gateway.sock", "--name", "two"}).status,
      0);
  EXPECT_EQ(client({"sandbox", "list", "--names"}).out, "on-a\n");  // the first is active
  EXPECT_EQ(client({"-g", "two", "sandbox", "list", "--names"}).out, "on-b\n");
  EXPECT_EQ(client({"sandbox", "list", "--names", "--gateway", "one"}).out, "on-a\n");
  // A URL borrows the registered gateway's credentials.
  EXPECT_EQ(client({"--gateway-endpoint", tls_url_, "sandbox", "list", "--names"}).out, "on-a\n");
  Options env;
  env.env.push_back("OPENSHELL_GATEWAY=two");
  EXPECT_EQ(client({"sandbox", "list", "--names"}, env).out, "on-b\n");
  ASSERT_EQ(client({"gateway", "select", "two"}).status, 0);
  EXPECT_EQ(client({"sandbox", "list", "--names"}).out, "on-b\n");
  EXPECT_THAT(client({"status"}).out, HasSubstr("Status: Connected (Unix socket, as "));
  // The sandbox last named is remembered for each gateway apart.
  EXPECT_EQ(client({"-g", "one", "sandbox", "get", "on-a"}).status, 0);
  Result unnamed = client({"-g", "two", "sandbox", "get"});
  EXPECT_EQ(unnamed.status, 125);
  EXPECT_EQ(unnamed.err, "openshell: no sandbox named, and none used before: give its name\n");
  EXPECT_EQ(client({"-g", "two", "sandbox", "get", "on-b"}).status, 0);
  Result last_a = client({"-g", "one", "sandbox", "get", "-o", "json"});
  EXPECT_THAT(last_a.out, HasSubstr("\"name\": \"on-a\""));
  EXPECT_EQ(client({"-g", "two", "sandbox", "delete", "on-b"}).status, 0);
  EXPECT_EQ(client({"-g", "one", "sandbox", "delete", "on-a"}).status, 0);
  EXPECT_FALSE(client_gateway_started());
}

TEST_P(GatewayTlsChoice, EachRefusalHasItsLineAndRegistersNothing) {
  const std::string tls = home_ + "/tls";
  // Another set, of another CA.
  const std::string stranger = client_home_ + "/stranger";
  ASSERT_EQ(client({"gateway", "generate-certs", "--dir", stranger}).status, 0);
  Result bad_ca = client(with_files({"gateway", "add", tls_url_}, stranger + "/ca.crt",
                                    tls + "/client.crt", tls + "/client.key"));
  EXPECT_EQ(bad_ca.status, 125);
  EXPECT_THAT(bad_ca.err, HasSubstr("the gateway's certificate at " + tls_url_ +
                                    " is not signed by the CA in " + stranger + "/ca.crt"));
  Result foreign = client(with_files({"gateway", "add", tls_url_}, tls + "/ca.crt",
                                     stranger + "/client.crt", stranger + "/client.key"));
  EXPECT_EQ(foreign.status, 125);
  EXPECT_THAT(foreign.err, HasSubstr("refused our certificate"));
  RefusedPort refused;
  const std::string nowhere = "https://127.0.0.1:" + std::to_string(refused.port());
  Result nothing = client(with_files({"gateway", "add", nowhere}, tls + "/ca.crt",
                                     tls + "/client.crt", tls + "/client.key"));
  EXPECT_EQ(nothing.status, 125);
  EXPECT_EQ(nothing.err, "openshell: no gateway listens at " + nowhere + "\n");
  const std::string plain_as_tls = "https://127.0.0.1:" + std::to_string(plain_port_);
  Result plain = client(with_files({"gateway", "add", plain_as_tls}, tls + "/ca.crt",
                                   tls + "/client.crt", tls + "/client.key"));
  EXPECT_EQ(plain.status, 125);
  EXPECT_THAT(plain.err, HasSubstr("answered in plain HTTP where TLS was expected"));
  EXPECT_EQ(client({"gateway", "list", "-o", "json"}).out, "[]\n");
  // A URL with no credentials anywhere: say where they come from.
  Result bare = client({"--gateway-endpoint", tls_url_, "sandbox", "list"});
  EXPECT_EQ(bare.status, 125);
  EXPECT_EQ(bare.err, "openshell: " + tls_url_ +
                          ": no credentials for it (register it with 'openshell gateway add " +
                          tls_url_ +
                          " --ca FILE --cert FILE --key FILE', or make this user's with "
                          "'openshell gateway generate-certs')\n");
  // The plain port itself, as http://, is a gateway (loopback only).
  Result http = client({"gateway", "add", plain_url_, "--name", "plain"});
  EXPECT_EQ(http.status, 0) << http.err;
  EXPECT_THAT(http.out, HasSubstr("Connected (plain TCP, not authenticated)\n"));
  EXPECT_FALSE(client_gateway_started());
}

// A command line on another machine: a network namespace whose veth peer
// reaches the gateway's address on this host.
TEST_P(GatewayTlsChoice, FromAnotherMachineWhatNamesItsFilesIsRefusedWithALine) {
  if (mode() != Mode::kRoot) GTEST_SKIP() << "a network namespace and a veth pair need root";
  const std::string n = std::to_string(::getpid() % 200 + 20);
  const std::string ns = "osh-cli-" + std::to_string(::getpid());
  const std::string host_if = "oshcli" + n + "h", far_if = "oshcli" + n + "f";
  const std::string host_ip = "10.214." + n + ".1", far_ip = "10.214." + n + ".2";
  auto shell = [](const std::string& command) {
    Result r;
    FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
    if (!pipe) return r;
    char buf[4096];
    for (size_t got; (got = std::fread(buf, 1, sizeof buf, pipe)) > 0;) r.out.append(buf, got);
    const int status = ::pclose(pipe);
    r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return r;
  };
  Result made = shell(
      "ip netns add " + ns + " && ip link add " + host_if + " type veth peer name " + far_if +
      " && ip link set " + far_if + " netns " + ns + " && ip addr add " + host_ip + "/30 dev " +
      host_if + " && ip link set " + host_if + " up && ip netns exec " + ns + " ip addr add " +
      far_ip + "/30 dev " + far_if + " && ip netns exec " + ns + " ip link set " + far_if + " up");
  struct Cleanup {
    std::function<Result(const std::string&)> shell;
    std::string ns, host_if;
    ~Cleanup() { shell("ip link del " + host_if + "; ip netns del " + ns); }
  } cleanup{shell, ns, host_if};
  if (made.status != 0) GTEST_SKIP() << "no network namespace here: " << made.out;
  // The gateway of home_, again, now also on the veth address.
  EXPECT_EQ(stop_gateway(mode(), home_), std::vector<std::string>{});
  ASSERT_EQ(os({"gateway", "generate-certs", "--force", "--server-san", host_ip}).status, 0);
  const std::string far_port = std::to_string(free_port());
  write_file(home_ + "/gateway.toml", "[api]\nlisten = [\"" + host_ip + ":" + far_port + "\"]\n");
  ASSERT_EQ(os({"sandbox", "list"}).status, 0);
  const std::string url = "https://" + host_ip + ":" + far_port, tls = home_ + "/tls";
  const std::string far = "ip netns exec " + ns + " env HOME=" + client_home_ +
                          " OPENSHELL_HOME=" + client_home_ + " XDG_CONFIG_HOME=" + config_ +
                          " OPENSHELL_SYSTEM_CONFIG_DIR=" + system_ + " " + binary() + " ";
  Result add = shell(far + "gateway add " + url + " --name far --ca " + tls + "/ca.crt --cert " +
                     tls + "/client.crt --key " + tls + "/client.key");
  ASSERT_EQ(add.status, 0) << add.out;
  EXPECT_THAT(add.out, HasSubstr("Connected / Authenticated (mTLS)\n"));
  Result dir = shell(far + "sandbox create --from " + rootfs() + " -- true");
  EXPECT_EQ(dir.status, 125);
  EXPECT_EQ(dir.out, "openshell: --from " + rootfs() +
                         ": a remote gateway cannot read this machine's directories; push an "
                         "image to a registry instead\n");
  Result image = shell(far + "sandbox create --from no-such-image:1 -- true");
  EXPECT_EQ(image.status, 125);
  EXPECT_EQ(image.out, "openshell: --from no-such-image:1: gateway 'far' (" + url +
                           ") has no such image, and a remote gateway cannot use this machine's "
                           "images: pull it on the gateway's host, or push it to a registry and "
                           "pull it there\n");
  Result images = shell(far + "image list");
  EXPECT_EQ(images.status, 125);
  EXPECT_THAT(images.out, HasSubstr("is remote: its image store is on its own host"));
  Result status = shell(far + "status");
  EXPECT_EQ(status.status, 0) << status.out;
  EXPECT_THAT(status.out, HasSubstr("Status: Connected / Authenticated (mTLS)\n"));
  EXPECT_FALSE(client_gateway_started());
}

}  // namespace
}  // namespace e2e
