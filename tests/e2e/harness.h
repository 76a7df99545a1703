// End-to-end harness: runs the real openshell binary as root and as
// ordinary users that the tests create (and remove), and inspects the host
// for anything left behind.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

namespace e2e {

enum class Mode {
  kRoot,            // as root: a subordinate id range, idmapped root
  kRootlessSubuid,  // an ordinary user with /etc/subuid: newuidmap
  kRootlessSingle,  // a system user without: a single-id map
};

std::string mode_name(Mode mode);
bool is_rootless(Mode mode);

struct Result {
  int status = -1;  // exit code, or 128+signal
  std::string out;
  std::string err;
  bool timed_out = false;
  // With Options::pty: the terminal's settings (termios, as text) before
  // openshell started and once it ended.
  std::string pty_settings_before, pty_settings_after;
};

struct Options {
  std::string stdin_data;
  int timeout_s = 30;
  bool pty = false;  // run under a pseudo-terminal (stdin, stdout, stderr all on it)
  unsigned short rows = 0, cols = 0;
  std::vector<int> leak_fds;     // fds left open (not close-on-exec) into openshell
  std::vector<int> pass_fds;     // given to openshell as its fds 3, 4, ... (--preserve-fds)
  std::vector<std::string> env;  // extra KEY=VALUE for openshell's environment
  std::string signal_when;       // once stdout holds this text...
  int signal = 0;                // ...send this signal to openshell
  // A rootless mode's supplementary groups (none by default), as a user
  // in those groups runs openshell.
  std::vector<gid_t> groups;
};

// openshell ARGS... as the mode's user.
Result openshell(Mode mode, const std::vector<std::string>& args, const Options& options = {});

// openshell ARGS... as the mode's user on a pseudo-terminal of the test's
// own, driven as a person at a terminal would: keys written, output read as
// it comes. The destructor kills it if it still runs.
class PtyProcess {
 public:
  PtyProcess(Mode mode, const std::vector<std::string>& args,
             const std::vector<std::string>& env = {}, unsigned short rows = 24,
             unsigned short cols = 80);
  ~PtyProcess();
  PtyProcess(const PtyProcess&) = delete;
  PtyProcess& operator=(const PtyProcess&) = delete;

  void write(const std::string& bytes);                   // as typed
  void resize(unsigned short rows, unsigned short cols);  // and SIGWINCH, as a terminal does
  // Reads until the output from byte `from` on holds text; whether it did
  // within the time.
  bool wait_for(const std::string& text, int timeout_ms = 15000, size_t from = 0);
  // Everything it wrote to the terminal so far.
  const std::string& output() const { return output_; }
  // Its exit status (128+N for a signal); -1 when it had not ended in time
  // (it is killed then).
  int wait(int timeout_ms = 15000);

 private:
  bool read_some(int timeout_ms);

  Mode mode_;
  std::vector<std::string> env_;
  int master_ = -1;
  pid_t pid_ = -1;
  std::string output_;
  bool eof_ = false;
  std::optional<int> status_;
};

// openshell run --rootfs <busybox root> RUN_ARGS... -- COMMAND...
Result sandbox(Mode mode, const std::vector<std::string>& run_args,
               const std::vector<std::string>& command, const Options& options = {});

// Paths prepared by the environment (all readable by the test users).
const std::string& binary();   // a copy of build/openshell
const std::string& rootfs();   // busybox root with /usr/bin/osh-probe
const std::string& scratch();  // a 0755 directory, removed at the end
uid_t uid_of(Mode mode);
gid_t gid_of(Mode mode);

// Makes a directory under scratch() owned by the mode's user.
std::string make_dir(Mode mode, const std::string& name, mode_t perms = 0755);
std::string write_file(const std::string& path, const std::string& content, mode_t perms = 0644);

// What the tests' openshell may leave on the host: mounts under scratch()
// (and pivot leftovers), cgroups named after a run or sandbox the tests
// started (or holding their processes), and init processes descended from
// the tests' copy of the binary. Others' sandboxes are not counted.
std::vector<std::string> leftover_mounts();
std::vector<std::string> leftover_cgroups();
// Removes the cgroup `name` (an engine's parent of its containers' cgroups:
// containerd's namespace, docker, libpod_parent) from every hierarchy,
// with its empty children; what still holds a task or a cgroup of someone
// else's running stays (rmdir refuses it).
void remove_empty_cgroups(const std::string& name);
std::vector<std::string> leftover_processes();
// A new test: the runs of earlier ones no longer count as its own.
void forget_started_processes();

// A file's bytes ("" when it cannot be read).
std::string file_contents(const std::string& path);
// The names in a directory, space separated ("" when empty or missing).
std::string file_contents_of_dir(const std::string& dir);

// The body of an HTTP/1.1 message whose head ends at `from` in `data`:
// chunked (decoded into *body) or of `length` bytes. False while it has
// not all arrived; else *next is where the next message starts.
bool take_http_body(const std::string& data, size_t from, bool chunked, size_t length,
                    std::string* body, size_t* next);
// Every regular file under dir (recursively) that holds `text`.
std::vector<std::string> files_holding(const std::string& dir, const std::string& text);

// Processes whose command line holds the text; their command lines and
// environments (NULs as in /proc, so search for "KEY=VALUE\0").
std::vector<std::string> processes_matching(const std::string& text);

// The openshell processes (gateway, supervisors) whose OPENSHELL_HOME is
// home, as "PID:COMMAND".
std::vector<std::string> gateway_processes(const std::string& home);
// Deletes every sandbox of the gateway of home, stops it, and waits up to
// 30 s for its processes to go: those still there.
std::vector<std::string> stop_gateway(Mode mode, const std::string& home);

// Stops the gateway of home when it goes out of scope, so that a test whose
// assertion ends it midway leaves no gateway or sandbox behind (and fails
// when its processes outlive the stop). Declare it right after the home.
class GatewayGuard {
 public:
  GatewayGuard(Mode mode, std::string home) : mode_(mode), home_(std::move(home)) {}
  ~GatewayGuard();
  GatewayGuard(const GatewayGuard&) = delete;
  GatewayGuard& operator=(const GatewayGuard&) = delete;

 private:
  Mode mode_;
  std::string home_;
};
std::string command_of(const std::string& pid);
// Sends SIGKILL to PID and waits (30 s at most) until it has ended: a
// gateway between the signal and its end still accepts a connection, only
// to close it. Whether it ended.
bool kill_and_wait(const std::string& pid);
std::string environment_of(const std::string& pid);

// A TCP server on 127.0.0.1, on a free port: `serve` gets each connection
// on a thread of its own (and closes it). The destructor stops accepting
// and waits for those threads; a server made of one, as a member, declares
// it last so that it goes first.
class LoopbackTcpServer {
 public:
  explicit LoopbackTcpServer(std::function<void(int fd)> serve);
  ~LoopbackTcpServer();
  LoopbackTcpServer(const LoopbackTcpServer&) = delete;
  LoopbackTcpServer& operator=(const LoopbackTcpServer&) = delete;
  uint16_t port() const { return port_; }
  bool stopping() const { return stop_.load(); }  // for serve's own waits

 private:
  int listener_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// A TCP port on 127.0.0.1 that refuses every connection while this lives:
// a socket bound to it that does not listen (so no other program takes it,
// as it could a port that was merely closed).
class RefusedPort {
 public:
  RefusedPort();
  ~RefusedPort();
  RefusedPort(const RefusedPort&) = delete;
  RefusedPort& operator=(const RefusedPort&) = delete;
  uint16_t port() const { return port_; }

 private:
  int socket_ = -1;
  uint16_t port_ = 0;
};

// A server on 127.0.0.1 for egress tests: an HTTP GET gets a 200 with body
// "hello from the test server"; an upgrade request gets a 101 and then an
// echo; anything else is echoed back. It counts its connections, and
// those it has finished with (the peer closed, or it answered).
// Whether /dev/kvm is backed by hardware (vmx or svm in /proc/cpuinfo), on
// which Linux guests boot; this machine's PVM is not.
bool hardware_kvm();

class TestServer {
 public:
  TestServer();
  uint16_t port() const { return server_.port(); }
  int connections() const { return connections_.load(); }
  int finished() const { return finished_.load(); }

 private:
  std::atomic<int> connections_{0}, finished_{0};
  LoopbackTcpServer server_;
};

// A DNS server on 127.0.0.1 that answers every A query with 127.0.0.1 and
// counts the queries it got (to prove that some never leave the host).
class TestDnsServer {
 public:
  TestDnsServer();
  ~TestDnsServer();
  uint16_t port() const { return port_; }
  int queries() const { return queries_.load(); }

 private:
  int socket_ = -1;
  uint16_t port_ = 0;
  std::atomic<int> queries_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The test suites take the mode as their parameter.
// After every test: nothing of a sandbox is left on the host (counting only
// what appeared during the test: other sandboxes on the machine are not ours).
class ModeTest : public testing::TestWithParam<Mode> {
 protected:
  Mode mode() const { return GetParam(); }
  void SetUp() override {
    if (binary().empty()) GTEST_SKIP() << "e2e tests need root (to create the test users)";
    forget_started_processes();
    mounts_before_ = leftover_mounts();
    cgroups_before_ = leftover_cgroups();
    processes_before_ = leftover_processes();
  }
  void TearDown() override {
    if (binary().empty()) return;
    EXPECT_EQ(new_since(leftover_mounts(), mounts_before_), std::vector<std::string>{})
        << "mounts left behind";
    EXPECT_EQ(new_since(leftover_cgroups(), cgroups_before_), std::vector<std::string>{})
        << "cgroups left behind";
    EXPECT_EQ(new_since(leftover_processes(), processes_before_), std::vector<std::string>{})
        << "processes left behind";
  }
  static std::vector<std::string> new_since(std::vector<std::string> now,
                                            const std::vector<std::string>& before) {
    std::erase_if(now, [&](const std::string& x) {
      return std::find(before.begin(), before.end(), x) != before.end();
    });
    return now;
  }

 protected:
  std::vector<std::string> mounts_before_, cgroups_before_, processes_before_;
};

std::string param_name(const testing::TestParamInfo<Mode>& info);

// A test of a gateway: its own state home, `<prefix>-<mode>-<n>` made 0700,
// which os() points the command line at; at the end the gateway and its
// supervisors are stopped and, unless told otherwise, no sandbox's file is
// left in the home.
class GatewayTest : public ModeTest {
 protected:
  explicit GatewayTest(std::string prefix, bool check_sandbox_files = true)
      : prefix_(std::move(prefix)), check_sandbox_files_(check_sandbox_files) {}
  void SetUp() override;
  void TearDown() override;

  Options with_home(Options o = {}) const;
  virtual Result os(const std::vector<std::string>& args, Options o = {});
  // A key of `sandbox get NAME -o json`, unquoted; "" when absent.
  std::string field(const std::string& name, const std::string& key);
  std::string phase(const std::string& name) { return field(name, "phase"); }
  // Generous for a loaded machine; ends as soon as the phase is there.
  bool wait_phase(const std::string& name, const std::string& want, int ms = 30000);

  std::string home_;

 private:
  std::string prefix_;
  bool check_sandbox_files_;
};

#define E2E_ALL_MODES(Suite)                                                                     \
  INSTANTIATE_TEST_SUITE_P(                                                                      \
      Modes, Suite,                                                                              \
      testing::Values(e2e::Mode::kRoot, e2e::Mode::kRootlessSubuid, e2e::Mode::kRootlessSingle), \
      e2e::param_name)

}  // namespace e2e
