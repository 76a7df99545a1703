// A --vm sandbox's lifecycle through the gateway, its supervisor and a real
// confined VMM: the phases follow what the guest's init says on its status
// stream, a stop reaches the init, start boots the guest again, a guest that
// faults ends only its own sandbox in Error with the reason, and delete
// leaves no VMM and no file. Linux does not boot on this machine's KVM
// (PVM), so the "kernels" are crafted bzImages (tests/vm/guests) whose
// entries speak the init's side of the status stream over our virtio-vsock
// device: what the supervisor hears is exactly what a booted guest's init
// would send. The test that boots Linux is GuestVm.LinuxBoots... in
// guest_vm_test.cc.
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>

#include "harness.h"
#include "image_helpers.h"
#include "vm_helpers.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

using image_helpers::busybox_layout;

// The pids of live `openshell __vmm` processes whose command line holds
// `needle` (a sandbox's id: its layer's path is on it).
std::vector<int> vmms_of(const std::string& needle) {
  std::vector<int> pids;
  DIR* proc = ::opendir("/proc");
  if (!proc) return pids;
  while (dirent* e = ::readdir(proc)) {
    const int pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::ifstream in("/proc/" + std::string(e->d_name) + "/cmdline");
    std::stringstream text;
    text << in.rdbuf();
    const std::string cmdline = text.str();
    if (cmdline.find("__vmm") != std::string::npos && cmdline.find(needle) != std::string::npos)
      pids.push_back(pid);
  }
  ::closedir(proc);
  return pids;
}

class VmSandbox : public GatewayTest {
 protected:
  VmSandbox() : GatewayTest("vm") {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    // KVM is root's alone on this machine; the rootless refusal is tested
    // in VmFlags.
    if (::access("/dev/kvm", R_OK | W_OK) != 0 || mode() != Mode::kRoot)
      GTEST_SKIP() << "/dev/kvm cannot be opened by this mode's user here";
    if (busybox_layout().empty()) GTEST_SKIP() << "the busybox image could not be built";
    Result r = os({"image", "import", busybox_layout(), "bb"});
    ASSERT_EQ(r.status, 0) << r.err;
  }
  void TearDown() override {
    if (!home_.empty()) os({"sandbox", "delete", "--all"});
    GatewayTest::TearDown();
  }
  // The crafted kernel, copied where the gateway's user can read it.
  std::string kernel(const std::string& name) {
    return vm_helpers::readable_guest("vm-", name + ".bzImage");
  }
  Result create(const std::string& name, const std::string& guest, bool detach,
                const std::vector<std::string>& more = {}) {
    std::vector<std::string> args = {"sandbox",     "create",   "--name", name,
                                     "--from",      "bb",       "--vm",   "--vm-kernel",
                                     kernel(guest), "--memory", "64M"};
    if (detach) args.push_back("-d");
    args.insert(args.end(), more.begin(), more.end());
    args.insert(args.end(), {"--", "true"});
    return os(args);
  }
  // Both streams: the serial console is stdout, the VMM's and the
  // supervisor's lines stderr.
  std::string logs(const std::string& name) {
    Result r = os({"sandbox", "logs", name});
    return r.out + r.err;
  }
  // The sandbox's network audit: the proxy's decisions, one JSON line each.
  std::string audit(const std::string& name) {
    Result r = os({"logs", name, "--source", "network"});
    return r.out;
  }
};

TEST_P(VmSandbox, TheGuestsInitReportsTheMainProcessAndItsStatusIsTheSandboxs) {
  Result r = create("v1", "status_guest1", false);
  // The guest's init said `exit 7`: the sandbox's main process failed with 7.
  EXPECT_EQ(r.status, 7) << r.out << r.err;
  EXPECT_EQ(phase("v1"), "Error");
  EXPECT_EQ(field("v1", "exit_code"), "7");
  // The serial console is the sandbox's log: the guest's "OK" is there.
  EXPECT_THAT(logs("v1"), HasSubstr("OK"));
  EXPECT_THAT(logs("v1"), Not(HasSubstr("before its init reported")));
  const std::string id = field("v1", "id");
  ASSERT_FALSE(id.empty());
  EXPECT_TRUE(vmms_of(id).empty());
}

TEST_P(VmSandbox, StopReachesTheGuestsInitAndStartBootsItAgain) {
  ASSERT_EQ(create("v2", "status_guest2", true).status, 0);
  ASSERT_TRUE(wait_phase("v2", "Ready"));
  const std::string id = field("v2", "id");
  EXPECT_EQ(vmms_of(id).size(), 1u);
  Result s = os({"sandbox", "stop", "v2"});
  ASSERT_EQ(s.status, 0) << s.err;
  ASSERT_TRUE(wait_phase("v2", "Stopped"));
  // The guest printed the line the supervisor sent it, and answered.
  EXPECT_THAT(logs("v2"), HasSubstr("stop "));
  EXPECT_TRUE(vmms_of(id).empty());

  ASSERT_EQ(os({"sandbox", "start", "v2"}).status, 0);
  ASSERT_TRUE(wait_phase("v2", "Ready"));
  EXPECT_EQ(vmms_of(id).size(), 1u);
  ASSERT_EQ(os({"sandbox", "delete", "v2"}).status, 0);
  // Nothing of it is left: no VMM, no sandbox directory (its layer, its
  // initramfs).
  EXPECT_TRUE(vmms_of(id).empty());
  EXPECT_NE(os({"sandbox", "get", "v2"}).status, 0);
  EXPECT_FALSE(std::filesystem::exists(home_ + "/sandboxes/" + id)) << home_;
}

TEST_P(VmSandbox, AGuestThatFaultsEndsOnlyItsOwnSandboxInError) {
  ASSERT_EQ(create("keeper", "status_guest2", true).status, 0);
  ASSERT_TRUE(wait_phase("keeper", "Ready"));
  Result r = create("bad", "fault_guest", false);
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(phase("bad"), "Error");
  EXPECT_THAT(field("bad", "message"), HasSubstr("triple fault"));
  EXPECT_THAT(logs("bad"), HasSubstr("triple fault"));
  EXPECT_EQ(phase("keeper"), "Ready");
  EXPECT_EQ(vmms_of(field("keeper", "id")).size(), 1u);
}

// openshell run --vm: the same VM in the calling process, the serial
// console on stdout, the init's status as the exit status, and nothing of
// the run left (its temporary directory with the layer and the initramfs).
TEST_P(VmSandbox, RunVmGivesTheGuestsConsoleAndStatusAndLeavesNothing) {
  const std::string tmp = make_dir(mode(), "vm-run-tmp");
  Options o;
  o.env = {"TMPDIR=" + tmp};
  Result r = os({"run", "--vm", "--vm-kernel", kernel("status_guest1"), "--image", "bb", "--memory",
                 "64M", "--", "true"},
                o);
  EXPECT_EQ(r.status, 7) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("OK"));
  EXPECT_TRUE(std::filesystem::is_empty(tmp)) << "the run's directory is left in " << tmp;
  r = os({"run", "--vm", "--vm-kernel", kernel("fault_guest"), "--image", "bb", "--memory", "64M",
          "--", "true"},
         o);
  EXPECT_EQ(r.status, 125);
  EXPECT_THAT(r.err, HasSubstr("triple fault"));
  EXPECT_TRUE(std::filesystem::is_empty(tmp));
}

// The status stream speaks for the init: a connection to it from a port a
// sandbox process could bind (1024 and up) is refused, so its "exit 7" is
// never the sandbox's status.
TEST_P(VmSandbox, AStatusStreamFromAnUnreservedPortIsNotTheInits) {
  Result r = create("v3", "status_guest3", false);
  EXPECT_EQ(r.status, 125) << r.out << r.err;
  EXPECT_EQ(phase("v3"), "Error");
  EXPECT_THAT(field("v3", "message"), HasSubstr("before its init reported"));
  EXPECT_THAT(logs("v3"),
              HasSubstr("refused a guest connection to host port 1025 from guest port 5000"));
}

// Exec reaches the guest's init on its port 1024 and what the init's frames
// say is what the caller gets: the crafted guest answers every command with
// the same output and status 3, and serves one connection after another.
TEST_P(VmSandbox, ExecRunsOverTheGuestsFramesAndTheSandboxStaysReady) {
  ASSERT_EQ(create("x1", "exec_guest", true).status, 0);
  ASSERT_TRUE(wait_phase("x1", "Ready"));
  for (int i = 0; i < 2; ++i) {
    Result r = os({"sandbox", "exec", "x1", "--", "anything", std::to_string(i)});
    EXPECT_EQ(r.status, 3) << i << ": " << r.out << r.err;
    EXPECT_EQ(r.out, "hi from the guest\n") << i;
    EXPECT_EQ(r.err, "to stderr\n") << i;
    EXPECT_EQ(phase("x1"), "Ready") << i;
  }
  // With a terminal the request reaches the guest too (the crafted guest
  // answers it as any other; the pty itself is guest_init_test.cc's), and
  // the guest still serves.
  Options tty;
  tty.pty = true;
  Result t = os({"sandbox", "exec", "-t", "x1", "--", "sh"}, tty);
  EXPECT_EQ(t.status, 3) << t.out << t.err;
  EXPECT_THAT(t.out + t.err, HasSubstr("hi from the guest")) << t.out << t.err;
  Result again = os({"sandbox", "exec", "x1", "--", "anything"});
  EXPECT_EQ(again.status, 3) << again.out << again.err;
  EXPECT_EQ(again.out, "hi from the guest\n");

  const std::string id = field("x1", "id");
  ASSERT_EQ(os({"sandbox", "stop", "x1"}).status, 0);
  ASSERT_TRUE(wait_phase("x1", "Stopped"));
  EXPECT_THAT(logs("x1"), HasSubstr("stop "));
  EXPECT_TRUE(vmms_of(id).empty());
  Result stopped = os({"sandbox", "exec", "x1", "--", "anything"});
  EXPECT_NE(stopped.status, 0);
  EXPECT_EQ(stopped.out, "");
}

// A guest's connection to the proxy (host port 3128) names its binary in
// the init's identity line, and the sandbox's policy judges it as it judges
// a container's: no network by default, a rule for another binary does not
// let curl through, and the audit says why. blocked.invalid never resolves,
// so nothing leaves the machine whatever the proxy decided.
TEST_P(VmSandbox, AGuestsEgressIsJudgedByThePolicyForTheBinaryItNames) {
  Result r = create("e1", "egress_guest", false);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(phase("e1"), "Completed");
  // The guest printed the proxy's answer.
  EXPECT_THAT(logs("e1"), HasSubstr("HTTP/1.1 403"));
  std::string lines = audit("e1");
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"deny\"")) << lines;
  EXPECT_THAT(lines, HasSubstr("blocked.invalid")) << lines;
  EXPECT_THAT(lines, HasSubstr("\"binary\":\"/usr/bin/curl\"")) << lines;

  const std::string wget_only =
      write_file(scratch() + "/vm-wget-only.toml",
                 "version = 1\n"
                 "[network_policies.web]\n"
                 "endpoints = [ { host = \"blocked.invalid\", port = 80 } ]\n"
                 "binaries = [ { path = \"/usr/bin/wget\" } ]\n");
  Result w = create("e2", "egress_guest", false, {"--policy", wget_only});
  EXPECT_EQ(w.status, 0) << w.out << w.err;
  EXPECT_THAT(logs("e2"), HasSubstr("HTTP/1.1 403"));
  lines = audit("e2");
  EXPECT_THAT(lines, HasSubstr("\"decision\":\"deny\"")) << lines;
  EXPECT_THAT(lines, HasSubstr("allowed only for /usr/bin/wget, not for /usr/bin/curl")) << lines;
  EXPECT_THAT(lines, HasSubstr("\"binary\":\"/usr/bin/curl\"")) << lines;
}

// A policy names the binary as a user knows it, /usr/bin/wget; in the
// busybox image that is a link (../../bin/busybox), and the guest's init
// names the file its kernel ran, /bin/busybox. The supervisor resolves the
// policy's path in the image's layers, so the rule matches: the proxy goes
// on to resolve blocked.invalid, which fails (502, the rule named in the
// audit), where without the resolution it was denied as another binary's.
TEST_P(VmSandbox, APolicysBinaryPathIsResolvedInTheGuestsImage) {
  const std::string wget_only =
      write_file(scratch() + "/vm-wget-link.toml",
                 "version = 1\n"
                 "[network_policies.web]\n"
                 "endpoints = [ { host = \"blocked.invalid\", port = 80 } ]\n"
                 "binaries = [ { path = \"/usr/bin/wget\" } ]\n");
  Result r = create("e4", "egress_guest_busybox", false, {"--policy", wget_only});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(phase("e4"), "Completed");
  const std::string log = logs("e4");
  EXPECT_THAT(log, HasSubstr("HTTP/1.1 502")) << log;
  const std::string lines = audit("e4");
  EXPECT_THAT(lines, HasSubstr("\"binary\":\"/bin/busybox\"")) << lines;
  EXPECT_THAT(lines, HasSubstr("blocked.invalid")) << lines;
  EXPECT_THAT(lines, HasSubstr("\"rule\":\"web\"")) << lines;
  EXPECT_THAT(lines, Not(HasSubstr("allowed only for"))) << lines;

  // `run --vm` resolves them as well; it keeps no audit, the guest prints
  // the proxy's answer: 502 (the rule matched, the name did not resolve),
  // not 403.
  const std::string tmp = make_dir(mode(), "vm-run-policy-tmp");
  Options o;
  o.env = {"TMPDIR=" + tmp};
  Result run = os({"run", "--vm", "--vm-kernel", kernel("egress_guest_busybox"), "--image", "bb",
                   "--memory", "64M", "--policy", wget_only, "--", "true"},
                  o);
  EXPECT_EQ(run.status, 0) << run.out << run.err;
  EXPECT_THAT(run.out, HasSubstr("HTTP/1.1 502")) << run.out;
  EXPECT_THAT(run.out, Not(HasSubstr("allowed only for"))) << run.out;
}

// A connection to the proxy from a port a sandbox process could bind is not
// the init's relay: it may not name its binary, so it is refused before the
// proxy sees it, and the audit has nothing of it.
TEST_P(VmSandbox, AnEgressConnectionFromAnUnreservedPortIsRefused) {
  Result r = create("e3", "egress_guest_unreserved", false);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  const std::string log = logs("e3");
  EXPECT_THAT(log, HasSubstr("refused a guest connection to host port 3128 from guest port 5000"));
  EXPECT_THAT(log, HasSubstr("closed"));
  EXPECT_THAT(log, Not(HasSubstr("HTTP/1.1")));
  EXPECT_THAT(audit("e3"), Not(HasSubstr("blocked.invalid")));
}

// A stopped VM's files are reached through a VM of its own: the copy
// supervisor boots the sandbox's kernel and disks with no main process and
// no network, and relays the one tar of the copy to the guest's init. The
// crafted guest answers every command with a tar of hello.txt, as tar -c
// in a guest would; the sandbox's record (phase, exit, log) is untouched,
// and nothing of the copy is left.
TEST_P(VmSandbox, AStoppedVmsFilesAreCopiedThroughAVmOfItsOwn) {
  ASSERT_EQ(create("c1", "copy_guest", true).status, 0);
  ASSERT_TRUE(wait_phase("c1", "Ready"));
  ASSERT_EQ(os({"sandbox", "stop", "c1"}).status, 0);
  ASSERT_TRUE(wait_phase("c1", "Stopped"));
  const std::string id = field("c1", "id");
  const std::string exit_code = field("c1", "exit_code");
  const std::string log_before = logs("c1");
  const std::string dir = home_ + "/sandboxes/" + id;
  // The copy's supervisor and its VMM end a moment after the copy's answer.
  auto nothing_left = [&] {
    for (int i = 0; i < 100; ++i) {
      if (processes_matching(id).empty() && !std::filesystem::exists(dir + "/vm-config.cpio"))
        return true;
      ::usleep(100 * 1000);
    }
    return false;
  };

  const std::string down = scratch() + "/c1-hello.txt";
  Result r = os({"sandbox", "download", "c1", "/sandbox/hello.txt", down});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_EQ(file_contents(down), "from the guest's layer\n");
  EXPECT_EQ(phase("c1"), "Stopped");
  EXPECT_EQ(field("c1", "exit_code"), exit_code);
  EXPECT_EQ(logs("c1"), log_before) << "the copy's console is not the sandbox's log";
  EXPECT_TRUE(nothing_left());

  // An upload reaches the guest's tar the same way (the crafted one says 0).
  const std::string up = write_file(scratch() + "/c1-up.txt", "up\n");
  r = os({"sandbox", "upload", "c1", up, "/sandbox"});
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  // What the guest's kernel holds in memory would be lost at power-off.
  r = os({"sandbox", "upload", "c1", up, "/dev/../dev/shm"});
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("the guest kernel's /dev")) << r.err;
  EXPECT_EQ(phase("c1"), "Stopped");
  EXPECT_TRUE(nothing_left());

  // The sandbox starts again once its copies are done.
  ASSERT_EQ(os({"sandbox", "start", "c1"}).status, 0);
  EXPECT_TRUE(wait_phase("c1", "Ready"));
}

// The whole path with a real Linux guest: the built kernel boots to our
// init, which runs the main process from the image's disk; exec, the
// network policy through the proxy over vsock, stop and start with the
// layer kept, delete. Only where KVM is hardware-backed: Linux does not
// boot on this machine's PVM.
TEST_P(VmSandbox, ALinuxGuestRunsTheSandboxEndToEnd) {
  if (!hardware_kvm())
    GTEST_SKIP() << "needs hardware KVM (vmx/svm in /proc/cpuinfo); /dev/kvm here is PVM, on "
                    "which Linux guests do not boot";
  const char* built = std::getenv("OSH_GUEST_KERNEL");
  if (!built || !*built || ::access(built, R_OK) != 0)
    GTEST_SKIP() << "no guest kernel: OSH_GUEST_KERNEL names one (rootfs-tools/build-guest-kernel)";
  const std::string kernel_copy = scratch() + "/vm-linux";
  std::filesystem::copy_file(built, kernel_copy, std::filesystem::copy_options::overwrite_existing);
  ::chmod(kernel_copy.c_str(), 0644);
  TestServer server;
  const std::string policy = write_file(
      scratch() + "/vm-linux.toml",
      "version = 1\n[network_policies.local]\nendpoints = [ { host = \"localhost\", port = " +
          std::to_string(server.port()) + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  Result r = os({"sandbox", "create", "--name", "linux", "--from", "bb", "--vm", "--vm-kernel",
                 kernel_copy, "--memory", "256M", "--policy", policy, "-d", "--", "sleep", "600"});
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(wait_phase("linux", "Ready", 60000)) << logs("linux");
  r = os({"sandbox", "exec", "linux", "--", "sh", "-c", "echo hi; uname -s; exit 3"});
  EXPECT_EQ(r.status, 3);
  EXPECT_EQ(r.out, "hi\nLinux\n");
  // Through the guest init's relay, vsock and the supervisor's proxy.
  r = os({"sandbox", "exec", "linux", "--", "wget", "-q", "-O", "-",
          "http://localhost:" + std::to_string(server.port()) + "/"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("hello from the test server"));
  r = os({"sandbox", "exec", "linux", "--", "wget", "-q", "-O", "-", "http://blocked.invalid/"});
  EXPECT_NE(r.status, 0);
  ASSERT_EQ(os({"sandbox", "exec", "linux", "--", "sh", "-c", "echo kept > /sandbox/f"}).status, 0);
  ASSERT_EQ(os({"sandbox", "stop", "linux"}).status, 0);
  ASSERT_TRUE(wait_phase("linux", "Stopped"));
  // A stopped VM's files, through a copy's VM: what it wrote comes down,
  // and an upload is there at the next start.
  const std::string down = scratch() + "/vm-linux-f";
  r = os({"sandbox", "download", "linux", "/sandbox/f", down});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(file_contents(down), "kept\n");
  const std::string up = write_file(scratch() + "/vm-linux-up", "uploaded\n");
  r = os({"sandbox", "upload", "linux", up, "/sandbox"});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(phase("linux"), "Stopped");
  ASSERT_EQ(os({"sandbox", "start", "linux"}).status, 0);
  ASSERT_TRUE(wait_phase("linux", "Ready", 60000));
  r = os({"sandbox", "exec", "linux", "--", "cat", "/sandbox/f", "/sandbox/vm-linux-up"});
  EXPECT_EQ(r.out, "kept\nuploaded\n");
  const std::string id = field("linux", "id");
  ASSERT_EQ(os({"sandbox", "delete", "linux"}).status, 0);
  EXPECT_TRUE(vmms_of(id).empty());
}

E2E_ALL_MODES(VmSandbox);

}  // namespace
}  // namespace e2e
