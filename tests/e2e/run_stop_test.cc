// `openshell run` and a SIGTERM its sandbox does not act on: an init stopped
// from the host (SIGSTOP, as a debugger's attach leaves it) keeps the signal
// pending forever, so after OPENSHELL_STOP_GRACE_MS the run kills it.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;

namespace e2e {
namespace {

class RunStop : public ModeTest {};
E2E_ALL_MODES(RunStop);

// The pid of the process whose argv[0] is `name` and whose command line holds
// `marker`, or 0.
pid_t find_process(const std::string& name, const std::string& marker) {
  DIR* dir = ::opendir("/proc");
  if (!dir) return 0;
  pid_t found = 0;
  while (dirent* entry = ::readdir(dir)) {
    pid_t pid = std::atoi(entry->d_name);
    if (pid <= 0) continue;
    std::string cmdline = file_contents("/proc/" + std::string(entry->d_name) + "/cmdline");
    if (cmdline.compare(0, name.size() + 1, name + '\0') == 0 &&
        cmdline.find(marker) != std::string::npos) {
      found = pid;
      break;
    }
  }
  ::closedir(dir);
  return found;
}

// The parent's pid from /proc/PID/stat (after the command name, which may
// hold spaces and parentheses), or 0.
pid_t parent_of(pid_t pid) {
  std::string stat = file_contents("/proc/" + std::to_string(pid) + "/stat");
  size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  char state = 0;
  int ppid = 0;
  if (std::sscanf(stat.c_str() + close + 1, " %c %d", &state, &ppid) != 2) return 0;
  return ppid;
}

// argv[0] of a process, or "".
std::string command_name(pid_t pid) {
  std::string cmdline = file_contents("/proc/" + std::to_string(pid) + "/cmdline");
  return cmdline.substr(0, cmdline.find('\0'));
}

TEST_P(RunStop, AStoppedInitIsKilledOnceTheGraceIsOver) {
  const std::string marker = "stop-grace-" + mode_name(mode()) + "-" + std::to_string(::getpid());
  // From the host, stop the sandbox's init once its main process runs (an
  // init stopped before it starts the main process would never let it say
  // "ready"); the command says "ready" when it sees its PID 1 stopped, and
  // the SIGTERM follows.
  std::atomic<bool> done{false};
  std::atomic<pid_t> stopped{0};
  std::thread stopper([&] {
    while (!done) {
      if (pid_t main = find_process("sh", marker)) {
        pid_t init = parent_of(main);
        if (init > 0 && command_name(init) == "openshell-init" && ::kill(init, SIGSTOP) == 0)
          stopped = init;
        return;
      }
      ::usleep(10000);
    }
  });
  Options o;
  o.env = {"OPENSHELL_STOP_GRACE_MS=500"};
  o.signal_when = "ready";
  o.signal = SIGTERM;
  o.timeout_s = 60;
  Result r = sandbox(mode(), {},
                     {"sh", "-c",
                      "# " + marker +
                          "\nuntil grep -q '^State:.*stopped' /proc/1/status; do sleep 0.05; done; "
                          "echo ready; sleep 1000"},
                     o);
  done = true;
  stopper.join();
  ASSERT_NE(stopped.load(), 0) << "the init was not found to stop: " << r.err;
  EXPECT_FALSE(r.timed_out) << "the run did not end after SIGTERM to a stopped init";
  EXPECT_EQ(r.status, 128 + SIGKILL) << r.err;
  EXPECT_EQ(r.out, "ready\n");
  EXPECT_THAT(r.err, HasSubstr("the sandbox did not end within 500 ms of SIGTERM: killing it"));
}

// Within the grace, a main process that takes its time over SIGTERM ends as
// it chooses, and nothing is killed.
TEST_P(RunStop, AMainProcessEndsAsItChoosesWithinTheGrace) {
  Options o;
  o.env = {"OPENSHELL_STOP_GRACE_MS=30000"};
  o.signal_when = "ready";
  o.signal = SIGTERM;
  Result r = sandbox(mode(), {},
                     {"sh", "-c",
                      "trap 'sleep 1; echo cleaned; exit 3' TERM; echo ready; "
                      "while :; do sleep 0.1; done"},
                     o);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 3) << r.err;
  EXPECT_EQ(r.out, "ready\ncleaned\n");
  EXPECT_THAT(r.err, testing::Not(HasSubstr("killing it")));
}

TEST_P(RunStop, ABadGraceIsOneLine) {
  Options o;
  o.env = {"OPENSHELL_STOP_GRACE_MS=10s"};
  Result r = sandbox(mode(), {}, {"sh", "-c", "echo ran"}, o);
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.out, "") << "bad input never starts a sandbox";
  EXPECT_EQ(r.err,
            "openshell: OPENSHELL_STOP_GRACE_MS '10s': not a whole number of milliseconds from 1 "
            "to 86400000\n");
}

}  // namespace
}  // namespace e2e
