// Which gateway a command talks to: --gateway-endpoint, -g, OPENSHELL_GATEWAY
// and the registry (`gateway add/list/select/info/remove`), here against the
// Unix socket of another OPENSHELL_HOME's gateway; as root and rootless.
#include <unistd.h>

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

}  // namespace
}  // namespace e2e
