// `--vm` up to the launch: what sandbox create and run refuse before any
// VM starts (no guest kernel, the host's root), and a rootless gateway's
// refusal when its user cannot open /dev/kvm. No test here boots a guest.
#include <sys/stat.h>

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "harness.h"

namespace e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kNoKernel =
    "openshell: --vm: no guest kernel (give --vm-kernel PATH or set OPENSHELL_VM_KERNEL; "
    "rootfs-tools/build-guest-kernel builds one)\n";
constexpr const char* kPackagedKernel = "/usr/lib/openshell/vmlinux";

class VmSpec : public GatewayTest {
 protected:
  VmSpec() : GatewayTest("vmspec") {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    static int counter = 0;
    // Any readable file passes create's check of the kernel: none of these
    // tests gets as far as loading it.
    kernel_ = write_file(
        scratch() + "/vmlinux-" + mode_name(mode()) + "-" + std::to_string(++counter), "kernel");
  }
  // The sandboxes the gateway has (starts none when it is not running).
  std::string sandboxes() {
    Result r = os({"sandbox", "list", "-o", "json"});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }
  std::string kernel_;
};
E2E_ALL_MODES(VmSpec);

TEST_P(VmSpec, CreateWithoutAKernelSaysSoInOneLineAndMakesNothing) {
  if (mode() != Mode::kRoot) GTEST_SKIP() << "the command line's check: one mode shows it";
  struct stat st;
  if (::stat(kPackagedKernel, &st) == 0)
    GTEST_SKIP() << kPackagedKernel << " is installed here: a kernel is always found";
  GatewayGuard gateway(mode(), home_);
  Result r = os({"sandbox", "create", "--name", "vm", "--vm", "--from", rootfs(), "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, kNoKernel);
  // An empty OPENSHELL_VM_KERNEL is no kernel either.
  Options empty;
  empty.env.push_back("OPENSHELL_VM_KERNEL=");
  r = os({"sandbox", "create", "--name", "vm", "--vm", "--from", rootfs()}, empty);
  EXPECT_EQ(r.err, kNoKernel);
  // A kernel named but missing is named.
  Options missing;
  missing.env.push_back("OPENSHELL_VM_KERNEL=" + scratch() + "/no-such-vmlinux");
  r = os({"sandbox", "create", "--name", "vm", "--vm", "--from", rootfs()}, missing);
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: OPENSHELL_VM_KERNEL=" + scratch() +
                       "/no-such-vmlinux: No such file or directory\n");
  r = os({"run", "--vm", "--rootfs", rootfs(), "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, kNoKernel);
  EXPECT_THAT(sandboxes(), Not(HasSubstr("\"name\"")));
}

TEST_P(VmSpec, TheHostsRootIsNoGuestsDisk) {
  if (mode() != Mode::kRoot) GTEST_SKIP() << "the command line's check: one mode shows it";
  GatewayGuard gateway(mode(), home_);
  const std::string line =
      "openshell: --vm needs an image: the host's root cannot be a guest's disk\n";
  Result r = os({"sandbox", "create", "--name", "vm", "--vm", "--vm-kernel", kernel_, "--from",
                 "host", "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, line);
  r = os({"run", "--vm", "--vm-kernel", kernel_, "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, line);
  // --vm-kernel alone makes no VM, and says so.
  r = os({"sandbox", "create", "--name", "vm", "--vm-kernel", kernel_, "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: --vm-kernel: only with --vm\n");
  // What a guest cannot honour is refused, not dropped.
  r = os({"sandbox", "create", "--name", "vm", "--vm", "--vm-kernel", kernel_, "--bind", "/etc:/e",
          "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err, "openshell: --bind /etc:/e: not with --vm (a micro-VM sees only its disks)\n");
  r = os({"run", "--vm", "--vm-kernel", kernel_, "-t", "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_EQ(r.err,
            "openshell: --tty: not with --vm (the main process runs on the guest's console; exec "
            "-t has a terminal)\n");
  EXPECT_THAT(sandboxes(), Not(HasSubstr("\"name\"")));
}

TEST_P(VmSpec, HelpAndCompletionsKnowTheOptions) {
  if (mode() != Mode::kRoot) GTEST_SKIP() << "the command line's text: one mode shows it";
  for (const char* shell : {"bash", "fish"}) {
    Result r = os({"completions", shell});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("vm-kernel")) << shell;
  }
  Result bash = os({"completions", "bash"});
  for (const std::string command : {"\" sandbox create\") list=\"", "\" run\") list=\""}) {
    const size_t at = bash.out.find(command);
    ASSERT_NE(at, std::string::npos) << command;
    const std::string line = bash.out.substr(at, bash.out.find('\n', at) - at);
    EXPECT_THAT(line, HasSubstr(" --vm ")) << line;
    EXPECT_THAT(line, HasSubstr("--vm-kernel")) << line;
  }
  for (const std::vector<std::string> help :
       {std::vector<std::string>{"sandbox", "create", "--help"},
        std::vector<std::string>{"run", "--help"}}) {
    Result r = os(help);
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, HasSubstr("--vm-kernel"));
    EXPECT_THAT(r.out, HasSubstr("OPENSHELL_VM_KERNEL"));
  }
}

TEST_P(VmSpec, ARootlessGatewayWithoutKvmRefusesAtCreate) {
  if (!is_rootless(mode())) GTEST_SKIP() << "root opens /dev/kvm";
  struct stat st;
  if (::stat("/dev/kvm", &st) == 0) {
    const bool owner = st.st_uid == uid_of(mode()), group = st.st_gid == gid_of(mode());
    const mode_t rw = owner   ? (st.st_mode & 0600) >> 6
                      : group ? (st.st_mode & 060) >> 3
                              : st.st_mode & 06;
    if (rw == 06) GTEST_SKIP() << "the test user may open /dev/kvm read-write here";
  }
  GatewayGuard gateway(mode(), home_);
  Result r = os({"sandbox", "create", "--name", "vm", "--vm", "--vm-kernel", kernel_, "--from",
                 rootfs(), "--", "true"});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, ::testing::StartsWith(
                         "openshell: --vm: this gateway cannot run micro-VMs: /dev/kvm: "));
  if (::stat("/dev/kvm", &st) == 0)
    EXPECT_THAT(r.err, HasSubstr("Permission denied (user " + std::to_string(uid_of(mode())) +
                                 " must be able to open /dev/kvm read-write"));
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << "one line";
  EXPECT_THAT(sandboxes(), Not(HasSubstr("\"name\"")));
  // The same request without --vm is no VM's, and the gateway takes it.
  r = os({"sandbox", "create", "--name", "plain", "-d", "--from", rootfs()});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(os({"sandbox", "delete", "plain"}).status, 0);
}

}  // namespace
}  // namespace e2e
