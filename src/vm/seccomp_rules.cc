#include "vm/seccomp_rules.h"

#include <linux/kvm.h>

namespace openshell::vm::seccomp_rules {

namespace {

// Every thread: memory for the C++ runtime (never executable), locks,
// signals (the vCPU kick), time, its own end, and writing to the file
// descriptors it holds (the serial log, eventfds).
std::vector<const char*> common() {
  return {"read",
          "write",
          "readv",
          "writev",
          "futex",
          "brk",
          "munmap",
          "madvise",
          "mremap",
          "rt_sigreturn",
          "rt_sigprocmask",
          "sigaltstack",
          "exit",
          "exit_group",
          "getpid",
          "gettid",
          "tgkill",
          "clock_gettime",
          "clock_nanosleep",
          "nanosleep",
          "sched_yield",
          "restart_syscall",
          "getrandom"};
}

std::vector<const char*> with(std::vector<const char*> names,
                              std::initializer_list<const char*> more) {
  names.insert(names.end(), more);
  return names;
}

}  // namespace

const ThreadRules& rules(Thread thread) {
  // A vCPU thread runs KVM_RUN and answers the exits in-process: no file
  // is opened or closed, no socket touched, no other KVM ioctl.
  static const ThreadRules vcpu{"vcpu", common(), {"mmap", "mprotect"}, {KVM_RUN}};
  // The main thread waits for the VM's end and joins the vCPU threads;
  // it polls the descriptors it already holds, and serves the channel to
  // the supervisor (runner.cc): recvmsg and sendmsg on it, the fds passed
  // up then closed, an eventfd read. It makes no socket: a connect's pair
  // is made on the vsock device's thread (VirtioVsock::connect_later).
  static const ThreadRules main{"main",
                                with(common(), {"close", "ppoll", "poll", "epoll_wait",
                                                "epoll_pwait", "epoll_ctl", "recvmsg", "sendmsg"}),
                                {"mmap", "mprotect"},
                                {}};
  // A device's thread: its queue's eventfds, its backing file (virtio-blk)
  // and its socket to the supervisor (virtio-vsock): a guest's connection
  // to a host port makes a socket pair there, and a guest's shutdown is
  // passed on with shutdown(2).
  static const ThreadRules device{
      "device",
      with(common(), {"close", "ppoll", "poll", "epoll_wait", "epoll_pwait", "epoll_ctl", "pread64",
                      "pwrite64", "preadv", "pwritev", "fsync", "fdatasync", "fallocate", "recvmsg",
                      "sendmsg", "recvfrom", "sendto", "socketpair", "shutdown"}),
      {"mmap", "mprotect"},
      {}};
  switch (thread) {
    case Thread::kVcpu:
      return vcpu;
    case Thread::kDevice:
      return device;
    case Thread::kMain:
      break;
  }
  return main;
}

}  // namespace openshell::vm::seccomp_rules
