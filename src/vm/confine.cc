#include "vm/confine.h"

#include <fcntl.h>
#include <linux/capability.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "base/error.h"
#include "vmm_seccomp.h"

namespace openshell::vm::confine {

namespace {

struct Program {
  const sock_filter* filter;
  size_t length;
};

Program program(Thread thread) {
  switch (thread) {
    case Thread::kVcpu:
      return {generated::k_vcpu_filter, sizeof generated::k_vcpu_filter / sizeof(sock_filter)};
    case Thread::kDevice:
      return {generated::k_device_filter, sizeof generated::k_device_filter / sizeof(sock_filter)};
    case Thread::kMain:
      break;
  }
  return {generated::k_main_filter, sizeof generated::k_main_filter / sizeof(sock_filter)};
}

// An empty tmpfs as the root, read-only: the VMM opens no file after this.
// The tmpfs is mounted over /tmp inside the new mount namespace, so
// nothing outside sees it and nothing is left behind.
void empty_root() {
  if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
    throw_errno("confining the VMM: make / private");
  if (::mount("openshell-vmm", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=16k,mode=0700") != 0)
    throw_errno("confining the VMM: mount an empty tmpfs");
  if (::mkdir("/tmp/old", 0700) != 0) throw_errno("confining the VMM: mkdir in the empty root");
  if (::syscall(SYS_pivot_root, "/tmp", "/tmp/old") != 0)
    throw_errno("confining the VMM: pivot_root");
  if (::chdir("/") != 0) throw_errno("confining the VMM: chdir /");
  if (::umount2("/old", MNT_DETACH) != 0) throw_errno("confining the VMM: detach the old root");
  if (::rmdir("/old") != 0) throw_errno("confining the VMM: rmdir /old");
  if (::mount(nullptr, "/", nullptr,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
    throw_errno("confining the VMM: remount the root read-only");
}

// Inside its user namespace the VMM is an ordinary id (not 0): whatever it
// executed would get no capabilities. The map names the one outer id it has.
constexpr unsigned kInsideId = 1000;

void write_file(const char* path, const std::string& text) {
  const int fd = ::open(path, O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw_errno(std::string("confining the VMM: open ") + path);
  const ssize_t n = ::write(fd, text.data(), text.size());
  const int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    throw_errno(std::string("confining the VMM: write ") + path, err);
}

void map_ids(uid_t uid, gid_t gid) {
  write_file("/proc/self/setgroups", "deny");
  write_file("/proc/self/uid_map", std::to_string(kInsideId) + " " + std::to_string(uid) + " 1\n");
  write_file("/proc/self/gid_map", std::to_string(kInsideId) + " " + std::to_string(gid) + " 1\n");
}

void drop_capabilities() {
  for (int cap = 0; cap <= 63; ++cap) {
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0) {
      if (errno == EINVAL) break;  // past the kernel's last capability
      throw_errno("confining the VMM: drop capability " + std::to_string(cap) +
                  " from the bounding set");
    }
  }
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
    throw_errno("confining the VMM: clear the ambient capabilities");
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capset, &header, data) != 0) throw_errno("confining the VMM: capset");
}

}  // namespace

void confine_process() {
  const pid_t parent = ::getppid();
  const uid_t uid = ::geteuid();
  const gid_t gid = ::getegid();
  if (::unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS) != 0)
    throw_errno("confining the VMM: unshare its namespaces");
  map_ids(uid, gid);
  // Not dumpable from here on: no core file, no ptrace by its uid, its
  // /proc files owned by root. (After the id maps: writing them needs a
  // dumpable process.)
  if (::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0) throw_errno("confining the VMM: PR_SET_DUMPABLE");
  empty_root();
  drop_capabilities();
  // The VMM dies with its parent (the supervisor, or whoever ran __vmm):
  // set after every change of credentials, which would clear it.
  if (::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
    throw_errno("confining the VMM: PR_SET_PDEATHSIG");
  if (::getppid() != parent) throw Error("confining the VMM: its parent is gone");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) throw_errno("confining the VMM: no_new_privs");
}

std::string install_filter(Thread thread) {
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return errno_message("no_new_privs", errno);
  const Program p = program(thread);
  sock_fprog prog{static_cast<unsigned short>(p.length), const_cast<sock_filter*>(p.filter)};
  // No SECCOMP_FILTER_FLAG_TSYNC: the filter is this thread's alone.
  if (::syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0)
    return errno_message("seccomp", errno);
  return "";
}

std::function<std::string(uint32_t)> vcpu_thread_hook() {
  return [](uint32_t) { return install_filter(Thread::kVcpu); };
}

}  // namespace openshell::vm::confine
