// The guest kernel's configuration (rootfs-tools/guest-kernel.config) holds
// every option the micro-VM needs, and build-guest-kernel checks each of
// them in the built .config: its check list is the fragment's =y lines.
// Cheap: nothing is built here. Where a built kernel's config is at hand
// (OSH_GUEST_KERNEL=DIR/vmlinux, DIR/config beside it), it is checked too.
#include <cstdio>
#include <cstdlib>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "base/files.h"

#ifndef OSH_SOURCE_ROOT
#error "OSH_SOURCE_ROOT must name the source tree"
#endif

namespace openshell {
namespace {

const std::string kScript = std::string(OSH_SOURCE_ROOT) + "/rootfs-tools/build-guest-kernel";
const std::string kFragment = std::string(OSH_SOURCE_ROOT) + "/rootfs-tools/guest-kernel.config";

// What the guest needs, from docs/vm.md's "The guest kernel".
const char* const kNeeded[] = {
    "CONFIG_64BIT",
    "CONFIG_PVH",
    "CONFIG_VIRTIO_MMIO",
    "CONFIG_VIRTIO_MMIO_CMDLINE_DEVICES",
    "CONFIG_VIRTIO_BLK",
    "CONFIG_VSOCKETS",
    "CONFIG_INET",  // TCP and UDP on loopback: the guest init's proxy and DNS relays
    "CONFIG_VIRTIO_VSOCKETS",
    "CONFIG_EXT4_FS",
    "CONFIG_OVERLAY_FS",
    "CONFIG_DEVTMPFS",
    "CONFIG_SERIAL_8250",
    "CONFIG_SERIAL_8250_CONSOLE",
    "CONFIG_BLK_DEV_INITRD",
    "CONFIG_RD_GZIP",
    "CONFIG_NAMESPACES",
    "CONFIG_USER_NS",
    "CONFIG_PID_NS",
    "CONFIG_NET_NS",
    "CONFIG_SECCOMP",
    "CONFIG_SECCOMP_FILTER",
    "CONFIG_SECURITY_LANDLOCK",
    "CONFIG_CGROUPS",
    "CONFIG_BINFMT_ELF",
    "CONFIG_TMPFS",
    "CONFIG_PROC_FS",
    "CONFIG_TTY",
    "CONFIG_UNIX98_PTYS",  // devpts and /dev/ptmx: exec -t's pseudo-terminals
};

std::set<std::string> script_check_list() {
  std::set<std::string> out;
  FILE* p = popen((kScript + " --required").c_str(), "r");
  if (!p) return out;
  char line[256];
  while (fgets(line, sizeof line, p)) {
    std::string s(line);
    while (!s.empty() && s.back() == '\n') s.pop_back();
    out.insert(s);
  }
  EXPECT_EQ(pclose(p), 0);
  return out;
}

TEST(GuestKernelConfig, TheScriptChecksEveryOptionTheGuestNeeds) {
  std::set<std::string> checked = script_check_list();
  ASSERT_FALSE(checked.empty());
  for (const char* option : kNeeded)
    EXPECT_TRUE(checked.count(option)) << option << " is not checked";
  // And its check list is exactly the fragment's =y lines.
  std::istringstream fragment(files::read(kFragment));
  std::set<std::string> set_y;
  for (std::string line; std::getline(fragment, line);) {
    if (line.rfind("CONFIG_", 0) == 0 && line.size() > 2 && line.substr(line.size() - 2) == "=y")
      set_y.insert(line.substr(0, line.size() - 2));
  }
  EXPECT_EQ(checked, set_y);
}

TEST(GuestKernelConfig, NoModulesAndNoOtherDrivers) {
  std::string fragment = files::read(kFragment);
  for (const char* off : {"# CONFIG_MODULES is not set", "# CONFIG_PCI is not set",
                          "# CONFIG_IPV6 is not set", "# CONFIG_ETHERNET is not set"})
    EXPECT_NE(fragment.find(off), std::string::npos) << off;
  EXPECT_EQ(fragment.find("CONFIG_MODULES=y"), std::string::npos);
  // INET is for loopback alone: no network device driver beside it.
  EXPECT_EQ(fragment.find("CONFIG_NETDEVICES=y"), std::string::npos);
  EXPECT_EQ(fragment.find("CONFIG_VIRTIO_NET=y"), std::string::npos);
}

TEST(GuestKernelConfig, WithoutTheSourceTheScriptSaysWhatToInstall) {
  std::string out;
  FILE* p = popen(("OSH_LINUX_SOURCE=/nonexistent/linux.tar.xz " + kScript +
                   " /nonexistent/out 2>&1; echo \"exit $?\"")
                      .c_str(),
                  "r");
  ASSERT_NE(p, nullptr);
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  pclose(p);
  EXPECT_EQ(out, kScript +
                     ": no kernel source at /nonexistent/linux.tar.xz: apt-get install "
                     "linux-source-6.1 (or set OSH_LINUX_SOURCE)\nexit 1\n");
}

TEST(GuestKernelConfig, ABuiltKernelHasEveryCheckedOption) {
  const char* kernel = std::getenv("OSH_GUEST_KERNEL");
  if (!kernel || !*kernel) GTEST_SKIP() << "no built kernel: OSH_GUEST_KERNEL names one";
  std::string dir = kernel;
  dir = dir.substr(0, dir.find_last_of('/'));
  auto config = files::try_read(dir + "/config");
  if (!config) GTEST_SKIP() << "no config beside " << kernel;
  for (const std::string& option : script_check_list())
    EXPECT_NE(config->find("\n" + option + "=y\n"), std::string::npos) << option;
  EXPECT_EQ(config->find("\nCONFIG_MODULES=y\n"), std::string::npos);
}

}  // namespace
}  // namespace openshell
