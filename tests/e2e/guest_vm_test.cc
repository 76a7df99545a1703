// The micro-VM's guest side from the real binary: `openshell __guest-initramfs`
// writes an initramfs that holds the binary as /init and a checked guest
// configuration, refusing a bad one in one line; and, where /dev/kvm is
// hardware-backed and a guest kernel is built (OSH_GUEST_KERNEL), Linux
// boots under `openshell __vmm` with that initramfs, the guest init runs
// the main process and reports its exit on the serial console.
#include <sys/stat.h>
#include <sys/wait.h>
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

// A loop device on a file, detached when it goes.
struct Loop {
  std::string device;
  Loop(const std::string& file, bool read_only) {
    std::string out = shell("losetup -f --show " + std::string(read_only ? "-r " : "") + file);
    if (!out.empty() && out.back() == '\n') out.pop_back();
    device = out;
  }
  ~Loop() {
    if (!device.empty()) shell("losetup -d " + device);
  }
};

// `__guest-init CONFIG` as PID 1 of new PID and mount namespaces, on a tmpfs
// /mnt there: what it does in the guest, but on loop devices. Returns its
// output; *status is unshare's (the init's power-off ends a PID namespace's
// init by SIGINT: 130).
// `namespaces`: more of unshare's options (-n, -u: the relays' loopback
// listeners and the hostname, kept off the host's).
std::string guest_init_in_namespaces(const std::string& config, int* status,
                                     const std::string& namespaces = "") {
  std::string cmd = "timeout 60 unshare -fpm" + namespaces +
                    " --propagation private sh -c 'mount -t tmpfs tmpfs /mnt && exec " + binary() +
                    " __guest-init " + config + "' 2>&1";
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  *status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  return out;
}

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

TEST_P(GuestVm, AsPid1ItMountsTheOverlayAndTheLayerKeepsWhatTheSandboxWrote) {
  if (mode() != Mode::kRoot) GTEST_SKIP() << "loop devices and PID 1's mounts need root";
  if (::access("/dev/loop-control", R_OK | W_OK) != 0 ||
      std::system("command -v losetup >/dev/null && test -x /usr/sbin/mkfs.ext4") != 0)
    GTEST_SKIP() << "needs loop devices, losetup and mkfs.ext4";
  const std::string dir = make_dir(mode(), "guest-pid1");
  ASSERT_EQ(
      std::system(
          ("/usr/sbin/mkfs.ext4 -q -F -d " + rootfs() + " " + dir + "/image.ext4 64M").c_str()),
      0);
  ASSERT_EQ(std::system(("/usr/sbin/mkfs.ext4 -q -F " + dir + "/layer.ext4 64M").c_str()), 0);
  std::string config_text;
  int status = -1;
  {
    Loop image(dir + "/image.ext4", true);
    Loop layer(dir + "/layer.ext4", false);
    ASSERT_FALSE(image.device.empty());
    ASSERT_FALSE(layer.device.empty());
    auto config = [&](const std::string& script) {
      return write_file(dir + "/guest.json",
                        "{\"disk\": \"" + image.device + "\", \"layer\": \"" + layer.device +
                            "\", \"env\": [\"PATH=/bin:/usr/bin\"], " +
                            "\"uid\": 1000, \"gid\": 1000, \"argv\": [\"/bin/sh\", \"-c\", \"" +
                            script + "\"]}");
    };
    std::string out = guest_init_in_namespaces(
        config("echo kept > /tmp/made; id -u; test -e /usr/bin/osh-probe && echo probe; exit 3"),
        &status);
    EXPECT_EQ(status, 130) << out;
    EXPECT_THAT(out, HasSubstr("1000\nprobe\n")) << "the image's tree is the root, uid 1000";
    EXPECT_THAT(out, HasSubstr("openshell-guest: the main process exited with status 3"));
    // Started again: what it wrote is there, from the layer; exec -t's
    // devpts (the init's, by its options: the host's show through too)
    // moved into the root with /dev.
    out = guest_init_in_namespaces(config("cat /tmp/made; grep -c ' / overlay ' /proc/mounts; "
                                          "grep -c ' /dev/pts devpts .*mode=620,ptmxmode=666' "
                                          "/proc/mounts"),
                                   &status);
    EXPECT_THAT(out, HasSubstr("kept\n1\n1\n")) << out;
    EXPECT_THAT(out, HasSubstr("the main process exited with status 0"));
    // With the relays and a hostname (in network and UTS namespaces of its
    // own): the names are written into the root, and the relays listen on
    // loopback before the main process starts. No status port: where this
    // machine is itself a VM, vsock to CID 2 would reach its real host.
    write_file(dir + "/relays.json",
               "{\"disk\": \"" + image.device + "\", \"layer\": \"" + layer.device +
                   "\", \"env\": [\"PATH=/bin:/usr/bin\"], \"hostname\": \"box-1\", " +
                   "\"egress_port\": 3128, \"dns_port\": 53, " +
                   "\"argv\": [\"/bin/sh\", \"-c\", \"cat /etc/resolv.conf /etc/hosts "
                   "/proc/sys/kernel/hostname; grep -c ' 0100007F:0C38 00000000:0000 0A ' "
                   "/proc/net/tcp; grep -c ' 0100007F:0035 00000000:0000 07 ' /proc/net/udp\"]}");
    out = guest_init_in_namespaces(dir + "/relays.json", &status, "nu");
    EXPECT_THAT(out, HasSubstr("nameserver 127.0.0.1\n127.0.0.1\tlocalhost\n127.0.1.1\tbox-1\n"
                               "box-1\n1\n1\n"))
        << out;
    EXPECT_THAT(out, HasSubstr("the main process exited with status 0"));
    // A disk that is not there: one line, and the init ends.
    write_file(dir + "/bad.json", R"({"disk": "/dev/osh-no-such-disk", "argv": ["/bin/true"]})");
    out = guest_init_in_namespaces(dir + "/bad.json", &status);
    EXPECT_THAT(out,
                HasSubstr("openshell-guest: mount ext4 /dev/osh-no-such-disk on /mnt/lower: "));
  }
  // The write went to the layer, never to the image's disk.
  EXPECT_EQ(shell("/usr/sbin/debugfs -R 'cat /upper/tmp/made' " + dir + "/layer.ext4 2>/dev/null"),
            "kept\n");
  EXPECT_EQ(shell("/usr/sbin/debugfs -R 'ls /tmp' " + dir + "/image.ext4 2>/dev/null").find("made"),
            std::string::npos);
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
