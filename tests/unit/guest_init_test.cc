// The guest init's server side (runtime/guest_init.h), in a plain process:
// its frames, its configuration, and serve_connection() over a socket pair
// running real commands: output, stdin, exit codes, the failures' codes, a
// kill, a host that goes away, and each command confined (no_new_privs, the
// seccomp filter, which it cannot lift, and the policy's Landlock rules).
#include "runtime/guest_init.h"

#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "base/files.h"
#include "policy/policy.h"
#include "runtime/init_protocol.h"
#include "runtime/landlock.h"
#include "test_util.h"

namespace openshell::runtime::guest {
namespace {

struct Result {
  std::string out, err;
  std::string end;  // "exited N" or "failed CODE\nMESSAGE"
  bool started = false;
  int served = -1;
};

// Runs serve_connection on one end of a socket pair in a thread; the test
// is the host on the other end: sends `frames`, then reads to the end.
Result exchange(const std::string& frames, const Config& config = {},
                bool close_after_started = false, Confinement confinement = {}) {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  Result r;
  std::thread server([&] {
    r.served = serve_connection(sv[1], config, confinement);
    close(sv[1]);
  });
  files::write_all(sv[0], frames);
  std::string in;
  char buf[4096];
  bool done = false;
  while (!done) {
    ssize_t n = read(sv[0], buf, sizeof buf);
    if (n <= 0) break;
    in.append(buf, static_cast<size_t>(n));
    while (auto f = take_frame(&in)) {
      switch (f->type) {
        case FrameType::kStarted:
          r.started = true;
          if (close_after_started) {
            close(sv[0]);
            sv[0] = -1;
            done = true;
          }
          break;
        case FrameType::kStdout:
          r.out += f->bytes;
          break;
        case FrameType::kStderr:
          r.err += f->bytes;
          break;
        case FrameType::kExited:
          r.end = "exited " + f->bytes;
          break;
        case FrameType::kFailed:
          r.end = "failed " + f->bytes;
          break;
        default:
          break;
      }
      if (done) break;
    }
  }
  server.join();
  if (sv[0] >= 0) close(sv[0]);
  return r;
}

std::string exec_frame(std::vector<std::string> argv, std::vector<std::string> env = {}) {
  ExecRequest request;
  request.id = 1;
  request.argv = std::move(argv);
  request.env = std::move(env);
  return encode_frame(FrameType::kExec, encode_exec(request));
}

TEST(GuestFrames, RoundTripAndSplitAnywhere) {
  std::string stream = encode_frame(FrameType::kStdin, "abc") + encode_frame(FrameType::kEof, "");
  std::string buffer;
  std::vector<Frame> got;
  for (char c : stream) {  // one byte at a time
    buffer.push_back(c);
    while (auto f = take_frame(&buffer)) got.push_back(*f);
  }
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].type, FrameType::kStdin);
  EXPECT_EQ(got[0].bytes, "abc");
  EXPECT_EQ(got[1].type, FrameType::kEof);
  EXPECT_TRUE(buffer.empty());
}

TEST(GuestFrames, HostileFramesAreRefusedBeforeTheirBytesArrive) {
  std::string huge = encode_frame(FrameType::kStdin, "");
  huge[1] = '\x7f';  // a 2 GiB length: refused from the header alone
  EXPECT_THROW(take_frame(&huge), Error);
  std::string unknown = "\x63\0\0\0\0";
  EXPECT_THROW(take_frame(&unknown), Error);
  std::string exact = encode_frame(FrameType::kStdin, std::string(kMaxFrame, 'x'));
  EXPECT_TRUE(take_frame(&exact).has_value());
}

TEST(GuestConfig, RoundTripsAndNamesWhatIsWrong) {
  Config c;
  c.disk = "/dev/vda";
  c.layer = "/dev/vdb";
  c.argv = {"/bin/sh", "-c", "sleep 1"};
  c.env = {"PATH=/bin"};
  c.workdir = "/sandbox";
  c.uid = 1000;
  c.gid = 1000;
  c.port = 1024;
  c.status_port = 1025;
  c.egress_port = 3128;
  c.dns_port = 53;
  c.hostname = "sandbox-1.example";
  c.landlock_policy = "version = 1\n[filesystem_policy]\nread_only = [\"/usr\"]\n";
  c.landlock_warn_missing = false;
  c.proc_read_only = true;
  EXPECT_EQ(decode_config(encode_config(c)), c);
  EXPECT_EQ(decode_config("{}"), Config{}) << "every key may be left out";
  auto message = [](const char* text) {
    try {
      decode_config(text);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("{").find("not JSON"), std::string::npos);
  EXPECT_NE(message("[]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(message("{\"argv\": \"sh\"}").find("wrong type"), std::string::npos);
  EXPECT_NE(message("{\"uid\": -1}").find("\"uid\" must be a whole number"), std::string::npos);
  EXPECT_NE(message("{\"port\": 4294967296}").find("\"port\" must be"), std::string::npos);
  for (const char* key : {"status_port", "egress_port", "dns_port"}) {
    std::string k = key;
    EXPECT_NE(message(("{\"" + k + "\": 4294967296}").c_str()).find("\"" + k + "\" must be"),
              std::string::npos)
        << key;
    EXPECT_NE(message(("{\"" + k + "\": \"53\"}").c_str()).find("\"" + k + "\" must be"),
              std::string::npos)
        << key;
  }
  EXPECT_NE(message("{\"hostname\": 1}").find("wrong type"), std::string::npos);
  EXPECT_NE(message("{\"hostname\": \"a b\"}").find("hostname must be"), std::string::npos);
  EXPECT_NE(message("{\"hostname\": \"x\\nhost\"}").find("hostname must be"), std::string::npos);
  EXPECT_NE(message("{\"landlock_policy\": 1}").find("wrong type"), std::string::npos);
  EXPECT_NE(message("{\"landlock_warn_missing\": 1}").find("wrong type"), std::string::npos);
  EXPECT_NE(message("{\"proc_read_only\": \"yes\"}").find("wrong type"), std::string::npos);
  EXPECT_NE(
      message("{\"landlock_policy\": \"version = 1\\n[filesystem_policy]\\nread_only = 3\\n\"}")
          .find("guest config: landlock_policy:"),
      std::string::npos)
      << "a policy that does not parse is refused with the config";
  EXPECT_NE(message("{\"shell\": 1}").find("unknown key \"shell\""), std::string::npos);
  EXPECT_NE(message("{\"workdir\": \"rel\"}").find("absolute"), std::string::npos);
  EXPECT_NE(message("{\"layer\": \"/dev/vdb\"}").find("layer without a disk"), std::string::npos);
}

TEST(GuestServe, RunsACommandWithItsOutputAndExitCode) {
  Result r = exchange(exec_frame({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}));
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.out, "out\n");
  EXPECT_EQ(r.err, "err\n");
  EXPECT_EQ(r.end, "exited 3");
  EXPECT_EQ(r.served, 3);
}

TEST(GuestServe, RelaysStdinUntilEof) {
  std::string big(300000, 'z');  // more than a pipe holds
  std::string frames = exec_frame({"cat"}) + encode_frame(FrameType::kStdin, "hello ") +
                       encode_frame(FrameType::kStdin, big) + encode_frame(FrameType::kEof, "");
  Result r = exchange(frames);
  EXPECT_EQ(r.out.size(), 6 + big.size());
  EXPECT_EQ(r.out.substr(0, 6), "hello ");
  EXPECT_EQ(r.end, "exited 0");
}

TEST(GuestServe, TheEnvironmentAndPathAreTheRequestsOrTheConfigs) {
  Config config;
  config.env = {"PATH=/usr/bin:/bin", "WHO=config"};
  EXPECT_EQ(exchange(exec_frame({"sh", "-c", "echo $WHO"}), config).out, "config\n");
  EXPECT_EQ(
      exchange(exec_frame({"sh", "-c", "echo $WHO"}, {"PATH=/bin", "WHO=request"}), config).out,
      "request\n");
}

TEST(GuestServe, FailuresCarryTheDocumentedCodes) {
  EXPECT_EQ(exchange(exec_frame({"/no/such/program"})).end.substr(0, 11), "failed 127\n");
  EXPECT_EQ(exchange(exec_frame({"no-such-program-anywhere"})).end.substr(0, 11), "failed 127\n");
  EXPECT_EQ(exchange(exec_frame({"/etc/hostname"})).end.substr(0, 11), "failed 126\n");
  Result bad_first = exchange(encode_frame(FrameType::kStdin, "x"));
  EXPECT_EQ(bad_first.end, "failed 125\nguest stream: the first frame is not exec");
  EXPECT_FALSE(bad_first.started);
  Result garbage = exchange(encode_frame(FrameType::kExec, "exec\0nonsense"));
  EXPECT_EQ(garbage.end, "failed 125\nguest stream: a malformed exec request");
  Result unknown = exchange(std::string("\x42\0\0\0\0", 5));
  EXPECT_EQ(unknown.end.substr(0, 11), "failed 125\n");
}

TEST(GuestServe, AKillFrameSignalsTheCommand) {
  std::string frames = exec_frame({"sleep", "30"}) + encode_frame(FrameType::kKill, "15");
  Result r = exchange(frames);
  EXPECT_EQ(r.end, "exited 143");
}

TEST(GuestServe, AHostThatGoesAwayTakesItsCommandWithIt) {
  // The command would run for a minute; the host closes once it started.
  auto begin = std::chrono::steady_clock::now();
  Result r = exchange(exec_frame({"sleep", "60"}), {}, /*close_after_started=*/true);
  EXPECT_TRUE(r.started);
  EXPECT_EQ(r.served, 128 + SIGKILL);
  EXPECT_LT(std::chrono::steady_clock::now() - begin, std::chrono::seconds(20));
}

TEST(GuestServe, CommandsRunConfinedAndCannotLiftIt) {
  Result r = exchange(exec_frame(
      {"/bin/sh", "-c", "grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status"}));
  EXPECT_NE(r.out.find("NoNewPrivs:\t1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Seccomp:\t2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CapEff:\t0000000000000000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("CapBnd:\t0000000000000000"), std::string::npos) << r.out;
  // The default profile refuses what would let a sandbox out (a new user
  // namespace, here); without the filter the same command works.
  Result escape = exchange(exec_frame({"unshare", "-U", "true"}));
  EXPECT_TRUE(escape.started);
  EXPECT_NE(escape.end, "exited 0") << escape.err;
  Confinement none;
  none.seccomp = false;
  none.drop_capabilities = false;
  Result free = exchange(exec_frame({"unshare", "-U", "true"}), {}, false, none);
  EXPECT_EQ(free.end, "exited 0") << "the same command, unfiltered: " << free.err;
}

// ---- exec with a terminal ----------------------------------------------------------

// serve_connection in a thread with the test as its host, step by step:
// frames sent when the test says, the output read until what it waits for.
class TtyHost {
 public:
  explicit TtyHost(const ExecRequest& request) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    host_ = sv[0];
    guest_ = sv[1];
    server_ = std::thread([this] {
      served_ = serve_connection(guest_, Config{}, Confinement{});
      close(guest_);
    });
    send(FrameType::kExec, encode_exec(request));
  }
  ~TtyHost() {
    shutdown(host_, SHUT_RDWR);  // a test that failed midway: the command is killed
    if (server_.joinable()) server_.join();
    close(host_);
  }
  void send(FrameType type, std::string_view bytes) {
    files::write_all(host_, encode_frame(type, bytes));
  }
  // Reads frames until the output has text: whether it came before the end.
  bool read_until(const std::string& text) {
    return read_while([&] { return out.find(text) == std::string::npos; });
  }
  // Reads to the end: "exited N" or "failed CODE\nMESSAGE".
  std::string finish() {
    read_while([] { return true; });
    return end;
  }
  // serve_connection's return, once it has.
  int served() {
    finish();
    if (server_.joinable()) server_.join();
    return served_;
  }

  std::string out, err, end;

 private:
  bool read_while(const std::function<bool()>& more) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (more()) {
      if (!end.empty() || std::chrono::steady_clock::now() > deadline) return false;
      pollfd pfd{host_, POLLIN, 0};
      if (poll(&pfd, 1, 200) <= 0) continue;
      char buf[4096];
      ssize_t n = read(host_, buf, sizeof buf);
      if (n <= 0) return false;
      in_.append(buf, static_cast<size_t>(n));
      while (auto f = take_frame(&in_)) {
        if (f->type == FrameType::kStdout) out += f->bytes;
        if (f->type == FrameType::kStderr) err += f->bytes;
        if (f->type == FrameType::kExited) end = "exited " + f->bytes;
        if (f->type == FrameType::kFailed) end = "failed " + f->bytes;
      }
    }
    return true;
  }

  int host_ = -1, guest_ = -1;
  std::thread server_;
  std::string in_;
  std::atomic<int> served_{-1};
};

ExecRequest tty_request(std::vector<std::string> argv, uint16_t rows = 24, uint16_t cols = 80) {
  ExecRequest request;
  request.id = 1;
  request.tty = true;
  request.rows = rows;
  request.cols = cols;
  request.argv = std::move(argv);
  return request;
}

TEST(GuestFrames, ASizeIsRowsSpaceColumns) {
  EXPECT_EQ(encode_size(40, 120), "40 120");
  EXPECT_EQ(decode_size("40 120"), (std::pair<uint16_t, uint16_t>{40, 120}));
  EXPECT_EQ(decode_size(encode_size(65535, 0)), (std::pair<uint16_t, uint16_t>{65535, 0}));
  for (const char* wrong : {"", "40", "40 ", " 120", "40  120", "40 65536", "-1 2", "40x120"})
    EXPECT_FALSE(decode_size(wrong)) << wrong;
}

TEST(GuestTty, TheCommandRunsOnAPtyOfItsOwnWithOneStreamAndItsStatus) {
  TtyHost host(tty_request({"sh", "-c", "tty; echo to-stderr >&2; exit 7"}));
  EXPECT_EQ(host.finish(), "exited 7") << host.out;
  EXPECT_EQ(host.out.rfind("/dev/pts/", 0), 0u) << host.out;
  // A terminal has one stream, with its own line endings.
  EXPECT_NE(host.out.find("to-stderr\r\n"), std::string::npos) << host.out;
  EXPECT_EQ(host.err, "");
  EXPECT_EQ(host.served(), 7);
}

TEST(GuestTty, ItHasTheRequestedSizeAndTheNewOneAfterAResize) {
  TtyHost host(tty_request({"sh", "-c", "stty size; read line; stty size"}, 30, 100));
  ASSERT_TRUE(host.read_until("30 100\r\n")) << host.out << host.end;
  host.send(FrameType::kResize, encode_size(40, 120));
  host.send(FrameType::kStdin, "\n");
  ASSERT_TRUE(host.read_until("40 120\r\n")) << host.out << host.end;
  EXPECT_EQ(host.finish(), "exited 0");
  // A resize that is not one changes nothing and ends nothing.
  TtyHost bad(tty_request({"sh", "-c", "read line; stty size"}, 30, 100));
  bad.send(FrameType::kResize, "huge");
  bad.send(FrameType::kStdin, "\n");
  EXPECT_EQ(bad.finish(), "exited 0");
  EXPECT_NE(bad.out.find("30 100\r\n"), std::string::npos) << bad.out;
}

TEST(GuestTty, InputEchoesAndEofIsTheTerminalsEndOfFile) {
  TtyHost host(tty_request({"cat"}));
  host.send(FrameType::kStdin, "hello\n");
  // The terminal's echo, then cat's copy.
  ASSERT_TRUE(host.read_until("hello\r\nhello\r\n")) << host.out << host.end;
  host.send(FrameType::kEof, "");
  EXPECT_EQ(host.finish(), "exited 0") << "cat read the end of its input";
}

TEST(GuestTty, ItIsTheControllingTerminalAndAKillSignalsTheGroup) {
  // ^C reaches the foreground job only through a controlling terminal.
  TtyHost interrupted(tty_request({"sleep", "30"}));
  interrupted.send(FrameType::kStdin, "\x03");
  EXPECT_EQ(interrupted.finish(), "exited 130");
  TtyHost killed(tty_request({"sh", "-c", "sleep 30; true"}));
  killed.send(FrameType::kKill, "15");
  EXPECT_EQ(killed.finish(), "exited 143");
}

TEST(GuestTty, ThePtyIsTheCommandsUsers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root (to run the command as another user)";
  ExecRequest request = tty_request({"sh", "-c", "stat -c %u:%g \"$(tty)\"; id -u"});
  request.user = ExecUser{65534, 65534};
  TtyHost host(request);
  EXPECT_EQ(host.finish(), "exited 0") << host.out;
  EXPECT_EQ(host.out, "65534:65534\r\n65534\r\n");
}

TEST(GuestTty, ResizeWithoutATtyIsIgnored) {
  std::string frames = exec_frame({"sh", "-c", "read line; echo $line"}) +
                       encode_frame(FrameType::kResize, encode_size(40, 120)) +
                       encode_frame(FrameType::kStdin, "still\n") +
                       encode_frame(FrameType::kEof, "");
  Result r = exchange(frames);
  EXPECT_EQ(r.out, "still\n");
  EXPECT_EQ(r.end, "exited 0");
}

TEST(GuestServe, TheListenerServesConnectionsSideBySide) {
  int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  // An abstract name: nothing to remove afterwards.
  std::string name = "osh-guest-test-" + std::to_string(getpid());
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&addr), len), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  pid_t server = fork();
  if (server == 0) serve_forever(listener, {}, {});
  close(listener);
  auto connect_one = [&] {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), len), 0);
    return fd;
  };
  auto read_to_end = [](int fd) {
    std::string in, out, end;
    char buf[4096];
    for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) {
      in.append(buf, static_cast<size_t>(n));
      while (auto f = take_frame(&in)) {
        if (f->type == FrameType::kStdout) out += f->bytes;
        if (f->type == FrameType::kExited) end = f->bytes;
      }
    }
    close(fd);
    return out + "|" + end;
  };
  // The first waits on its stdin while the second runs to its end.
  int first = connect_one();
  files::write_all(first, exec_frame({"/bin/sh", "-c", "read line; echo first $line"}));
  int second = connect_one();
  files::write_all(second, exec_frame({"/bin/sh", "-c", "echo second; exit 4"}));
  EXPECT_EQ(read_to_end(second), "second\n|4");
  files::write_all(first,
                   encode_frame(FrameType::kStdin, "go\n") + encode_frame(FrameType::kEof, ""));
  EXPECT_EQ(read_to_end(first), "first go\n|0");
  kill(server, SIGKILL);
  int status = 0;
  waitpid(server, &status, 0);
}

// The status stream, the init's end on one end of a socket pair and the
// host's on the other: what the host reads, after the exchange.
struct StatusRun {
  pid_t pid = -1;
  int status = -1;
  std::string lines;
  std::chrono::steady_clock::duration took{};
};

StatusRun run_status(const Config& config, const std::string& host_sends = "",
                     const Confinement& confinement = {},
                     const std::function<void(pid_t)>& before_sending = {}) {
  int sv[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  StatusRun r;
  auto begin = std::chrono::steady_clock::now();
  r.pid = start_main(config, confinement, sv[1]);
  if (before_sending && r.pid > 0) before_sending(r.pid);
  if (!host_sends.empty()) files::write_all(sv[0], host_sends);
  if (r.pid >= 0) r.status = supervise_main(r.pid, sv[1], /*reap_all=*/false);
  r.took = std::chrono::steady_clock::now() - begin;
  close(sv[1]);
  char buf[4096];
  for (ssize_t n; (n = read(sv[0], buf, sizeof buf)) > 0;)
    r.lines.append(buf, static_cast<size_t>(n));
  close(sv[0]);
  return r;
}

TEST(GuestStatus, ReadyWithThePidThenTheExitStatus) {
  Config config;
  config.argv = {"/bin/sh", "-c", "exit 3"};
  StatusRun r = run_status(config);
  ASSERT_GT(r.pid, 0);
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.lines, "ready " + std::to_string(r.pid) + "\nexit 3\n");
}

TEST(GuestStatus, AMainProcessThatCannotStartIsFailedWithItsCode) {
  Config config;
  config.argv = {"/nonexistent/program"};
  StatusRun r = run_status(config);
  EXPECT_EQ(r.pid, -1);
  EXPECT_EQ(r.lines, "failed 127 start /nonexistent/program: No such file or directory\n");
  EXPECT_EQ(status_failed(126, "two\nlines"), "failed 126 two lines\n");
}

TEST(GuestStatus, StopSendsSigtermToTheGroupAndTheExitFollows) {
  Config config;
  config.argv = {"sleep", "60"};
  StatusRun r = run_status(config, "stop 20000\n");
  ASSERT_GT(r.pid, 0);
  EXPECT_EQ(r.status, 128 + SIGTERM);
  EXPECT_EQ(r.lines, "ready " + std::to_string(r.pid) + "\nexit 143\n");
  EXPECT_LT(r.took, std::chrono::seconds(10)) << "SIGTERM ended it, not the grace's SIGKILL";
}

TEST(GuestStatus, AfterTheGraceItIsKilled) {
  Config config;
  // It ignores SIGTERM (the command starts with every signal at its
  // default, so the script ignores it itself, and keeps it ignored across
  // the exec); the stop is sent once the kernel says it is ignored.
  config.argv = {"sh", "-c", "trap '' TERM; exec sleep 60"};
  StatusRun r = run_status(config, "stop 300\n", {}, [](pid_t pid) {
    const uint64_t term = uint64_t{1} << (SIGTERM - 1);
    for (int i = 0; i < 500; ++i) {
      std::ifstream status("/proc/" + std::to_string(pid) + "/status");
      for (std::string line; std::getline(status, line);)
        if (line.rfind("SigIgn:", 0) == 0 && (std::stoull(line.substr(7), nullptr, 16) & term))
          return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  ASSERT_GT(r.pid, 0);
  EXPECT_EQ(r.status, 128 + SIGKILL);
  EXPECT_EQ(r.lines, "ready " + std::to_string(r.pid) + "\nexit 137\n");
  EXPECT_GE(r.took, std::chrono::milliseconds(300));
  EXPECT_LT(r.took, std::chrono::seconds(20));
}

TEST(GuestStatus, WithoutAMainProcessAStopEndsTheGuest) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  EXPECT_EQ(start_main({}, {}, sv[1]), 0);
  files::write_all(sv[0], "what is this\nstop 0\n");
  EXPECT_EQ(supervise_main(0, sv[1], false), 0);
  close(sv[1]);
  char buf[256];
  ssize_t n = read(sv[0], buf, sizeof buf);
  close(sv[0]);
  EXPECT_EQ(std::string(buf, static_cast<size_t>(std::max<ssize_t>(n, 0))), "ready 0\nexit 0\n");
}

TEST(GuestStatus, WithoutAStreamTheMainProcessStillRunsToItsEnd) {
  Config config;
  config.argv = {"/bin/sh", "-c", "exit 5"};
  pid_t pid = start_main(config, {}, -1);
  ASSERT_GT(pid, 0);
  EXPECT_EQ(supervise_main(pid, -1, false), 5);
}

// --- Landlock: planned in the guest for its kernel, applied before each exec ---

using openshell::testing::TempDir;
using policy::LandlockCompatibility;

// A config whose Landlock policy makes / read-only and read_write writable.
Config landlock_config(std::vector<std::string> read_write,
                       LandlockCompatibility compatibility = LandlockCompatibility::kBestEffort) {
  policy::Policy p;
  p.has_filesystem_policy = true;
  p.filesystem.include_workdir = false;
  p.filesystem.read_only = {"/"};
  p.filesystem.read_write = std::move(read_write);
  p.landlock = compatibility;
  Config config;
  config.landlock_policy = policy::to_toml(p);
  // The test's own ids: as root or not (Landlock needs no privilege).
  config.uid = getuid();
  config.gid = getgid();
  return config;
}

TEST(GuestLandlock, ACommandWritesItsReadWriteDirectoryAndNothingElse) {
  const int abi = landlock::abi_version();
  if (abi < 1) GTEST_SKIP() << "this kernel has no Landlock";
  TempDir rw, other;
  const Config config = landlock_config({rw.path()});
  const std::string script = "echo yes > " + rw / "f" + " && cat " + rw / "f" + "; echo no > " +
                             other / "f" + "; echo $? > " + rw / "status";
  // The guest's kernel (6.1) has ABI 2: a plan for it, and for this kernel.
  for (int plan_abi : {std::min(2, abi), abi}) {
    SCOPED_TRACE("ABI " + std::to_string(plan_abi));
    const Confinement confinement = confinement_for(config, plan_abi);
    ASSERT_TRUE(confinement.landlock.enabled);
    EXPECT_EQ(confinement.landlock.abi, plan_abi);
    Result r = exchange(exec_frame({"/bin/sh", "-c", script}), config, false, confinement);
    EXPECT_EQ(r.end, "exited 0") << r.err;
    EXPECT_EQ(r.out, "yes\n");
    EXPECT_NE(r.err.find("Permission denied"), std::string::npos) << r.err;
    EXPECT_NE(files::read(rw / "status"), "0\n");
    EXPECT_FALSE(files::exists(other / "f"));
    ::unlink((rw / "f").c_str());
  }
  // The same command without the policy writes both.
  Config plain = config;
  plain.landlock_policy.clear();
  const Confinement none = confinement_for(plain, abi);
  EXPECT_FALSE(none.landlock.enabled);
  Result free = exchange(exec_frame({"/bin/sh", "-c", script}), plain, false, none);
  EXPECT_EQ(free.end, "exited 0");
  EXPECT_EQ(free.err, "");
  EXPECT_TRUE(files::exists(other / "f"));
}

TEST(GuestLandlock, AnOrdinaryUsersCommandIsConfinedToo) {
  const int abi = landlock::abi_version();
  if (abi < 1) GTEST_SKIP() << "this kernel has no Landlock";
  if (geteuid() != 0) GTEST_SKIP() << "not root: the tests above ran as this ordinary user";
  TempDir rw, other;
  ::chmod(rw.path().c_str(), 0777);
  ::chmod(other.path().c_str(), 0777);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // nobody, without a capability: Landlock asks for no privilege.
    if (setgroups(0, nullptr) != 0 || setresgid(65534, 65534, 65534) != 0 ||
        setresuid(65534, 65534, 65534) != 0)
      _exit(2);
    const Config config = landlock_config({rw.path()});
    const std::string script = "echo > " + rw / "f" + " && ! echo > " + other / "f";
    Result r = exchange(exec_frame({"/bin/sh", "-c", script}), config, false,
                        confinement_for(config, abi));
    _exit(r.end == "exited 0" && files::exists(rw / "f") && !files::exists(other / "f") ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "2: could not become nobody; 1: not confined as asked";
  EXPECT_TRUE(files::exists(rw / "f"));
  EXPECT_FALSE(files::exists(other / "f"));
}

TEST(GuestLandlock, TheMainProcessIsConfinedAsEveryExecIs) {
  const int abi = landlock::abi_version();
  if (abi < 1) GTEST_SKIP() << "this kernel has no Landlock";
  TempDir rw, other;
  Config config = landlock_config({rw.path()});
  config.argv = {"/bin/sh", "-c",
                 "echo > " + rw / "f" + " && echo > " + other / "f" + " 2>/dev/null; exit $?"};
  StatusRun r = run_status(config, "", confinement_for(config, abi));
  ASSERT_GT(r.pid, 0);
  EXPECT_NE(r.status, 0);
  EXPECT_TRUE(files::exists(rw / "f"));
  EXPECT_FALSE(files::exists(other / "f"));
}

TEST(GuestLandlock, TheDefaultPolicyConfinesAsAContainerSandboxsDoes) {
  const int abi = landlock::abi_version();
  if (abi < 1) GTEST_SKIP() << "this kernel has no Landlock";
  TempDir tmp;
  if (tmp.path().rfind("/tmp/", 0) != 0) GTEST_SKIP() << "TMPDIR is not under /tmp";
  if (!files::exists("/var")) GTEST_SKIP() << "no /var to be refused";
  Config config;
  config.uid = getuid();
  config.gid = getgid();
  config.workdir = "/sandbox";
  config.landlock_policy = policy::to_toml(policy::default_policy());
  config.landlock_warn_missing = false;
  const Confinement confinement = confinement_for(config, abi);
  std::vector<std::string> paths;
  for (const landlock::Rule& rule : confinement.landlock.rules) paths.push_back(rule.path);
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/usr"), paths.end());
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/tmp"), paths.end());
  EXPECT_NE(std::find(paths.begin(), paths.end(), "/sandbox"), paths.end()) << "the workdir";
  // The system's directories read, /tmp written, the rest not even listed.
  const std::string script = "ls /usr >/dev/null && echo > " + tmp / "f" +
                             " && ! ls /var >/dev/null 2>&1 && ! ls / >/dev/null 2>&1 && echo "
                             "confined";
  Result r = exchange(exec_frame({"/bin/sh", "-c", script}), config, false, confinement);
  EXPECT_EQ(r.out, "confined\n") << r.err;
  EXPECT_EQ(r.end, "exited 0");
  Config plain = config;
  plain.landlock_policy.clear();
  Result free = exchange(exec_frame({"/bin/sh", "-c", script}), plain);
  EXPECT_TRUE(free.started) << free.end;
  EXPECT_EQ(free.out, "") << "without Landlock, /var is listed";
}

TEST(GuestLandlock, APathTheRootLacksFailsTheCommandOnlyUnderHardRequirement) {
  const int abi = landlock::abi_version();
  if (abi < 3) GTEST_SKIP() << "hard_requirement needs Landlock ABI 3 (this kernel: " << abi << ")";
  TempDir rw;
  const std::string missing = rw / "not-there";
  const Config best = landlock_config({rw.path(), missing});
  const Confinement best_confinement = confinement_for(best, abi);
  EXPECT_EQ(missing_landlock_paths(best_confinement.landlock), missing);
  EXPECT_EQ(exchange(exec_frame({"true"}), best, false, best_confinement).end, "exited 0");

  Config hard = landlock_config({rw.path(), missing}, LandlockCompatibility::kHardRequirement);
  const Confinement hard_confinement = confinement_for(hard, abi);
  const std::string why = "landlock: policy path " + missing + ": No such file or directory";
  Result r = exchange(exec_frame({"true"}), hard, false, hard_confinement);
  EXPECT_FALSE(r.started);
  EXPECT_EQ(r.end, "failed 125\n" + why);
  hard.argv = {"true"};
  StatusRun main = run_status(hard, "", hard_confinement);
  EXPECT_EQ(main.pid, -1);
  EXPECT_EQ(main.lines, "failed 125 " + why + "\n");
}

TEST(GuestLandlock, TheGuestKernelsAbiDecidesWhatIsHandled) {
  // Planning only: no kernel feature is needed.
  const Config best = landlock_config({"/tmp"});
  const Confinement two = confinement_for(best, 2);
  EXPECT_TRUE(two.landlock.enabled);
  EXPECT_EQ(two.landlock.handled_fs, landlock::fs_rights_for_abi(2));
  EXPECT_NE(two.landlock.handled_fs, landlock::fs_rights_for_abi(7)) << "no truncate at ABI 2";
  EXPECT_FALSE(confinement_for(best, 0).landlock.enabled) << "best effort: none at all";
  const Config hard = landlock_config({"/tmp"}, LandlockCompatibility::kHardRequirement);
  EXPECT_NE(
      openshell::testing::error_of([&] { confinement_for(hard, 2); }).find("hard_requirement"),
      std::string::npos);
  EXPECT_NE(
      openshell::testing::error_of([&] { confinement_for(hard, 0); }).find("hard_requirement"),
      std::string::npos);
  EXPECT_TRUE(confinement_for(hard, 7).landlock.hard);
  EXPECT_FALSE(confinement_for(Config{}, 7).landlock.enabled) << "no policy: no Landlock";
}

}  // namespace
}  // namespace openshell::runtime::guest
