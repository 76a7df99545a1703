// Who may talk to whom over the gateway's socket: another local user cannot
// pose as a user's gateway (a run directory or socket of theirs, a server of
// their uid), a process inside a sandbox (a host-root one above all, which
// runs as its owner's uid) is refused by the gateway and by the supervisors'
// exec sockets, and a client that sends half a request is cut off while
// others are served.
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>

#include <gmock/gmock.h>

#include "harness.h"

using testing::AnyOf;
using testing::EndsWith;
using testing::HasSubstr;
using testing::Not;
using testing::StartsWith;

namespace e2e {
namespace {

// Another test user than the mode's own: the impostor.
Mode other_than(Mode mode) {
  return mode == Mode::kRootlessSubuid ? Mode::kRootlessSingle : Mode::kRootlessSubuid;
}

// A fake gateway: a child process that listens on a Unix socket and records
// every byte it is sent (and answers 200, so that a client fooled by it ends).
// The socket file gets file_owner and mode; the listening process runs as
// listen_as (the peer uid its clients see).
class FakeGateway {
 public:
  FakeGateway(const std::string& path, uid_t file_owner, mode_t mode, uid_t listen_as)
      : path_(path) {
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(report_, O_CLOEXEC) != 0) return;
    pid_ = ::fork();
    if (pid_ == 0) {
      ::close(ready[0]);
      ::close(report_[0]);
      serve(file_owner, mode, listen_as, ready[1]);
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(report_[1]);
    char byte = 0;
    ready_ = ::read(ready[0], &byte, 1) == 1 && byte == 'r';
    ::close(ready[0]);
  }
  ~FakeGateway() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    ::close(report_[0]);
    ::unlink(path_.c_str());
  }
  bool ready() const { return ready_; }
  // "connections bytes" so far.
  std::string received() {
    std::string& text = text_;
    char buf[256];
    for (;;) {
      pollfd p{report_[0], POLLIN, 0};
      if (::poll(&p, 1, 200) <= 0) break;
      ssize_t n = ::read(report_[0], buf, sizeof buf);
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    for (size_t at; (at = text.find('\n')) != std::string::npos; text.erase(0, at + 1)) {
      ++connections_;
      bytes_ += std::atol(text.substr(0, at).c_str());
    }
    return std::to_string(connections_) + " connections, " + std::to_string(bytes_) + " bytes";
  }

 private:
  void serve(uid_t file_owner, mode_t mode, uid_t listen_as, int ready) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, path_.c_str(), sizeof address.sun_path - 1);
    ::unlink(path_.c_str());
    if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) return;
    if (::chmod(path_.c_str(), mode) != 0 || ::lchown(path_.c_str(), file_owner, -1) != 0) return;
    // The credentials a client sees are those of listen().
    if (listen_as != 0 &&
        (::setgroups(0, nullptr) != 0 || ::setresgid(listen_as, listen_as, listen_as) != 0 ||
         ::setresuid(listen_as, listen_as, listen_as) != 0))
      return;
    if (::listen(fd, 16) != 0) return;
    ssize_t ignored = ::write(ready, "r", 1);
    for (;;) {
      int conn = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      long got = 0;
      char buf[65536];
      for (;;) {
        pollfd p{conn, POLLIN, 0};
        if (::poll(&p, 1, 500) <= 0) break;
        ssize_t n = ::read(conn, buf, sizeof buf);
        if (n <= 0) break;
        got += n;
        static const char kAnswer[] =
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n"
            "Connection: close\r\n\r\n{\"sandboxes\":[]}";
        ignored = ::send(conn, kAnswer, sizeof kAnswer - 1, MSG_NOSIGNAL);
      }
      ::close(conn);
      std::string line = std::to_string(got) + "\n";
      ignored = ::write(report_[1], line.data(), line.size());
    }
    (void)ignored;
  }

  std::string path_;
  pid_t pid_ = -1;
  int report_[2] = {-1, -1};
  bool ready_ = false;
  long connections_ = 0, bytes_ = 0;
  std::string text_;
};

class GatewayTrust : public GatewayTest {
 protected:
  GatewayTrust() : GatewayTest("trust", /*check_sandbox_files=*/false) {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    run_ = home_ + "/run";
  }
  void make_run_dir(uid_t owner, mode_t perms) {
    ASSERT_EQ(::mkdir(run_.c_str(), perms), 0);
    ASSERT_EQ(::chmod(run_.c_str(), perms), 0);
    ASSERT_EQ(::chown(run_.c_str(), owner, -1), 0);
  }
  std::string me() const { return std::to_string(uid_of(mode())); }

  std::string run_;
};
E2E_ALL_MODES(GatewayTrust);

// The attack of a shared /tmp: another user made the run directory first
// (open to all, so that the victim can reach the socket in it) and listens
// there. The command line refuses before it connects; the secret of `-e`
// never reaches the impostor.
TEST_P(GatewayTrust, RunDirectoryOfAnotherUserIsRefused) {
  uid_t impostor = uid_of(other_than(mode()));
  make_run_dir(impostor, 0777);
  FakeGateway fake(run_ + "/gateway.sock", impostor, 0777, impostor);
  ASSERT_TRUE(fake.ready());
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"sandbox", "list"},
           {"sandbox", "create", "--name", "x", "--from", "host", "-e", "SECRET=hunter2"}}) {
    Result r = os(args);
    EXPECT_EQ(r.status, 125);
    EXPECT_EQ(r.err, "openshell: " + run_ + " belongs to uid " + std::to_string(impostor) +
                         ", not you (uid " + me() + "); remove it (as root: rm -rf " + run_ +
                         ")\n");
  }
  EXPECT_EQ(fake.received(), "0 connections, 0 bytes");
  ::rmdir(run_.c_str());
}

// The same where it matters most: without XDG_RUNTIME_DIR and with a state
// directory too deep for the sockets' addresses, the run directory is
// /tmp/openshell-UID, which anyone can make first. The line says what to
// remove and that XDG_RUNTIME_DIR avoids it.
TEST_P(GatewayTrust, SharedTmpRunDirectoryOfAnotherUserIsRefused) {
  if (mode() == Mode::kRoot) GTEST_SKIP() << "root's run directory is /run/openshell";
  const std::string tmp_run = "/tmp/openshell-" + me();
  struct stat st;
  if (::lstat(tmp_run.c_str(), &st) == 0) GTEST_SKIP() << tmp_run << " exists (not ours to touch)";
  uid_t impostor = uid_of(other_than(mode()));
  ASSERT_EQ(::mkdir(tmp_run.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(tmp_run.c_str(), 0777), 0);
  ASSERT_EQ(::chown(tmp_run.c_str(), impostor, -1), 0);
  {
    FakeGateway fake(tmp_run + "/gateway.sock", impostor, 0777, impostor);
    ASSERT_TRUE(fake.ready());
    Options o;
    o.env = {"XDG_STATE_HOME=" + home_ + "/" + std::string(70, 'd')};
    Result r = openshell(mode(), {"sandbox", "list"}, o);
    EXPECT_EQ(r.status, 125);
    EXPECT_EQ(r.err, "openshell: " + tmp_run + " belongs to uid " + std::to_string(impostor) +
                         ", not you (uid " + me() + "); remove it (as root: rm -rf " + tmp_run +
                         ") or set XDG_RUNTIME_DIR\n");
    EXPECT_EQ(fake.received(), "0 connections, 0 bytes");
  }
  ::rmdir(tmp_run.c_str());
}

// Our own directory, but a socket that is not the gateway's 0600 one.
TEST_P(GatewayTrust, SocketWithTheWrongModeIsRefused) {
  make_run_dir(uid_of(mode()), 0700);
  FakeGateway fake(run_ + "/gateway.sock", uid_of(mode()), 0666, uid_of(mode()));
  ASSERT_TRUE(fake.ready());
  Result r = os({"sandbox", "list"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, StartsWith("openshell: " + run_ + "/gateway.sock has mode 0666, not 0600"));
  EXPECT_EQ(fake.received(), "0 connections, 0 bytes");
}

// Everything on disk looks right (only root could set this up), but the
// server is another uid: refused once connected, before a byte is sent.
TEST_P(GatewayTrust, ServerOfAnotherUidIsRefusedAfterConnecting) {
  uid_t impostor = uid_of(other_than(mode()));
  make_run_dir(uid_of(mode()), 0700);
  FakeGateway fake(run_ + "/gateway.sock", uid_of(mode()), 0600, impostor);
  ASSERT_TRUE(fake.ready());
  Result r = os({"sandbox", "create", "--name", "x", "--from", "host", "-e", "SECRET=hunter2"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("the server at " + run_ + "/gateway.sock runs as uid " +
                               std::to_string(impostor) + ", not as you (uid " + me() +
                               ") or root: refusing to talk to it"));
  EXPECT_THAT(fake.received(), HasSubstr(", 0 bytes"));
}

// A sandbox whose root is the host runs as its owner's uid (rootless), so
// the gateway's socket admits it; with the run directory bound in, it tries
// the API (list, create, policy set, delete, exec through the supervisor's
// socket). Each is refused with the 403 line, and nothing changes.
TEST_P(GatewayTrust, HostRootSandboxCannotUseTheGatewayOrTheSupervisors) {
  Result created = os({"sandbox", "create", "--name", "victim", "--from", rootfs()});
  ASSERT_EQ(created.status, 0) << created.err;
  Result before = os({"policy", "list", "victim"});
  ASSERT_EQ(before.status, 0) << before.err;
  std::string probe = rootfs() + "/usr/bin/osh-probe";
  std::string supervisor_socket;
  {
    std::string names = file_contents_of_dir(run_ + "/s");
    ASSERT_NE(names, "");
    supervisor_socket = run_ + "/s/" + names.substr(0, names.find(' '));
  }
  // The sandbox's /tmp is its own: the test's files (under /tmp) are bound
  // in where they are, the run directory with them.
  auto inside = [&](std::vector<std::string> command) {
    std::vector<std::string> args = {"run",
                                     "--rootfs",
                                     "host",
                                     "--bind",
                                     scratch() + ":" + scratch(),
                                     "-e",
                                     "OPENSHELL_HOME=" + home_,
                                     "--"};
    args.insert(args.end(), command.begin(), command.end());
    return openshell(mode(), args);
  };
  // The supervisor's exec socket does not take a connection from inside
  // (tried first: a successful delete below would take the supervisor away).
  Result exec = inside({probe, "exec-handoff", supervisor_socket});
  // Root's sandbox runs as an unmapped uid, which the socket's mode refuses;
  // rootless, the supervisor closes the connection without the upgrade,
  // which the probe sees as an empty answer or, when the close comes before
  // its request is written, a broken pipe or a reset.
  if (is_rootless(mode())) {
    EXPECT_THAT(exec.out, AnyOf("denied: no upgrade (0 bytes)\n", "denied: EPIPE (Broken pipe)\n",
                                "denied: ECONNRESET (Connection reset by peer)\n"))
        << exec.err;
  } else {
    EXPECT_EQ(exec.out, "denied: EACCES (Permission denied)\n") << exec.err;
  }
  EXPECT_EQ(exec.status, 1) << exec.err;
  const std::string sock = run_ + "/gateway.sock";
  std::vector<std::vector<std::string>> attempts = {
      {probe, "http-unix", sock, "GET", "/v1/sandboxes"},
      {probe, "http-unix", sock, "POST", "/v1/sandboxes",
       "{\"name\":\"planted\",\"spec\":{\"from\":\"host\",\"command\":[\"sleep\",\"1000\"]}}"},
      {probe, "http-unix", sock, "PUT", "/v1/sandboxes/victim/policy",
       "{\"policy\":\"version = 1\\n[network_policies.out]\\nendpoints = [ { host = "
       "\\\"example.test\\\", port = 443 } ]\\nbinaries = [ { path = \\\"/usr/bin/osh-probe\\\" } "
       "]\\n\"}"},
      {probe, "http-unix", sock, "DELETE", "/v1/sandboxes/victim"},
  };
  for (const auto& attempt : attempts) {
    SCOPED_TRACE(attempt[3] + " " + attempt[4]);
    Result r = inside(attempt);
    if (is_rootless(mode())) {
      // Admitted by the socket's mode: the gateway itself refuses.
      EXPECT_THAT(
          r.out, StartsWith("ok: HTTP/1.1 403 Forbidden {\"error\":{\"code\":\"peer_in_sandbox\""));
      EXPECT_THAT(r.out, HasSubstr("is inside a sandbox (another pid namespace)"));
    } else {
      // Root's sandbox runs as an unmapped uid: the socket's mode already refuses.
      EXPECT_EQ(r.out, "denied: EACCES (Permission denied)\n");
      EXPECT_EQ(r.status, 1);
    }
    EXPECT_THAT(r.out, Not(HasSubstr("HTTP/1.1 2"))) << r.err;
  }
  // The command line inside fails as well.
  Result cli = inside({binary(), "sandbox", "delete", "victim"});
  EXPECT_EQ(cli.status, 125) << cli.err;
  if (is_rootless(mode())) {
    EXPECT_THAT(cli.err, StartsWith("openshell: the gateway serves no process inside a sandbox: "
                                    "the peer (pid "));
    EXPECT_THAT(cli.err, EndsWith(") is inside a sandbox (another pid namespace)\n"));
  } else {
    EXPECT_EQ(cli.err, "openshell: stat " + run_ + ": Permission denied\n");
  }

  // Nothing changed: the victim is there and Ready, alone, its policy as it was.
  Result list = os({"sandbox", "list"});
  EXPECT_THAT(list.out, HasSubstr("victim"));
  EXPECT_THAT(list.out, Not(HasSubstr("planted")));
  EXPECT_THAT(os({"sandbox", "get", "victim"}).out, HasSubstr("Ready"));
  EXPECT_EQ(os({"policy", "list", "victim"}).out, before.out);
  // The gateway's log says who was refused.
  EXPECT_THAT(file_contents(home_ + "/gateway.log"),
              HasSubstr(is_rootless(mode()) ? "API: refused a connection from uid" : ""));
  // An exec from the host still works.
  Result host_exec = os({"sandbox", "exec", "victim", "--", "echo", "served"});
  EXPECT_EQ(host_exec.out, "served\n") << host_exec.err;
}

// Half a request head is cut off at the (shortened) deadline while another
// client is served; a connection over the per-uid cap is refused with a 503
// line, and once the others close the gateway serves again.
TEST_P(GatewayTrust, SlowClientsAreCutOffAndTheConnectionCapHolds) {
  Options limits;
  limits.env = {"OPENSHELL_API_HEADER_TIMEOUT_MS=1500", "OPENSHELL_API_MAX_CONNECTIONS_PER_UID=4"};
  Result started = os({"sandbox", "list"}, limits);  // starts the gateway with these limits
  ASSERT_EQ(started.status, 0) << started.err;
  const std::string sock = run_ + "/gateway.sock";
  // This process (root) is a client like any other.
  auto connect_raw = [&] {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, sock.c_str(), sizeof address.sun_path - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      ::close(fd);
      return -1;
    }
    return fd;
  };
  auto read_all = [](int fd) {
    std::string answer;
    char buf[4096];
    for (;;) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 30000) <= 0) break;  // far past the gateway's deadlines
      ssize_t n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      answer.append(buf, static_cast<size_t>(n));
    }
    return answer;
  };
  const std::string request =
      "GET /v1/sandboxes HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n";

  int slow = connect_raw();
  ASSERT_GE(slow, 0);
  const std::string half = request.substr(0, 30);
  ASSERT_EQ(::send(slow, half.data(), half.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(half.size()));
  auto start = std::chrono::steady_clock::now();
  Result served = os({"sandbox", "list"});
  EXPECT_EQ(served.status, 0) << served.err;
  std::string cut = read_all(slow);
  long ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() -
                                                                  start)
                .count();
  ::close(slow);
  EXPECT_THAT(cut, StartsWith("HTTP/1.1 408"));
  EXPECT_THAT(cut, HasSubstr("no complete request head within 1500 ms"));
  EXPECT_GE(ms, 1000) << "cut off before its deadline";

  // cap connections that say nothing yet, then one more.
  std::vector<int> held;
  for (int i = 0; i < 4; ++i) held.push_back(connect_raw());
  for (int fd : held) ASSERT_GE(fd, 0);
  // The gateway accepts in the order of connecting: by the time it takes
  // the extra one, it holds the four.
  int extra = connect_raw();
  ASSERT_GE(extra, 0);
  // The refusal may come (and the connection close) before the request goes.
  ssize_t ignored = ::send(extra, request.data(), request.size(), MSG_NOSIGNAL);
  (void)ignored;
  std::string refused = read_all(extra);
  ::close(extra);
  EXPECT_THAT(refused, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(refused, HasSubstr("\"too_many_connections\""));
  EXPECT_THAT(refused, HasSubstr("already has 4 connections open (the limit is 4)"));
  for (int fd : held) ::close(fd);
  // Served again once the gateway has read the closes (it may take the next
  // connection first): asked until it answers 200, 30 s at most.
  std::string answer;
  for (int i = 0; i < 300 && answer.rfind("HTTP/1.1 200", 0) != 0; ++i) {
    if (i > 0) ::usleep(100000);
    int again = connect_raw();
    ASSERT_GE(again, 0);
    ssize_t sent = ::send(again, request.data(), request.size(), MSG_NOSIGNAL);
    (void)sent;
    answer = read_all(again);
    ::close(again);
    if (answer.rfind("HTTP/1.1 200", 0) != 0) {
      EXPECT_THAT(answer, HasSubstr("\"too_many_connections\"")) << "refused for another reason";
    }
  }
  EXPECT_THAT(answer, StartsWith("HTTP/1.1 200"));
  std::string log = file_contents(home_ + "/gateway.log");
  EXPECT_THAT(log, HasSubstr("API: closing a connection from uid 0"));
  EXPECT_THAT(log, HasSubstr("API: refused a connection from uid 0"));
}

}  // namespace
}  // namespace e2e
