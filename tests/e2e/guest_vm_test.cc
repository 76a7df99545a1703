// The micro-VM's guest side from the real binary: `openshell __guest-initramfs`
// writes an initramfs that holds the binary as /init and a checked guest
// configuration, refusing a bad one in one line; and, where /dev/kvm is
// hardware-backed and a guest kernel is built (OSH_GUEST_KERNEL), Linux
// boots under `openshell __vmm` with that initramfs, the guest init runs
// the main process and reports its exit on the serial console.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;

namespace e2e {
namespace {

bool hardware_kvm() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string w; words >> w;)
      if (w == "vmx" || w == "svm") return true;
  }
  return false;
}

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

class GuestVm : public ModeTest {};

TEST_P(GuestVm, TheInitramfsHoldsTheBinaryAsInitAndTheConfig) {
  const std::string dir = make_dir(mode(), "guest-initramfs");
  const std::string config = write_file(dir + "/guest.json", R"({"argv": ["/init", "--version"]})");
  const std::string out = dir + "/initramfs.gz";
  Result r = openshell(mode(), {"__guest-initramfs", "--config", config, "-o", out});
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "");
  if (std::system("command -v cpio >/dev/null 2>&1") != 0) GTEST_SKIP() << "needs cpio";
  const std::string listing = shell("gzip -dc < " + out + " | cpio -tv --quiet");
  EXPECT_THAT(listing, HasSubstr(" init\n"));
  EXPECT_THAT(listing, HasSubstr(" etc/openshell-guest.json\n"));
  EXPECT_THAT(listing, HasSubstr(" dev/console\n"));
  const std::string init =
      shell("gzip -dc < " + out + " | cpio -i --quiet --to-stdout init | cmp - " + binary() +
            " && echo same");
  EXPECT_EQ(init, "same\n") << "/init is this binary";
}

TEST_P(GuestVm, ABadConfigIsOneLineAndNoFile) {
  const std::string dir = make_dir(mode(), "guest-initramfs-bad");
  const std::string config = write_file(dir + "/guest.json", R"({"argv": "/bin/sh"})");
  const std::string out = dir + "/initramfs.gz";
  Result r = openshell(mode(), {"__guest-initramfs", "--config", config, "-o", out});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, testing::StartsWith("openshell: guest config: wrong type"));
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(::access(out.c_str(), F_OK), 0) << "no initramfs for a bad config";
  r = openshell(mode(), {"__guest-initramfs", "--config", dir + "/missing.json", "-o", out});
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr(dir + "/missing.json"));
}

TEST_P(GuestVm, LinuxBootsAndTheGuestInitRunsTheMainProcess) {
  if (!hardware_kvm())
    GTEST_SKIP() << "needs hardware KVM (vmx/svm in /proc/cpuinfo); /dev/kvm here is PVM";
  const char* kernel = std::getenv("OSH_GUEST_KERNEL");
  if (!kernel || !*kernel || ::access(kernel, R_OK) != 0)
    GTEST_SKIP() << "no guest kernel: OSH_GUEST_KERNEL names one (rootfs-tools/build-guest-kernel)";
  if (is_rootless(mode())) GTEST_SKIP() << "/dev/kvm is root-only here";
  const std::string dir = make_dir(mode(), "guest-boot");
  const std::string config = write_file(dir + "/guest.json", R"({"argv": ["/init", "--version"]})");
  const std::string initramfs = dir + "/initramfs.gz";
  Result r = openshell(mode(), {"__guest-initramfs", "--config", config, "-o", initramfs});
  ASSERT_EQ(r.status, 0) << r.err;
  const Result version = openshell(mode(), {"--version"});
  Options slow;
  slow.timeout_s = 120;
  r = openshell(mode(),
                {"__vmm", "--kernel", kernel, "--initramfs", initramfs, "--memory", "256",
                 "--cmdline", "console=ttyS0 reboot=k panic=-1 rdinit=/init"},
                slow);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("Linux version"));
  EXPECT_THAT(r.out, HasSubstr(version.out)) << "the main process's output on the console";
  EXPECT_THAT(r.out, HasSubstr("openshell-guest: the main process exited with status 0"));
}

E2E_ALL_MODES(GuestVm);

}  // namespace
}  // namespace e2e
