// Who is at the other end of the API's sockets: a process inside a sandbox
// (another pid namespace) is told apart from a host process; a client
// refuses a server of another uid; a run directory or socket that is not the
// caller's own is refused with what to remove.
#include "auth/peer.h"

#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/paths.h"
#include "base/unique_fd.h"
#include "net/http.h"
#include "test_util.h"

namespace openshell {
namespace {

using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::StartsWith;

UniqueFd listen_at(const std::string& path) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd.get(), 8) != 0)
    throw std::runtime_error("listen " + path + ": " + std::strerror(errno));
  return fd;
}

int connect_to(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof address.sun_path - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(PeerInSandbox, NspidDepthCountsTheNamespaces) {
  EXPECT_EQ(auth::nspid_depth("Name:\tsh\nNSpid:\t4242\n"), 1);
  EXPECT_EQ(auth::nspid_depth("Name:\tsh\nNSpid:\t4242\t7\t1\nNSpgid:\t1\n"), 3);
  EXPECT_EQ(auth::nspid_depth("Name:\tsh\nPid:\t4242\n"), 0);
  EXPECT_EQ(auth::nspid_depth("NSpid:\t-1\n"), 0);
}

TEST(PeerInSandbox, AHostProcessIsAdmitted) {
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, fds), 0);
  EXPECT_EQ(auth::peer_in_sandbox(fds[0]), "");
  ::close(fds[0]);
  ::close(fds[1]);
}

// A process in a child pid namespace, as every process of a sandbox is,
// connects while it lives: refused.
TEST(PeerInSandbox, AProcessOfAChildPidNamespaceIsRefused) {
  TempDir dir;
  std::string path = dir / "api.sock";
  UniqueFd listener = listen_at(path);
  int hold[2];
  ASSERT_EQ(::pipe2(hold, O_CLOEXEC), 0);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(hold[1]);
    if (::unshare(CLONE_NEWUSER | CLONE_NEWPID) != 0) ::_exit(10);
    pid_t inner = ::fork();  // pid 1 of the new namespace
    if (inner < 0) ::_exit(11);
    if (inner == 0) {
      int fd = connect_to(path);
      if (fd < 0) ::_exit(12);
      char byte;
      ssize_t ignored = ::read(hold[0], &byte, 1);  // until the test has looked
      (void)ignored;
      ::_exit(0);
    }
    int status = 0;
    ::waitpid(inner, &status, 0);
    ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 13);
  }
  ::close(hold[0]);
  UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(conn);
  std::string why = auth::peer_in_sandbox(conn.get());
  ::close(hold[1]);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "child status " << status;
  EXPECT_THAT(why, HasSubstr("inside a sandbox"));
}

// The pid SO_PEERCRED names is gone (and could be reused): fail closed.
TEST(PeerInSandbox, APeerThatHasExitedIsRefused) {
  TempDir dir;
  std::string path = dir / "api.sock";
  UniqueFd listener = listen_at(path);
  pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(connect_to(path) < 0 ? 1 : 0);
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(conn);
  EXPECT_THAT(auth::peer_in_sandbox(conn.get()), HasSubstr("pid " + std::to_string(child)));
}

// --- the client's checks ---------------------------------------------------------

TEST(PrivateRunDir, MissingIsFineAndPrivateIsFine) {
  TempDir dir;
  EXPECT_EQ(private_dir_problem(dir / "absent"), "");
  EXPECT_EQ(private_socket_problem(dir / "absent.sock"), "");
  ::chmod(dir.path().c_str(), 0700);
  EXPECT_EQ(private_dir_problem(dir.path()), "");
}

TEST(PrivateRunDir, LooseModeSymlinkAndFileAreProblems) {
  TempDir dir;
  ::chmod(dir.path().c_str(), 0755);
  EXPECT_EQ(
      private_dir_problem(dir.path()),
      dir.path() + " has mode 0755, not 0700; make it private (chmod 700 " + dir.path() + ")");
  ASSERT_EQ(::symlink(dir.path().c_str(), (dir / "link").c_str()), 0);
  EXPECT_THAT(private_dir_problem(dir / "link"), HasSubstr("is not a directory (a symbolic link)"));
  openshell::testing::write_file(dir / "file", "x");
  EXPECT_THAT(private_socket_problem(dir / "file"), HasSubstr("is not a socket (a file)"));
  ASSERT_EQ(::symlink((dir / "file").c_str(), (dir / "sock-link").c_str()), 0);
  EXPECT_THAT(private_socket_problem(dir / "sock-link"),
              HasSubstr("is not a socket (a symbolic link)"));
  UniqueFd listener = listen_at(dir / "loose.sock");
  ::chmod((dir / "loose.sock").c_str(), 0666);
  EXPECT_THAT(private_socket_problem(dir / "loose.sock"),
              StartsWith(dir / "loose.sock" + " has mode 0666, not 0600"));
  ::chmod((dir / "loose.sock").c_str(), 0600);
  EXPECT_EQ(private_socket_problem(dir / "loose.sock"), "");
}

TEST(PrivateRunDir, AnotherUsersDirectoryAndSocketSayWhatToRemove) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (to give a directory away)";
  TempDir dir;
  std::string run = dir / "openshell-1000";
  ASSERT_EQ(::mkdir(run.c_str(), 0700), 0);
  ASSERT_EQ(::chown(run.c_str(), 1234, 1234), 0);
  EXPECT_EQ(private_dir_problem(run),
            run + " belongs to uid 1234, not you (uid 0); remove it (as root: rm -rf " + run + ")");
  UniqueFd listener = listen_at(dir / "gateway.sock");
  ASSERT_EQ(::chmod((dir / "gateway.sock").c_str(), 0600), 0);
  ASSERT_EQ(::chown((dir / "gateway.sock").c_str(), 1234, 1234), 0);
  EXPECT_THAT(private_socket_problem(dir / "gateway.sock"),
              HasSubstr("belongs to uid 1234, not you"));
  ASSERT_EQ(::chown(run.c_str(), 0, 0), 0);
}

TEST(PrivateRunDir, UnderTmpTheLineAlsoNamesXdgRuntimeDir) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (to give a directory away)";
  // Root's own never serves as a run directory (root's is /run/openshell).
  std::string run = "/tmp/openshell-0";
  if (::mkdir(run.c_str(), 0777) != 0) GTEST_SKIP() << run << " exists";
  ASSERT_EQ(::chown(run.c_str(), 1234, 1234), 0);
  std::string problem = private_dir_problem(run);
  ::rmdir(run.c_str());
  EXPECT_EQ(problem, run + " belongs to uid 1234, not you (uid 0); remove it (as root: rm -rf " +
                         run + ") or set XDG_RUNTIME_DIR");
}

// Paths::resolve for an ordinary user (a child that drops to nobody when the
// test runs as root).
std::string rootless_run_dir(const char* xdg_runtime, const char* xdg_state) {
  auto report = openshell::testing::run_in_child([&](openshell::testing::ChildWriter& out) {
    if (::geteuid() == 0 &&
        (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0))
      ::_exit(3);
    ::unsetenv("OPENSHELL_HOME");
    ::setenv("HOME", "/home/someone", 1);
    if (xdg_runtime)
      ::setenv("XDG_RUNTIME_DIR", xdg_runtime, 1);
    else
      ::unsetenv("XDG_RUNTIME_DIR");
    if (xdg_state)
      ::setenv("XDG_STATE_HOME", xdg_state, 1);
    else
      ::unsetenv("XDG_STATE_HOME");
    out.say(Paths::resolve().run_dir);
  });
  std::string text = report.text;
  if (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

TEST(PrivateRunDir, WithoutXdgRuntimeDirTheRunDirIsUnderTheStateDir) {
  std::string uid = std::to_string(::geteuid() == 0 ? 65534 : ::geteuid());
  EXPECT_EQ(rootless_run_dir(nullptr, nullptr), "/home/someone/.local/state/openshell/run");
  EXPECT_EQ(rootless_run_dir("/run/user/7", nullptr), "/run/user/7/openshell");
  // Too long for the sockets' addresses: /tmp, which check_private() guards.
  std::string deep = "/home/someone/" + std::string(60, 'd');
  EXPECT_EQ(rootless_run_dir(nullptr, deep.c_str()), "/tmp/openshell-" + uid);
  // The longest supervisor socket still fits a socket address.
  std::string longest = std::string(kMaxRunDirLength, 'r') + "/s/" + std::string(12, 'f') + "." +
                        std::to_string(INT64_MAX) + ".sock";
  EXPECT_LT(longest.size(), sizeof(sockaddr_un{}.sun_path));
}

// A server of another uid, on a socket the client would otherwise use: a
// child that listens as nobody and reports how many bytes it was sent.
class ImpostorServer {
 public:
  explicit ImpostorServer(const std::string& path) {
    int ready[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(got_, O_CLOEXEC) != 0) return;
    child_ = ::fork();
    if (child_ == 0) {
      if (::setresgid(65534, 65534, 65534) != 0 || ::setresuid(65534, 65534, 65534) != 0)
        ::_exit(3);
      UniqueFd listener = listen_at(path);
      ssize_t ignored = ::write(ready[1], "r", 1);
      UniqueFd conn(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
      char buf[4096];
      // Whatever the client sent before it gave up.
      ssize_t n = conn ? ::read(conn.get(), buf, sizeof buf) : -1;
      std::string said = std::to_string(n < 0 ? 0 : n);
      ignored = ::write(got_[1], said.data(), said.size());
      (void)ignored;
      ::_exit(0);
    }
    ::close(ready[1]);
    ::close(got_[1]);
    char byte = 0;
    ready_ = ::read(ready[0], &byte, 1) == 1;
    ::close(ready[0]);
  }
  ~ImpostorServer() {
    if (child_ > 0) {
      ::kill(child_, SIGKILL);
      ::waitpid(child_, nullptr, 0);
    }
    ::close(got_[0]);
  }
  bool ready() const { return ready_; }
  // Bytes the impostor read (waits for it to finish).
  std::string bytes_received() {
    char buf[32] = {};
    ssize_t n = ::read(got_[0], buf, sizeof buf - 1);
    return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
  }

 private:
  pid_t child_ = -1;
  int got_[2] = {-1, -1};
  bool ready_ = false;
};

TEST(UntrustedServer, ClientRefusesAServerOfAnotherUidBeforeSendingAnything) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (to listen as another uid)";
  TempDir dir;
  ::chmod(dir.path().c_str(), 0777);
  std::string path = dir / "gateway.sock";
  ImpostorServer impostor(path);
  ASSERT_TRUE(impostor.ready());
  std::string error;
  try {
    net::Client client(path);
    client.request("POST", "/v1/sandboxes", "{\"secret\":1}");
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_THAT(error,
              HasSubstr("runs as uid 65534, not as you (uid 0) or root: refusing to talk to it"));
  EXPECT_EQ(impostor.bytes_received(), "0") << "the client sent bytes to the impostor";
}

// The streams' client (exec, logs, the supervisor's session) checks too.
TEST(UntrustedServer, WebSocketClientRefusesAServerOfAnotherUid) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root (to listen as another uid)";
  TempDir dir;
  ::chmod(dir.path().c_str(), 0777);
  std::string path = dir / "gateway.sock";
  ImpostorServer impostor(path);
  ASSERT_TRUE(impostor.ready());
  boost::asio::io_context io;
  std::string error = "<none>";
  net::WebSocket::connect(io, path, "/v1/sandboxes/x/exec",
                          [&](std::shared_ptr<net::WebSocket> ws, std::string why) {
                            error = ws ? "<connected>" : why;
                          });
  io.run_for(std::chrono::seconds(5));
  EXPECT_THAT(error, HasSubstr("runs as uid 65534, not as you (uid 0) or root"));
  EXPECT_EQ(impostor.bytes_received(), "0") << "the client sent the upgrade to the impostor";
}

}  // namespace
}  // namespace openshell
