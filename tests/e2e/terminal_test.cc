// The caller's terminal without --tty: the sandbox gets pipes that openshell
// relays, never the terminal itself, so it cannot change the caller's
// terminal settings or make it its controlling terminal.
#include <unistd.h>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

class Terminal : public ModeTest {};
E2E_ALL_MODES(Terminal);

Options on_pty() {
  Options o;
  o.pty = true;
  return o;
}

// What osh-probe's tty-attack prints on the caller's pty where no fd is a
// terminal: every attempt refused, each with its reason (lines in CRLF);
// /dev/tty's is `dev_tty`.
std::string refused_tty_attack(const std::string& dev_tty) {
  std::string out;
  for (int fd = 0; fd < 3; ++fd) {
    std::string n = std::to_string(fd);
    out += "fd " + n + " isatty 0\r\nfd " + n + " tcgetattr Inappropriate ioctl for device\r\nfd " +
           n + " TIOCSCTTY Inappropriate ioctl for device\r\n";
  }
  return out + "open /dev/tty " + dev_tty + "\r\n";
}

// The attack: tcsetattr (echo and canonical mode off) and TIOCSCTTY on fds
// 0-2, then /dev/tty. With the terminal's fds it would have worked.
TEST_P(Terminal, WithoutTtyTheSandboxCannotTouchTheCallersTerminal) {
  for (const std::vector<std::string>& extra :
       {std::vector<std::string>{}, std::vector<std::string>{"--user", "0", "--cap-add", "ALL"}}) {
    Result r = sandbox(mode(), extra, {"osh-probe", "tty-attack"}, on_pty());
    ASSERT_EQ(r.status, 0) << r.out << r.err;
    ASSERT_FALSE(r.pty_settings_before.empty());
    EXPECT_EQ(r.pty_settings_after, r.pty_settings_before) << "the caller's terminal was changed";
    // No controlling terminal in the sandbox.
    EXPECT_EQ(r.out, refused_tty_attack("No such device or address"));
  }
}

// What still works: input reaches the command, output comes in order, the
// exit status passes through.
TEST_P(Terminal, WithoutTtyStdioStillFlows) {
  Options o = on_pty();
  o.stdin_data = "hello\n";
  Result r = sandbox(mode(), {},
                     {"sh", "-c",
                      "read line; echo \"got $line\"; echo to-stderr >&2; echo to-stdout; "
                      "test -t 0 || echo stdin-not-a-terminal; "
                      "test -t 1 || echo stdout-not-a-terminal; exit 7"},
                     o);
  EXPECT_EQ(r.status, 7) << r.out << r.err;
  auto got = r.out.find("got hello\r\n");
  auto err = r.out.find("to-stderr\r\n");
  auto out = r.out.find("to-stdout\r\n");
  ASSERT_NE(got, std::string::npos) << r.out;
  ASSERT_NE(err, std::string::npos) << r.out;
  ASSERT_NE(out, std::string::npos) << r.out;
  EXPECT_LT(got, err);
  EXPECT_LT(err, out);
  EXPECT_THAT(r.out, HasSubstr("stdin-not-a-terminal"));
  EXPECT_THAT(r.out, HasSubstr("stdout-not-a-terminal"));
  EXPECT_EQ(r.pty_settings_after, r.pty_settings_before);
}

// With --tty the sandbox has a terminal of its own (not the caller's).
TEST_P(Terminal, WithTtyTheSandboxHasItsOwnTerminal) {
  Result r = sandbox(mode(), {"-t"}, {"sh", "-c", "test -t 0 && test -t 1 && echo own-terminal"},
                     on_pty());
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("own-terminal"));
  EXPECT_EQ(r.pty_settings_after, r.pty_settings_before);
}

// The gateway's sandboxes never get the caller's terminal either: exec
// without -t and a main process run on the supervisor's pipes.
TEST_P(Terminal, GatewaySandboxesWithoutTtyGetNoTerminal) {
  static int counter = 0;
  const std::string home =
      make_dir(mode(), "tty-home-" + mode_name(mode()) + "-" + std::to_string(++counter), 0700);
  GatewayGuard gateway(mode(), home);  // whatever fails below, the gateway goes
  auto os = [&](const std::vector<std::string>& args, Options o) {
    o.env.push_back("OPENSHELL_HOME=" + home);
    return openshell(mode(), args, o);
  };
  Result create = os({"sandbox", "create", "--name", "t", "--no-tty", "--from", rootfs(), "--",
                      "osh-probe", "tty-attack"},
                     on_pty());
  EXPECT_EQ(create.status, 0) << create.out << create.err;
  // In a gateway's sandbox /dev/tty does not open either: EACCES.
  EXPECT_EQ(create.out, refused_tty_attack("Permission denied"));
  EXPECT_EQ(create.pty_settings_after, create.pty_settings_before);
  // On a terminal, create's default is --tty: a terminal of the sandbox's
  // own, which create attaches to; the caller's is left as it was.
  Result own = os({"sandbox", "create", "--name", "own", "--from", rootfs(), "--", "sh", "-c",
                   "test -t 0 && test -t 1 && echo own-terminal; tty"},
                  on_pty());
  EXPECT_EQ(own.status, 0) << own.out << own.err;
  EXPECT_THAT(own.out, HasSubstr("own-terminal"));
  EXPECT_THAT(own.out, HasSubstr("/dev/pts/0"));  // the sandbox's devpts, its first
  EXPECT_EQ(own.pty_settings_after, own.pty_settings_before);
  Result idle = os({"sandbox", "create", "--name", "idle", "--from", rootfs()}, Options{});
  ASSERT_EQ(idle.status, 0) << idle.err;
  Result exec = os({"sandbox", "exec", "idle", "--", "osh-probe", "tty-attack"}, on_pty());
  EXPECT_EQ(exec.status, 0) << exec.out << exec.err;
  EXPECT_EQ(exec.out, refused_tty_attack("Permission denied"));
  EXPECT_EQ(exec.pty_settings_after, exec.pty_settings_before);
}

}  // namespace
}  // namespace e2e
