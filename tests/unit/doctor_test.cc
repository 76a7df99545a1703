#include "cli/doctor.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/vm_host.h"
#include "test_util.h"

namespace openshell::cli::doctor {
namespace {

using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::HasSubstr;

constexpr uid_t kUser = 1000;

TEST(Doctor, KernelNeedsFiveElevenOrLater) {
  EXPECT_TRUE(kernel_check("6.18.44-fc").ok);
  EXPECT_TRUE(kernel_check("5.11.0").ok);
  Check old = kernel_check("5.10.0-28-amd64");
  EXPECT_FALSE(old.ok);
  EXPECT_TRUE(old.required);
  EXPECT_THAT(old.fix, HasSubstr("5.11"));
  EXPECT_THAT(format_line(old), HasSubstr("✗ kernel: Linux 5.10.0-28-amd64; fix: "));
}

TEST(Doctor, UserNamespacesOffOrRestrictedByAppArmor) {
  EXPECT_TRUE(userns_check("15000\n", std::nullopt, std::nullopt, kUser).ok);
  Check none = userns_check("0\n", std::nullopt, std::nullopt, 0);
  EXPECT_FALSE(none.ok);
  EXPECT_THAT(none.fix, HasSubstr("user.max_user_namespaces"));
  EXPECT_FALSE(userns_check(std::nullopt, std::nullopt, std::nullopt, 0).ok);
  Check debian = userns_check("15000\n", "0\n", std::nullopt, kUser);
  EXPECT_FALSE(debian.ok);
  EXPECT_THAT(debian.fix, HasSubstr("unprivileged_userns_clone=1"));
  Check ubuntu = userns_check("15000\n", "1\n", "1\n", kUser);
  EXPECT_FALSE(ubuntu.ok);
  EXPECT_TRUE(ubuntu.required);
  EXPECT_THAT(ubuntu.detail, HasSubstr("AppArmor"));
  EXPECT_THAT(ubuntu.fix, HasSubstr("apparmor_restrict_unprivileged_userns=0"));
  // Root is not restricted by either knob.
  EXPECT_TRUE(userns_check("15000\n", "0\n", "1\n", 0).ok);
}

TEST(Doctor, SubordinateRangesForTheCaller) {
  const std::string text = "alice:100000:65536\nbob:300000:1000\n";
  EXPECT_TRUE(subid_check("/etc/subuid", text, "alice", kUser).ok);
  Check small = subid_check("/etc/subuid", text, "bob", 1001);
  EXPECT_FALSE(small.ok);
  EXPECT_FALSE(small.required);
  EXPECT_THAT(small.detail, HasSubstr("only 1000 ids"));
  Check missing = subid_check("/etc/subgid", text, "carol", 1002);
  EXPECT_FALSE(missing.ok);
  EXPECT_THAT(missing.detail, HasSubstr("no entry for carol in /etc/subgid"));
  EXPECT_THAT(missing.fix, HasSubstr("usermod --add-subgids 100000-165535 carol"));
  EXPECT_THAT(format_line(missing), HasSubstr("(optional)"));
  EXPECT_FALSE(subid_check("/etc/subuid", std::nullopt, "alice", kUser).ok);
  EXPECT_TRUE(subid_check("/etc/subuid", std::nullopt, "root", 0).ok);
}

TEST(Doctor, IdMapHelpersPresentAndSetuid) {
  EXPECT_TRUE(idmap_helper_check("newuidmap", "/usr/bin/newuidmap", 0104755, false, kUser).ok);
  EXPECT_TRUE(idmap_helper_check("newuidmap", "/usr/bin/newuidmap", 0100755, true, kUser).ok);
  Check plain = idmap_helper_check("newgidmap", "/usr/bin/newgidmap", 0100755, false, kUser);
  EXPECT_FALSE(plain.ok);
  EXPECT_THAT(plain.fix, HasSubstr("chmod u+s /usr/bin/newgidmap"));
  Check absent = idmap_helper_check("newuidmap", "", std::nullopt, false, kUser);
  EXPECT_FALSE(absent.ok);
  EXPECT_THAT(absent.detail, HasSubstr("not on PATH"));
  EXPECT_THAT(absent.fix, HasSubstr("apt-get install uidmap"));
  EXPECT_TRUE(idmap_helper_check("newuidmap", "", std::nullopt, false, 0).ok);
}

// A fake /sys/fs/cgroup: each layout, and whose cgroup the caller may write.
TEST(Doctor, CgroupLayoutsAndDelegation) {
  {
    TempDir v2;
    write_file(v2 / "cgroup.controllers", "cpuset cpu io memory pids\n");
    write_file(v2 / "user.slice/cgroup.controllers", "cpu memory pids\n");
    Check c = cgroup_check(v2.path(), "0::/user.slice\n", 0);
    EXPECT_TRUE(c.ok) << c.detail;
    EXPECT_THAT(c.detail, HasSubstr("v2; usable: memory (v2), pids (v2), cpu (v2)"));
    // An ordinary user whose cgroup is not theirs: nothing is delegated.
    ::chown((v2 / "user.slice").c_str(), 0, 0);
    ::chmod((v2 / "user.slice").c_str(), 0755);
    Check user = cgroup_check(v2.path(), "0::/user.slice\n", kUser);
    EXPECT_FALSE(user.ok);
    EXPECT_FALSE(user.required);
    EXPECT_THAT(user.detail, HasSubstr("not delegated to you: memory, pids, cpu"));
    EXPECT_THAT(user.fix, HasSubstr("Delegate=yes"));
    // Delegated to them: theirs.
    ::chown((v2 / "user.slice").c_str(), kUser, kUser);
    EXPECT_TRUE(cgroup_check(v2.path(), "0::/user.slice\n", kUser).ok);
  }
  {
    TempDir hybrid;
    write_file(hybrid / "unified/cgroup.controllers", "\n");
    write_file(hybrid / "memory/tasks", "");
    write_file(hybrid / "pids/tasks", "");
    write_file(hybrid / "cpu,cpuacct/tasks", "");
    Check c = cgroup_check(hybrid.path(),
                           "5:memory:/\n4:pids:/\n3:cpu,cpuacct:/\n1:name=systemd:/\n0::/\n", 0);
    EXPECT_TRUE(c.ok) << c.detail;
    EXPECT_THAT(c.detail, HasSubstr("hybrid; usable: memory (v1), pids (v1), cpu (v1)"));
  }
  {
    TempDir v1;
    write_file(v1 / "memory/tasks", "");
    Check c = cgroup_check(v1.path(), "5:memory:/\n", 0);
    EXPECT_FALSE(c.ok);
    EXPECT_THAT(c.detail, HasSubstr("v1; usable: memory (v1); not delegated to you: pids, cpu"));
  }
  {
    TempDir none;
    Check c = cgroup_check(none.path(), "", 0);
    EXPECT_FALSE(c.ok);
    EXPECT_THAT(c.detail, HasSubstr("no cgroup file system"));
  }
}

TEST(Doctor, LandlockSeccompOverlayKvm) {
  EXPECT_EQ(landlock_check(7).detail, "ABI 7");
  EXPECT_FALSE(landlock_check(0).ok);
  EXPECT_TRUE(seccomp_check("Name:\tx\nSeccomp:\t0\nSeccomp_filters:\t0\n").ok);
  Check sec = seccomp_check("Name:\tx\nState:\tR\n");
  EXPECT_FALSE(sec.ok);
  EXPECT_TRUE(sec.required);
  EXPECT_TRUE(overlay_check("").ok);
  EXPECT_THAT(overlay_check("mount overlay: Invalid argument").detail, HasSubstr("Invalid"));
}

TEST(Doctor, MicroVmsNeedKvmAKernelAndHardwareVirtualisation) {
  const std::string vmx = "processor\t: 0\nflags\t\t: fpu vme vmx sse\n";
  const vm_host::KernelChoice kernel{"/k/vmlinux", "OPENSHELL_VM_KERNEL"};
  Check ok = micro_vm_check("", kernel, "", vmx);
  EXPECT_TRUE(ok.ok);
  EXPECT_FALSE(ok.required);  // a warning: containers do not need it
  EXPECT_THAT(ok.detail, HasSubstr("guest kernel /k/vmlinux (OPENSHELL_VM_KERNEL)"));
  EXPECT_TRUE(micro_vm_check("", kernel, "", "flags\t\t: fpu svm\n").ok);

  Check pvm = micro_vm_check("", kernel, "", "processor\t: 0\nflags\t\t: fpu vme sse\n");
  EXPECT_FALSE(pvm.ok);
  EXPECT_FALSE(pvm.required);
  EXPECT_THAT(pvm.detail, HasSubstr("PVM"));
  EXPECT_THAT(pvm.detail, HasSubstr("Linux guests do not boot on paravirtualised KVM"));

  Check no_kvm = micro_vm_check("/dev/kvm: Permission denied", kernel, "", vmx);
  EXPECT_FALSE(no_kvm.ok);
  EXPECT_THAT(no_kvm.detail, HasSubstr("/dev/kvm: Permission denied"));
  EXPECT_THAT(no_kvm.fix, HasSubstr("kvm"));

  Check no_kernel = micro_vm_check("", {"/usr/lib/openshell/vmlinux", "the default"},
                                   "No such file or directory", vmx);
  EXPECT_FALSE(no_kernel.ok);
  EXPECT_THAT(no_kernel.detail, HasSubstr("no guest kernel at /usr/lib/openshell/vmlinux"));
  EXPECT_THAT(no_kernel.fix, HasSubstr("build-guest-kernel"));
}

TEST(VmHost, KernelChoiceAndKvm) {
  EXPECT_EQ(vm_host::choose_kernel("./k", "/env/k").source, "--vm-kernel");
  EXPECT_EQ(vm_host::choose_kernel("", "/env/k").path, "/env/k");
  EXPECT_EQ(vm_host::choose_kernel("", "").path, vm_host::kPackagedKernel);
  EXPECT_EQ(vm_host::choose_kernel("", nullptr).source, "the default");
  TempDir dir;
  write_file(dir / "vmlinux", "not really");
  EXPECT_EQ(vm_host::kernel_problem(dir / "vmlinux"), "");
  EXPECT_EQ(vm_host::kernel_problem(dir.path()), "not a regular file");
  EXPECT_EQ(vm_host::resolve_kernel(dir / "vmlinux", nullptr), dir / "vmlinux");
  EXPECT_THAT(vm_host::kernel_problem(dir / "none"), HasSubstr("No such file"));
  try {
    vm_host::resolve_kernel(dir / "none", nullptr);
    ADD_FAILURE() << "a missing --vm-kernel resolved";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("--vm-kernel " + (dir / "none") + ": No such file"));
  }
  try {
    vm_host::resolve_kernel("", (dir / "none").c_str());
    ADD_FAILURE() << "a missing OPENSHELL_VM_KERNEL resolved";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("OPENSHELL_VM_KERNEL=" + (dir / "none")));
  }
  // /dev/kvm's stand-in: a file opens read-write; a missing one says so.
  write_file(dir / "kvm", "");
  EXPECT_EQ(vm_host::kvm_problem(dir / "kvm"), "");
  EXPECT_THAT(vm_host::kvm_problem(dir / "nokvm"), HasSubstr("No such file"));
}

TEST(Doctor, DirectoriesExistingOrCreatable) {
  TempDir d;
  EXPECT_TRUE(directory_check("state directory", d.path()).ok);
  Check later = directory_check("state directory", d / "a/b");
  EXPECT_TRUE(later.ok);
  EXPECT_THAT(later.detail, HasSubstr("made on first use"));
  write_file(d / "file", "");
  Check bad = directory_check("runtime directory", d / "file/run");
  EXPECT_FALSE(bad.ok);
  EXPECT_TRUE(bad.required);
  EXPECT_THAT(bad.fix, HasSubstr("OPENSHELL_HOME"));
}

TEST(Doctor, ExitsNonZeroOnlyForRequiredChecks) {
  Check optional_bad = micro_vm_check("/nonexistent/kvm: No such file or directory",
                                      {"/k", "the default"}, "", std::nullopt);
  ASSERT_FALSE(optional_bad.ok);
  Check fine = landlock_check(3);
  EXPECT_TRUE(all_required_ok({optional_bad, fine}));
  EXPECT_FALSE(all_required_ok({fine, seccomp_check(std::nullopt)}));
  EXPECT_THAT(to_json({fine}), HasSubstr("\"ok\": true"));
}

}  // namespace
}  // namespace openshell::cli::doctor
