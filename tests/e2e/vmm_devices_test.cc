// `openshell __vmm`'s devices, from the real binary and the tests' small
// guests: --disk and --disk-ro (virtio-blk over files, in the order given,
// the read-only one refusing writes), and --channel-fd with --host-port (a
// virtio-vsock device whose connections travel the supervisor's
// SOCK_SEQPACKET channel as fds, docs/vm.md "The VMM process"): a guest's
// connection to a host port arrives as `accepted` + an fd carrying its
// bytes both ways, a `connect` reaches a guest port as `connected` + fd, a
// bad message is dropped with a line on stderr, and the channel's peer
// closing stops the VM (143), as the VMM's parent dying kills it.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"
#include "vm_helpers.h"

using testing::HasSubstr;

namespace e2e {
namespace {

constexpr int kTimeoutMs = 20000;

// Reads `fd` until what came holds `want`, it ends or kTimeoutMs pass.
std::string read_until(int fd, const std::string& want) {
  std::string got;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
  while (got.find(want) == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) != 1) break;
    char buffer[256];
    const ssize_t n = ::read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    got.append(buffer, static_cast<size_t>(n));
  }
  return got;
}

// One datagram from the channel, and the fd that came with it (-1: none).
// False when none came within kTimeoutMs or the peer closed.
bool receive(int channel, std::string& text, int& fd) {
  fd = -1;
  pollfd p{channel, POLLIN, 0};
  if (::poll(&p, 1, kTimeoutMs) != 1) return false;
  char buffer[512];
  iovec iov{buffer, sizeof buffer};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = ::recvmsg(channel, &msg, MSG_CMSG_CLOEXEC);
  if (n <= 0) return false;
  text.assign(buffer, static_cast<size_t>(n));
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int got = -1;
      std::memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fd < 0)
        fd = got;
      else
        ::close(got);  // more than one: a broken VMM; the test sees only the first
    }
  }
  return true;
}

bool send_text(int channel, const std::string& text) {
  return ::send(channel, text.data(), text.size(), MSG_NOSIGNAL) ==
         static_cast<ssize_t>(text.size());
}

// A running `openshell __vmm` with its stdout and stderr on pipes and, when
// asked, the VMM's end of a SOCK_SEQPACKET channel as its fd 3. Killed and
// reaped by the destructor if the test has not waited for it.
struct VmmProcess {
  pid_t pid = -1;
  int out = -1;
  int err = -1;
  int channel = -1;  // the supervisor's end

  VmmProcess() = default;
  VmmProcess(const VmmProcess&) = delete;
  VmmProcess& operator=(const VmmProcess&) = delete;
  ~VmmProcess() {
    if (pid > 0) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, nullptr, 0);
    }
    for (int fd : {out, err, channel})
      if (fd >= 0) ::close(fd);
  }
  // Its exit status (128+N for signal N), or -1 when it has not ended
  // within kTimeoutMs (it is then killed).
  int wait() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
    int status = 0;
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  std::string rest_of(int fd) { return read_until(fd, std::string(1, '\0')); }
};

void start(VmmProcess& vmm, const std::vector<std::string>& args, bool with_channel) {
  int out[2], err[2], pair[2] = {-1, -1};
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(err, O_CLOEXEC), 0);
  if (with_channel) {
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, pair), 0);
  }
  std::vector<std::string> argv{"openshell", "__vmm"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (with_channel) argv.insert(argv.end(), {"--channel-fd", "3"});
  std::vector<char*> raw;
  for (std::string& a : argv) raw.push_back(a.data());
  raw.push_back(nullptr);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(err[1], 2);
    if (with_channel) ::dup2(pair[1], 3);  // dup2 leaves it open across exec
    ::execv(binary().c_str(), raw.data());
    ::_exit(127);
  }
  ::close(out[1]);
  ::close(err[1]);
  if (with_channel) ::close(pair[1]);
  vmm.pid = pid;
  vmm.out = out[0];
  vmm.err = err[0];
  vmm.channel = pair[0];
}

class VmmDevices : public ModeTest {
 protected:
  // Why the guests cannot run in this mode, or "".
  std::string no_kvm() const {
    if (is_rootless(mode())) return "/dev/kvm is root-only here (see Vmm's tests)";
    if (::access("/dev/kvm", R_OK | W_OK) != 0) return "/dev/kvm cannot be opened here";
    return "";
  }
  void TearDown() override {
    for (const std::string& path : made_) ::unlink(path.c_str());
    ModeTest::TearDown();
  }
  std::string guest(const std::string& name) {
    const std::string to = vm_helpers::readable_guest("vmm-devices-", name + ".bin");
    made_.push_back(to);
    return to;
  }
  // A disk of 8 zero sectors.
  std::string disk(const std::string& name) {
    const std::string path = scratch() + "/vmm-devices-" + name + ".img";
    write_file(path, std::string(8 * 512, '\0'), 0600);
    made_.push_back(path);
    return path;
  }
  std::vector<std::string> made_;
};

#define REQUIRE_KVM() \
  if (const std::string why = no_kvm(); !why.empty()) GTEST_SKIP() << why

// virtio_blk.S writes sector 1 with 'V's and reads it back through window 0.
TEST_P(VmmDevices, TheGuestWritesADiskAndAReadOnlyOneRefusesItsWrites) {
  REQUIRE_KVM();
  const std::string written = disk("written");
  const std::string read_only = disk("read-only");
  Result r = openshell(mode(), {"__vmm", "--flat", guest("virtio_blk"), "--memory", "16", "--disk",
                                written, "--disk-ro", read_only});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "OK\n");
  EXPECT_EQ(file_contents(written),
            std::string(512, '\0') + std::string(512, 'V') + std::string(6 * 512, '\0'));

  // The order of the options is the order of the disks: the read-only one
  // is in window 0 now, and the guest's write fails ("E" "w").
  r = openshell(mode(), {"__vmm", "--flat", guest("virtio_blk"), "--memory", "16", "--disk-ro",
                         read_only, "--disk", written});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "Ew\n");
  EXPECT_EQ(file_contents(read_only), std::string(8 * 512, '\0'));
}

// Said before /dev/kvm is opened: in every mode.
TEST_P(VmmDevices, AMissingDiskOrABadChannelIsOneLineAndStatus125) {
  const std::string missing = scratch() + "/vmm-devices-no-such.img";
  Result r =
      openshell(mode(), {"__vmm", "--flat", guest("spin"), "--memory", "16", "--disk", missing});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: disk " + missing + ": No such file or directory\n");
  r = openshell(mode(),
                {"__vmm", "--flat", guest("spin"), "--memory", "16", "--host-port", "1024"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: a host port without a channel to the supervisor\n");
  Options piped;  // fd 0 a pipe: no socket
  piped.stdin_data = "x";
  r = openshell(mode(), {"__vmm", "--flat", guest("spin"), "--memory", "16", "--channel-fd", "0"},
                piped);
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("openshell: channel fd 0: "));
}

// virtio_vsock.S connects from its port 5000 to the host's 1024, sends
// "ping", prints the answer, and shuts the connection down.
TEST_P(VmmDevices, AGuestConnectionToAHostPortArrivesOnTheChannelAsAnFd) {
  REQUIRE_KVM();
  VmmProcess vmm;
  ASSERT_NO_FATAL_FAILURE(
      start(vmm, {"--flat", guest("virtio_vsock"), "--memory", "16", "--host-port", "1024"}, true));
  std::string text;
  int fd = -1;
  ASSERT_TRUE(receive(vmm.channel, text, fd)) << vmm.rest_of(vmm.err);
  EXPECT_EQ(text, "accepted 1024 5000");
  ASSERT_GE(fd, 0);
  EXPECT_EQ(read_until(fd, "ping"), "ping");
  ASSERT_EQ(::write(fd, "pong", 4), 4);
  char byte = 0;
  pollfd p{fd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, kTimeoutMs), 1);
  EXPECT_EQ(::read(fd, &byte, 1), 0);  // the guest's shutdown
  ::close(fd);
  EXPECT_EQ(vmm.wait(), 0);
  EXPECT_EQ(vmm.rest_of(vmm.out), "pong\nOK\n");
  EXPECT_EQ(vmm.rest_of(vmm.err), "");
}

// virtio_vsock_listen.S says "ready", accepts on its port 6000 and echoes.
TEST_P(VmmDevices, AConnectOnTheChannelReachesAGuestPort) {
  REQUIRE_KVM();
  VmmProcess vmm;
  ASSERT_NO_FATAL_FAILURE(
      start(vmm, {"--flat", guest("virtio_vsock_listen"), "--memory", "16"}, true));
  ASSERT_EQ(read_until(vmm.out, "ready\n"), "ready\n");
  ASSERT_TRUE(send_text(vmm.channel, "connect 7 6000"));
  std::string text;
  int fd = -1;
  ASSERT_TRUE(receive(vmm.channel, text, fd)) << vmm.rest_of(vmm.err);
  EXPECT_EQ(text, "connected 7");
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::write(fd, "hello guest", 11), 11);
  EXPECT_EQ(read_until(fd, "hello guest"), "hello guest");
  ::close(fd);  // the guest sees the shutdown, answers RST and resets
  EXPECT_EQ(vmm.wait(), 0);
  EXPECT_EQ(vmm.rest_of(vmm.out), "hello guest\nOK\n");
}

// The spin guest never brings its vsock device up.
TEST_P(VmmDevices, BadMessagesAreDroppedAndThePeerClosingStopsTheVm) {
  REQUIRE_KVM();
  VmmProcess vmm;
  ASSERT_NO_FATAL_FAILURE(start(vmm, {"--flat", guest("spin"), "--memory", "16"}, true));
  ASSERT_EQ(read_until(vmm.out, "s"), "s");
  ASSERT_TRUE(send_text(vmm.channel, "hello 1 2"));
  ASSERT_TRUE(send_text(vmm.channel, "connect 1 6000"));
  std::string text;
  int fd = -1;
  ASSERT_TRUE(receive(vmm.channel, text, fd)) << vmm.rest_of(vmm.err);
  EXPECT_EQ(text, "refused 1 virtio-vsock: the guest's driver is not running");
  EXPECT_EQ(fd, -1);
  EXPECT_EQ(read_until(vmm.err, "\n"),
            "openshell: warning: the VMM's channel: dropped unknown verb \"hello\"\n");

  const pid_t pid = vmm.pid;
  ::close(vmm.channel);
  vmm.channel = -1;
  EXPECT_EQ(vmm.wait(), 128 + SIGTERM);
  EXPECT_NE(::kill(pid, 0), 0);  // reaped: nothing of it is left
  EXPECT_EQ(vmm.rest_of(vmm.err), "");
}

// PR_SET_PDEATHSIG: a VMM whose parent is killed goes with it.
TEST_P(VmmDevices, TheVmmDiesWithItsParent) {
  REQUIRE_KVM();
  const std::string spin = guest("spin");
  int out[2], report[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    const pid_t vmm = ::fork();
    if (vmm == 0) {
      ::dup2(out[1], 1);
      ::execl(binary().c_str(), "openshell", "__vmm", "--flat", spin.c_str(), "--memory", "16",
              nullptr);
      ::_exit(127);
    }
    ssize_t ignored = ::write(report[1], &vmm, sizeof vmm);
    (void)ignored;
    ::pause();  // until the test kills it
    ::_exit(0);
  }
  ::close(out[1]);
  ::close(report[1]);
  pid_t vmm = -1;
  ASSERT_EQ(::read(report[0], &vmm, sizeof vmm), static_cast<ssize_t>(sizeof vmm));
  ::close(report[0]);
  EXPECT_EQ(read_until(out[0], "s"), "s");  // it runs the guest: confined
  ::kill(parent, SIGKILL);
  ::waitpid(parent, nullptr, 0);
  // Gone, or a zombie for whoever reaps orphans here.
  auto gone = [vmm] {
    std::ifstream stat("/proc/" + std::to_string(vmm) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return true;
    const size_t paren = line.rfind(')');
    return paren != std::string::npos && line.compare(paren + 2, 1, "Z") == 0;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kTimeoutMs);
  while (!gone() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_TRUE(gone());
  if (!gone()) ::kill(vmm, SIGKILL);
  ::waitpid(vmm, nullptr, WNOHANG);  // reaped here if this process is the orphans' reaper
  ::close(out[0]);
}

E2E_ALL_MODES(VmmDevices);

}  // namespace
}  // namespace e2e
