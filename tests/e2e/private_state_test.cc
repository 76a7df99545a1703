// A sandbox whose root is the host's never sees openshell's own state and
// sockets: the gateway's key, launch files and database, its API socket,
// the supervisors' sockets and $XDG_RUNTIME_DIR. And the secrets given with
// -e never rest on disk in plain text. As root and rootless.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

class PrivateState : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    // Outside /tmp, which a host-root sandbox gets fresh anyway: the masks
    // are what must hide these.
    char dir[] = "/var/tmp/osh-e2e-private-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    base_ = dir;
    ::chmod(dir, 0755);
    // Readable by everyone, so that only the masks keep a sandbox out (as
    // root, a sandbox's ids could not read a private directory anyway).
    home_ = make_own_dir("home");
    xdg_ = make_own_dir("xdg");
    const std::string secret = xdg_ + "/agent.sock-secret";
    write_file(secret, "xdg secret\n");
    ASSERT_EQ(::chown(secret.c_str(), uid_of(mode()), gid_of(mode())), 0);
  }
  std::string make_own_dir(const std::string& name) {
    std::string path = base_ + "/" + name;
    EXPECT_EQ(::mkdir(path.c_str(), 0755), 0) << path;
    EXPECT_EQ(::chown(path.c_str(), uid_of(mode()), gid_of(mode())), 0) << path;
    return path;
  }
  void TearDown() override {
    if (!home_.empty()) {
      EXPECT_EQ(stop_gateway(mode(), home_), std::vector<std::string>{})
          << "gateway or supervisors left";
    }
    if (!base_.empty()) {
      std::error_code ignored;
      std::filesystem::remove_all(base_, ignored);
    }
    ModeTest::TearDown();
  }
  Options with_env(Options o = {}) {
    o.env.push_back("OPENSHELL_HOME=" + home_);
    o.env.push_back("XDG_RUNTIME_DIR=" + xdg_);
    return o;
  }
  Result os(const std::vector<std::string>& args, Options o = {}) {
    return openshell(mode(), args, with_env(std::move(o)));
  }
  std::vector<std::string> gateway_processes() { return e2e::gateway_processes(home_); }
  // What a sandbox sees of the state: each directory's entries in
  // brackets, then whatever the secrets' files give to cat.
  // (stat(2) too: Landlock does not cover it, nor connect(2) to a socket.)
  std::string peek_script() const {
    return "echo \"home[$(ls -A " + home_ + " 2>/dev/null)]\"; echo \"run[$(ls -A " + home_ +
           "/run 2>/dev/null)]\"; echo \"xdg[$(ls -A " + xdg_ + " 2>/dev/null)]\"; test -e " +
           home_ + "/run/gateway.sock && echo SOCKET-SEEN; test -e " + home_ +
           "/keys/gateway.key && echo KEY-SEEN; cat " + home_ + "/keys/* " + home_ +
           "/sandboxes/*/launch.cred " + xdg_ + "/* 2>/dev/null; head -c 15 " + home_ +
           "/gateway.db 2>/dev/null; true";
  }
  void expect_nothing_seen(const Result& r) {
    EXPECT_THAT(r.out, HasSubstr("home[]")) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("run[]")) << r.out;
    EXPECT_THAT(r.out, HasSubstr("xdg[]")) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("PRIVATE KEY"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("openshell-launch"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("SQLite"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("xdg secret"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("SOCKET-SEEN"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("KEY-SEEN"))) << r.out;
  }
  // A running gateway with a sandbox: key, database, launch file, socket.
  void start_gateway_with_a_sandbox() {
    Result r = os({"sandbox", "create", "--name", "victim", "--from", rootfs()});
    ASSERT_EQ(r.status, 0) << r.err;
    struct stat st;
    ASSERT_EQ(::stat((home_ + "/keys/gateway.key").c_str(), &st), 0);
    ASSERT_EQ(::stat((home_ + "/run/gateway.sock").c_str(), &st), 0);
  }

  std::string base_, home_, xdg_;
};
E2E_ALL_MODES(PrivateState);

TEST_P(PrivateState, RunOnHostRootSeesNoState) {
  start_gateway_with_a_sandbox();
  Result r = os({"run", "--rootfs", "host", "--", "/bin/sh", "-c", peek_script()});
  EXPECT_EQ(r.status, 0) << r.err;
  expect_nothing_seen(r);
}

// The attack: from a host-root sandbox, drive the owner's gateway through
// its socket (create a sandbox of the attacker's choosing).
TEST_P(PrivateState, RunOnHostRootCannotReachTheGateway) {
  start_gateway_with_a_sandbox();
  // The CLI is under /tmp, which the sandbox gets fresh: bind it in.
  Result r = os({"run", "--rootfs", "host", "--bind", binary() + ":/osh-cli:ro", "-e",
                 "OPENSHELL_HOME=" + home_, "--", "/bin/sh", "-c",
                 "timeout 20 /osh-cli sandbox create --name evil --from host -- true; echo rc=$?"});
  // The CLI inside finds no run directory of the gateway's (masked, with its
  // socket) and may not make one: refused for that reason, not another.
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "rc=125\n");
  EXPECT_EQ(r.err, "openshell: create " + home_ + "/run: Read-only file system\n");
  EXPECT_THAT(os({"sandbox", "list"}).out, Not(HasSubstr("evil")));
}

// The default rootless layout: no OPENSHELL_HOME, the state under
// $XDG_STATE_HOME/openshell, the sockets under $XDG_RUNTIME_DIR/openshell.
TEST_P(PrivateState, RunOnHostRootSeesNoStateInTheDefaultLayout) {
  if (!is_rootless(mode())) GTEST_SKIP() << "as root the default layout is /var/lib/openshell";
  const std::string state = make_own_dir("state");
  Options o;
  o.env = {"XDG_STATE_HOME=" + state, "XDG_RUNTIME_DIR=" + xdg_};
  ASSERT_EQ(
      openshell(mode(), {"sandbox", "create", "--name", "victim", "--from", rootfs()}, o).status,
      0);
  Result r = openshell(mode(),
                       {"run", "--rootfs", "host", "--", "/bin/sh", "-c",
                        "echo \"state[$(ls -A " + state + "/openshell)]\"; echo \"xdg[$(ls -A " +
                            xdg_ + ")]\"; cat " + state + "/openshell/keys/* 2>/dev/null; true"},
                       o);
  EXPECT_THAT(r.out, HasSubstr("state[]")) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("xdg[]")) << r.out;
  EXPECT_THAT(r.out, Not(HasSubstr("PRIVATE KEY"))) << r.out;
  openshell(mode(), {"sandbox", "delete", "--all"}, o);
  openshell(mode(), {"gateway", "stop"}, o);
  for (int i = 0; i < 3000; ++i) {  // 30 s at most, ending once they are gone
    bool any = false;
    for (const auto& pid : processes_matching("openshell"))
      any = any || environment_of(pid).find("XDG_STATE_HOME=" + state + '\0') != std::string::npos;
    if (!any) break;
    ::usleep(10000);
  }
}

// A bind of a directory that holds the state does not bring it back; a bind
// of the state directory itself is the caller's explicit choice.
TEST_P(PrivateState, BindOfAParentKeepsTheStateMasked) {
  start_gateway_with_a_sandbox();
  const std::string parent = home_.substr(0, home_.rfind('/'));
  const std::string name = home_.substr(home_.rfind('/') + 1);
  Result r =
      os({"run", "--rootfs", "host", "--bind", parent + ":/osh-parent", "--", "/bin/sh", "-c",
          "echo \"home[$(ls -A /osh-parent/" + name + ")]\"; cat /osh-parent/" + name +
              "/keys/* 2>/dev/null; true"});
  // Empty, not unreadable: ls ran and saw nothing.
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  EXPECT_EQ(r.out, "home[]\n");
  Result explicit_bind = os({"run", "--rootfs", "host", "--bind", home_ + ":" + home_, "--",
                             "/bin/sh", "-c", "ls -A " + home_});
  EXPECT_THAT(explicit_bind.out, HasSubstr("gateway.db")) << explicit_bind.err;
}

TEST_P(PrivateState, GatewaySandboxFromHostSeesNoState) {
  start_gateway_with_a_sandbox();
  // A policy that lets the sandbox read where the state is: only the masks
  // keep it out.
  const std::string policy =
      write_file(base_ + "/policy.toml",
                 "version = 1\n[filesystem_policy]\nread_only = [\"/usr\", \"/lib\", \"/bin\", "
                 "\"/etc\", \"/proc\", \"/dev\", \"" +
                     base_ + "\"]\nread_write = [\"/sandbox\", \"/tmp\", \"/dev/null\"]\n");
  ASSERT_EQ(::chown(policy.c_str(), uid_of(mode()), gid_of(mode())), 0);
  Result create =
      os({"sandbox", "create", "--name", "onhost", "--from", "host", "--policy", policy});
  ASSERT_EQ(create.status, 0) << create.err;
  Result r = os({"sandbox", "exec", "onhost", "--", "/bin/sh", "-c", peek_script()});
  EXPECT_EQ(r.status, 0) << r.err;
  expect_nothing_seen(r);
}

// The -e secrets reach the sandbox, and rest in no file of the state
// directory: not the database (nor its -wal and -shm), not the launch file,
// not the logs. Also across stop/start and a gateway killed and restarted.
TEST_P(PrivateState, EnvSecretsAreDeliveredButNeverRestInPlainText) {
  std::random_device random;
  const std::string secret = "s3cr3t-" + std::to_string(random()) + std::to_string(random());
  Result create = os({"sandbox", "create", "--name", "holder", "--from", rootfs(), "-e",
                      "SECRET_TOKEN=" + secret});
  ASSERT_EQ(create.status, 0) << create.err;
  auto printenv = [&] {
    return os({"sandbox", "exec", "holder", "--", "sh", "-c", "echo \"$SECRET_TOKEN\""});
  };
  EXPECT_EQ(printenv().out, secret + "\n");
  EXPECT_EQ(files_holding(home_, secret), std::vector<std::string>{});

  ASSERT_EQ(os({"sandbox", "stop", "holder"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "holder"}).status, 0);
  EXPECT_EQ(printenv().out, secret + "\n") << "after stop and start";
  EXPECT_EQ(files_holding(home_, secret), std::vector<std::string>{});

  // A gateway killed outright; the next command starts another, which must
  // still deliver the environment to a new supervisor.
  int killed = 0;
  for (const auto& p : gateway_processes())
    if (p.find("gateway") != std::string::npos) {
      ASSERT_TRUE(kill_and_wait(p.substr(0, p.find(':')))) << p;
      ++killed;
    }
  ASSERT_EQ(killed, 1) << "no gateway to kill";
  EXPECT_EQ(printenv().out, secret + "\n") << "running across the gateway's restart";
  ASSERT_EQ(os({"sandbox", "stop", "holder"}).status, 0);
  ASSERT_EQ(os({"sandbox", "start", "holder"}).status, 0);
  EXPECT_EQ(printenv().out, secret + "\n") << "started by the restarted gateway";
  EXPECT_EQ(files_holding(home_, secret), std::vector<std::string>{});
}

}  // namespace
}  // namespace e2e
