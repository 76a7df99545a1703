// sandbox connect: a terminal attached to a sandbox's main process, driven
// through a pseudo-terminal the test owns, as a person would: detach with
// Ctrl-P Ctrl-Q, attach again with the output replayed byte for byte, a
// second terminal taking over, the window size, a gateway killed meanwhile.
#include <signal.h>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

constexpr const char* kDetach = "\x10\x11";  // Ctrl-P Ctrl-Q
constexpr const char* kDetached = "\r\nopenshell: detached from sandbox";

class Connect : public GatewayTest {
 protected:
  Connect() : GatewayTest("connect") {}
  std::vector<std::string> env() const { return {"OPENSHELL_HOME=" + home_}; }
  // A sandbox whose main process answers each line it reads, on a terminal.
  void create_echoer(const std::string& name) {
    Result r = os({"sandbox", "create", "--name", name, "--tty", "-d", "--from", rootfs(), "--",
                   "sh", "-c",
                   "printf 'hello-%s\\n' $((6*7)); while read -r l; do printf 'got:%s\\n' "
                   "\"$l\"; done"});
    ASSERT_EQ(r.status, 0) << r.out << r.err;
  }
  // The sandbox's bytes a connect showed: all but openshell's own last line.
  static std::string shown(const std::string& output) {
    return output.substr(0, output.find("\r\nopenshell: "));
  }
  int gateway_pid() {
    for (const auto& p : gateway_processes(home_)) {
      const std::string pid = p.substr(0, p.find(':'));
      if (file_contents("/proc/" + pid + "/cmdline").rfind(std::string("openshell-gateway"), 0) ==
          0)
        return std::stoi(pid);
    }
    return -1;
  }
};
E2E_ALL_MODES(Connect);

TEST_P(Connect, DetachesAndAttachesAgainWithTheOutputReplayed) {
  create_echoer("c");
  std::string first;
  {
    PtyProcess term(mode(), {"sandbox", "connect", "c"}, env());
    ASSERT_TRUE(term.wait_for("hello-42\r\n")) << term.output();
    term.write("abc\r");
    ASSERT_TRUE(term.wait_for("got:abc\r\n")) << term.output();
    term.write(kDetach);
    ASSERT_TRUE(term.wait_for(kDetached)) << term.output();
    EXPECT_EQ(term.wait(), 0) << term.output();
    first = shown(term.output());
  }
  // The main process runs on: nothing of what was typed before reached it twice.
  EXPECT_EQ(phase("c"), "Ready");
  EXPECT_THAT(first, HasSubstr("abc\r\n"));  // the terminal's echo, from the sandbox
  PtyProcess again(mode(), {"sandbox", "connect", "c"}, env());
  ASSERT_TRUE(again.wait_for("got:abc\r\n")) << again.output();
  // Byte for byte what the first terminal saw, then what comes now.
  again.write("def\r");
  ASSERT_TRUE(again.wait_for("got:def\r\n")) << again.output();
  EXPECT_EQ(again.output().substr(0, first.size()), first);
  // --detach-keys chooses others; the default ones then reach the sandbox.
  again.write(kDetach);
  ASSERT_TRUE(again.wait_for(kDetached)) << again.output();
  EXPECT_EQ(again.wait(), 0);
  PtyProcess custom(mode(), {"sandbox", "connect", "--detach-keys", "ctrl-a,x", "--no-replay", "c"},
                    env());
  custom.write("ghi\r");
  ASSERT_TRUE(custom.wait_for("got:ghi\r\n")) << custom.output();
  EXPECT_THAT(custom.output(), Not(HasSubstr("hello-42")));  // --no-replay
  custom.write("\x01x");
  ASSERT_TRUE(custom.wait_for(kDetached)) << custom.output();
  EXPECT_EQ(custom.wait(), 0);
  EXPECT_EQ(phase("c"), "Ready");
}

TEST_P(Connect, ASecondTerminalTakesOverAndTheFirstIsTold) {
  create_echoer("t");
  PtyProcess one(mode(), {"sandbox", "connect", "t"}, env());
  ASSERT_TRUE(one.wait_for("hello-42")) << one.output();
  PtyProcess two(mode(), {"sandbox", "connect", "t"}, env());
  ASSERT_TRUE(two.wait_for("hello-42")) << two.output();
  ASSERT_TRUE(one.wait_for("another terminal connected to sandbox 't'")) << one.output();
  EXPECT_EQ(one.wait(), 0);
  // Only the newest terminal's keys reach the main process.
  two.write("from-two\r");
  ASSERT_TRUE(two.wait_for("got:from-two")) << two.output();
  two.write(kDetach);
  EXPECT_EQ(two.wait(), 0);
}

TEST_P(Connect, TheWindowSizeFollowsTheTerminalAndTheExitStatusComesBack) {
  // No command: a login shell on the terminal.
  Result r = os({"sandbox", "create", "--name", "w", "--tty", "-d", "--from", rootfs()});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  PtyProcess term(mode(), {"sandbox", "connect", "w"}, env(), 33, 99);
  term.write("stty size; echo sum-$((40+2))\r");
  ASSERT_TRUE(term.wait_for("sum-42")) << term.output();
  EXPECT_THAT(term.output(), HasSubstr("33 99"));
  const size_t before = term.output().size();
  term.resize(40, 120);
  ::usleep(200000);
  term.write("stty size\r");
  ASSERT_TRUE(term.wait_for("40 120", 15000, before)) << term.output();
  // The shell's end is the sandbox's, and connect's status.
  term.write("exit 7\r");
  EXPECT_EQ(term.wait(), 7) << term.output();
  EXPECT_TRUE(wait_phase("w", "Error")) << phase("w");
  EXPECT_EQ(field("w", "exit_code"), "7");
}

TEST_P(Connect, SurvivesTheGatewayBeingKilled) {
  create_echoer("g");
  PtyProcess term(mode(), {"sandbox", "connect", "g"}, env());
  ASSERT_TRUE(term.wait_for("hello-42")) << term.output();
  const int gateway = gateway_pid();
  ASSERT_GT(gateway, 0);
  ASSERT_TRUE(kill_and_wait(std::to_string(gateway)));
  // The terminal is the supervisor's, not the gateway's.
  term.write("after-kill\r");
  ASSERT_TRUE(term.wait_for("got:after-kill\r\n")) << term.output();
  term.write(kDetach);
  EXPECT_EQ(term.wait(), 0);
  // A new gateway (started by the command line) reaches the same console.
  PtyProcess again(mode(), {"sandbox", "connect", "g"}, env());
  ASSERT_TRUE(again.wait_for("got:after-kill\r\n")) << again.output();
  again.write(kDetach);
  EXPECT_EQ(again.wait(), 0);
}

TEST_P(Connect, WithoutATerminalShowsTheOutputAndRefusesWhatHasNoMainProcess) {
  ASSERT_EQ(os({"sandbox", "create", "--name", "plain", "--no-tty", "-d", "--from", rootfs(), "--",
                "sh", "-c", "echo plain-out; echo plain-err >&2; exec sleep 1000"})
                .status,
            0);
  PtyProcess term(mode(), {"sandbox", "connect", "plain"}, env());
  ASSERT_TRUE(term.wait_for("plain-err")) << term.output();
  EXPECT_THAT(term.output(), HasSubstr("plain-out"));
  term.write(kDetach);
  ASSERT_TRUE(term.wait_for(kDetached)) << term.output();
  EXPECT_EQ(term.wait(), 0);
  // An idle sandbox (no command, no terminal) has nothing to attach to.
  ASSERT_EQ(os({"sandbox", "create", "--name", "idle", "--no-tty", "--from", rootfs()}).status, 0);
  Result idle = os({"sandbox", "connect", "idle"});
  EXPECT_EQ(idle.status, 125);
  EXPECT_THAT(idle.err, HasSubstr("has no main process"));
  // Bad keys are refused before anything is reached; so is a stopped sandbox.
  Result keys = os({"sandbox", "connect", "--detach-keys", "ctrl-1", "plain"});
  EXPECT_EQ(keys.status, 125);
  EXPECT_THAT(keys.err, HasSubstr("--detach-keys ctrl-1"));
  ASSERT_EQ(os({"sandbox", "stop", "plain"}).status, 0);
  Result stopped = os({"sandbox", "connect", "plain"});
  EXPECT_EQ(stopped.status, 125);
  EXPECT_THAT(stopped.err, HasSubstr("connect needs a Ready sandbox"));
}

// `sandbox create` on a terminal gives the main process one (--tty is the
// default there) and attaches at once; Ctrl-P Ctrl-Q leaves it running.
TEST_P(Connect, CreateWithATerminalAttachesToIt) {
  PtyProcess create(mode(),
                    {"sandbox", "create", "--name", "a", "--from", rootfs(), "--", "sh", "-c",
                     "[ -t 0 ] && echo has-terminal; echo started; while read -r l; do echo "
                     "\"echo:$l\"; done"},
                    env());
  ASSERT_TRUE(create.wait_for("started")) << create.output();
  create.write("one\r");
  ASSERT_TRUE(create.wait_for("echo:one")) << create.output();
  create.write(kDetach);
  ASSERT_TRUE(create.wait_for(kDetached)) << create.output();
  EXPECT_EQ(create.wait(), 0);
  EXPECT_EQ(phase("a"), "Ready");
  EXPECT_THAT(create.output(), HasSubstr("has-terminal"));
}

}  // namespace
}  // namespace e2e
