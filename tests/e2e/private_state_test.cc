// A sandbox whose root is the host's never sees openshell's own state and
// sockets: the gateway's key, launch files and database, its API socket,
// the supervisors' sockets and $XDG_RUNTIME_DIR. And the secrets given with
// -e never rest on disk in plain text. As root and rootless.
#include <gmock/gmock.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <random>

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
      os({"sandbox", "delete", "--all"});
      os({"gateway", "stop"});
      for (int i = 0; i < 200 && !gateway_processes().empty(); ++i) ::usleep(10000);
      EXPECT_EQ(gateway_processes(), std::vector<std::string>{}) << "gateway or supervisors left";
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
  std::vector<std::string> gateway_processes() {
    std::vector<std::string> out;
    for (const auto& pid : processes_matching("openshell"))
      if (environment_of(pid).find("OPENSHELL_HOME=" + home_ + '\0') != std::string::npos)
        out.push_back(pid + ":" + command_of(pid));
    return out;
  }
  // What a sandbox sees of the state: each directory's entries in
  // brackets, then whatever the secrets' files give to cat.
  std::string peek_script() const {
    return "echo \"home[$(ls -A " + home_ + " 2>/dev/null)]\"; echo \"run[$(ls -A " + home_ +
           "/run 2>/dev/null)]\"; echo \"xdg[$(ls -A " + xdg_ + " 2>/dev/null)]\"; cat " + home_ +
           "/keys/* " + home_ + "/sandboxes/*/launch.cred " + home_ + "/gateway.db " + xdg_ +
           "/* 2>/dev/null; true";
  }
  void expect_nothing_seen(const Result& r) {
    EXPECT_THAT(r.out, HasSubstr("home[]")) << r.out << r.err;
    EXPECT_THAT(r.out, HasSubstr("run[]")) << r.out;
    EXPECT_THAT(r.out, HasSubstr("xdg[]")) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("PRIVATE KEY"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("openshell-launch"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("SQLite"))) << r.out;
    EXPECT_THAT(r.out, Not(HasSubstr("xdg secret"))) << r.out;
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
  EXPECT_THAT(r.out, Not(HasSubstr("rc=0"))) << r.out << r.err;
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
  for (int i = 0; i < 200; ++i) {
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
  EXPECT_THAT(r.out, HasSubstr("home[]")) << r.out << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("PRIVATE KEY"))) << r.out;
  Result explicit_bind = os({"run", "--rootfs", "host", "--bind", home_ + ":" + home_, "--",
                             "/bin/sh", "-c", "ls -A " + home_});
  EXPECT_THAT(explicit_bind.out, HasSubstr("gateway.db")) << explicit_bind.err;
}

TEST_P(PrivateState, GatewaySandboxFromHostSeesNoState) {
  start_gateway_with_a_sandbox();
  ASSERT_EQ(os({"sandbox", "create", "--name", "onhost", "--from", "host"}).status, 0);
  Result r = os({"sandbox", "exec", "onhost", "--", "/bin/sh", "-c", peek_script()});
  EXPECT_EQ(r.status, 0) << r.err;
  expect_nothing_seen(r);
}

}  // namespace
}  // namespace e2e
