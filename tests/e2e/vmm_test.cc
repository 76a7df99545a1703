// `openshell __vmm`, the confined VMM process, from the real binary: the
// tests' small guests run to their end and give the documented exit
// statuses; while a guest runs, every thread of the VMM is confined (no
// capabilities, no_new_privs, a seccomp filter, its own namespaces; that it
// is not dumpable is tested in tests/unit/vm_confine_test.cc); as an
// ordinary user it says in one line that /dev/kvm cannot be opened.
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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

class Vmm : public ModeTest {
 protected:
  // The guest, copied where every test user can read it.
  std::string guest(const std::string& name) {
    return vm_helpers::readable_guest("vmm-", name + ".bin");
  }
  void SetUp() override {
    ModeTest::SetUp();
    if (!IsSkipped() && mode() == Mode::kRoot && ::access("/dev/kvm", R_OK | W_OK) != 0)
      GTEST_SKIP() << "/dev/kvm cannot be opened here";
  }
};

TEST_P(Vmm, RunsAGuestToItsResetWithTheSerialPortOnStdout) {
  const Result r = openshell(mode(), {"__vmm", "--flat", guest("long_hello"), "--memory", "16"});
  if (is_rootless(mode())) {
    // Root's alone here, or absent (a machine without KVM): refused either way.
    const std::string why =
        ::access("/dev/kvm", F_OK) == 0 ? "Permission denied" : "No such file or directory";
    EXPECT_EQ(r.status, 125);
    EXPECT_EQ(r.err, "openshell: /dev/kvm: " + why + "\n");
    EXPECT_EQ(r.out, "");
    return;
  }
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "long hypervisor\n");
}

TEST_P(Vmm, ARealModeGuestReachesLongModeByItself) {
  if (is_rootless(mode()))
    GTEST_SKIP() << "/dev/kvm is root-only here (the refusal is tested above)";
  const Result r = openshell(
      mode(), {"__vmm", "--flat", guest("real_to_long"), "--entry", "real", "--memory", "16"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "long mode\n");
}

TEST_P(Vmm, ATripleFaultOrABadMmioAccessIsStatusTwoWithTheReason) {
  if (is_rootless(mode()))
    GTEST_SKIP() << "/dev/kvm is root-only here (the refusal is tested above)";
  Result r = openshell(mode(), {"__vmm", "--flat", guest("triple_fault"), "--memory", "16"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.out, "!");
  EXPECT_EQ(r.err, "openshell: the VM ended: triple fault\n");
  r = openshell(mode(), {"__vmm", "--flat", guest("mmio"), "--memory", "16"});
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "openshell: the VM ended: MMIO write of 4 bytes at 0xd0000010: no device there\n");
}

TEST_P(Vmm, BadInputIsOneLineAndStatus125) {
  Result r = openshell(mode(), {"__vmm", "--flat", scratch() + "/no-such-guest"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: guest " + scratch() + "/no-such-guest: cannot be read\n");
  r = openshell(mode(), {"__vmm", "--flat", guest("spin"), "--memory", "3"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: guest memory of 3 MiB: it must be even, at least 2\n");
  r = openshell(mode(), {"__vmm", "--kernel", guest("spin")});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: the kernel is neither a bzImage nor an ELF vmlinux\n");
}

std::string status_field(const std::string& status_path, const std::string& key) {
  std::ifstream in(status_path);
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) {
      const size_t at = line.find_first_not_of(" \t", key.size() + 1);
      return at == std::string::npos ? "" : line.substr(at);
    }
  return "";
}

// While the spin guest runs: every thread of the VMM under no capability,
// no_new_privs and one seccomp filter; the process in namespaces of its own.
TEST_P(Vmm, EveryThreadOfARunningVmmIsConfined) {
  if (is_rootless(mode()))
    GTEST_SKIP() << "/dev/kvm is root-only here (the refusal is tested above)";
  const std::string spin = guest("spin");
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::execl(binary().c_str(), "openshell", "__vmm", "--flat", spin.c_str(), "--memory", "16",
            nullptr);
    ::_exit(127);
  }
  ::close(out[1]);
  char byte = 0;
  ASSERT_EQ(::read(out[0], &byte, 1), 1);  // the guest runs: its first byte
  EXPECT_EQ(byte, 's');
  // The main thread's filter comes just after the vCPU thread starts.
  const std::string proc = "/proc/" + std::to_string(pid);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (status_field(proc + "/status", "Seccomp") != "2" &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));

  std::vector<std::string> names;
  for (const auto& task : std::filesystem::directory_iterator(proc + "/task")) {
    const std::string status = task.path().string() + "/status";
    // KVM's own workers (kvm-nx-lpage-recovery) show as threads too, and
    // inherit the filter of the thread that made the VM.
    const std::string name = status_field(status, "Name");
    if (name.rfind("kvm-", 0) != 0) names.push_back(name);
    EXPECT_EQ(status_field(status, "CapEff"), "0000000000000000") << status;
    EXPECT_EQ(status_field(status, "CapPrm"), "0000000000000000") << status;
    EXPECT_EQ(status_field(status, "CapBnd"), "0000000000000000") << status;
    EXPECT_EQ(status_field(status, "NoNewPrivs"), "1") << status;
    EXPECT_EQ(status_field(status, "Seccomp"), "2") << status;  // filter mode
    EXPECT_EQ(status_field(status, "Seccomp_filters"), "1") << status;
  }
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"openshell", "vcpu 0"}));
  for (const char* ns : {"user", "mnt", "net", "ipc", "uts"}) {
    EXPECT_NE(std::filesystem::read_symlink(proc + "/ns/" + ns),
              std::filesystem::read_symlink(std::string("/proc/self/ns/") + ns))
        << ns;
  }

  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ::close(out[0]);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGTERM)
      << "wait status " << status;
}

E2E_ALL_MODES(Vmm);

}  // namespace
}  // namespace e2e
