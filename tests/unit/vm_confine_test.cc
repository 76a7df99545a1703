// The VMM's confinement: each thread kind's seccomp filter kills what that
// thread must not do (tried in a forked child, which the filter kills
// with SIGSYS), and a fully confined VMM still runs a guest.
#include <fcntl.h>
#include <linux/capability.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "vm/confine.h"
#include "vm/kvm.h"
#include "vm/vm.h"
#include "vm_guest.h"

namespace openshell::vm::confine {
namespace {

// Runs `body` in a child (no core file) and returns its wait status.
int in_child(const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    const rlimit no_core{0, 0};
    ::setrlimit(RLIMIT_CORE, &no_core);
    ::_exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return status;
}

const timespec kNoWait{0, 0};

bool killed_by_sigsys(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGSYS; }

// Under `thread`'s filter: `allowed` must succeed (exit 0 else 2), then
// `forbidden` must not return (exit 3 if it does).
int under_filter(Thread thread, const std::function<bool()>& allowed,
                 const std::function<void()>& forbidden) {
  return in_child([&] {
    if (!install_filter(thread).empty()) return 1;
    if (!allowed()) return 2;
    forbidden();
    return 3;
  });
}

TEST(VmConfine, VcpuFilterAllowsKvmRunAndKillsAnOpen) {
  const int status = under_filter(
      Thread::kVcpu, [] { return ::ioctl(-1, KVM_RUN, 0) == -1 && errno == EBADF; },
      [] { ::syscall(SYS_openat, AT_FDCWD, "/etc/hostname", O_RDONLY); });
  EXPECT_TRUE(killed_by_sigsys(status)) << "wait status " << status;
}

TEST(VmConfine, VcpuFilterKillsEveryOtherKvmIoctl) {
  for (unsigned long request :
       {static_cast<unsigned long>(KVM_CREATE_VM), static_cast<unsigned long>(KVM_SET_SREGS),
        static_cast<unsigned long>(KVM_SET_USER_MEMORY_REGION)}) {
    const int status = under_filter(
        Thread::kVcpu, [] { return true; }, [request] { ::ioctl(-1, request, 0); });
    EXPECT_TRUE(killed_by_sigsys(status)) << "ioctl " << request << ": wait status " << status;
  }
}

TEST(VmConfine, VcpuFilterKillsExecutableMappings) {
  const int status = under_filter(
      Thread::kVcpu,
      [] {
        void* data =
            ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        return data != MAP_FAILED && ::munmap(data, 4096) == 0;
      },
      [] { ::mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); });
  EXPECT_TRUE(killed_by_sigsys(status)) << "wait status " << status;
}

TEST(VmConfine, VcpuFilterKillsThreadCreationAndExec) {
  EXPECT_TRUE(killed_by_sigsys(under_filter(
      Thread::kVcpu, [] { return true; }, [] { ::syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0); })));
  EXPECT_TRUE(killed_by_sigsys(under_filter(
      Thread::kVcpu, [] { return true; },
      [] {
        char* const argv[] = {const_cast<char*>("/bin/true"), nullptr};
        ::execve("/bin/true", argv, nullptr);
      })));
}

TEST(VmConfine, MainFilterKillsIoctlsAndSockets) {
  EXPECT_TRUE(killed_by_sigsys(under_filter(
      Thread::kMain, [] { return ::close(::dup(1)) == 0 || true; },
      [] { ::ioctl(-1, KVM_RUN, 0); })));
  EXPECT_TRUE(killed_by_sigsys(under_filter(
      Thread::kMain, [] { return true; }, [] { ::socket(AF_INET, SOCK_STREAM, 0); })));
}

TEST(VmConfine, DeviceFilterAllowsPreadAndKillsOpen) {
  const int fd = ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  const int status = under_filter(
      Thread::kDevice,
      [fd] {
        char byte = 0;
        return ::pread(fd, &byte, 1, 0) == 1;
      },
      [] { ::syscall(SYS_openat, AT_FDCWD, "/etc/hostname", O_RDONLY); });
  ::close(fd);
  EXPECT_TRUE(killed_by_sigsys(status)) << "wait status " << status;
}

TEST(VmConfine, TheFilterIsTheInstallingThreadsAlone) {
  // A vCPU filter on one thread leaves the others free: the main thread of
  // the child still opens a file after its vCPU thread installed one.
  const int status = in_child([] {
    std::string why = "not run";
    std::thread vcpu([&] { why = install_filter(Thread::kVcpu); });
    vcpu.join();
    if (!why.empty()) return 1;
    const int fd = ::open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    return fd >= 0 ? 0 : 2;
  });
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "wait status " << status;
}

// The whole order of confine.h in a child: a VM created, the process
// confined, the vCPU under its filter, the main thread under its own; the
// guest runs to its reset. The child reports on a pipe.
TEST(VmConfine, AConfinedVmmRunsAGuest) {
  OSH_REQUIRE_KVM(kvm);
  const std::vector<uint8_t> guest = testing::read_guest("long_hello");
  int report[2];
  ASSERT_EQ(::pipe2(report, O_CLOEXEC), 0);
  const int status = in_child([&] {
    ::close(report[0]);
    auto say = [&](const std::string& text) {
      return ::write(report[1], text.data(), text.size()) >= 0;
    };
    try {
      GuestMemory memory = GuestMemory::create(4 << 20);
      memory.write(layout::kKernelStart, guest.data(), guest.size());
      auto serial = std::make_shared<std::string>();
      VmOptions options;
      options.serial_sink = [serial](const char* data, size_t length) {
        serial->append(data, length);
      };
      options.on_vcpu_thread = vcpu_thread_hook();
      auto vm = Vm::create(*kvm, std::move(memory), options);
      vm->set_entry(0, {CpuEntry::Mode::kLong, layout::kKernelStart, layout::kBootStack, 0, 0, 0});
      confine_process();

      std::string facts;
      __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
      __user_cap_data_struct caps[2] = {};
      ::syscall(SYS_capget, &header, caps);
      facts +=
          (caps[0].effective | caps[1].effective | caps[0].permitted) == 0 ? "no-caps " : "caps ";
      facts += ::access("/etc/passwd", F_OK) != 0 && errno == ENOENT ? "empty-root " : "host-root ";
      facts += ::prctl(PR_GET_DUMPABLE, 0, 0, 0, 0) == 0 ? "not-dumpable " : "dumpable ";
      facts += ::prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0) == 1 ? "nnp" : "no-nnp";

      vm->start();
      if (const std::string why = install_filter(Thread::kMain); !why.empty())
        return say(why) ? 4 : 5;
      const VmEnd end = vm->wait(5000);
      say(facts + "|" + *serial + "|" + end_reason_name(end.reason) + ": " + end.detail);
      vm.reset();
      return 0;
    } catch (const Error& e) {
      say(std::string("error: ") + e.what());
      return 6;
    }
  });
  ::close(report[1]);
  std::string text;
  char buffer[512];
  for (ssize_t n; (n = ::read(report[0], buffer, sizeof buffer)) > 0;)
    text.append(buffer, static_cast<size_t>(n));
  ::close(report[0]);
  ASSERT_TRUE(WIFEXITED(status)) << "the confined VMM died: wait status " << status
                                 << "; it said: " << text;
  EXPECT_EQ(WEXITSTATUS(status), 0) << text;
  EXPECT_EQ(text,
            "no-caps empty-root not-dumpable nnp|long hypervisor\n|guest reset: the guest asked "
            "for a reset");
}

}  // namespace
}  // namespace openshell::vm::confine
