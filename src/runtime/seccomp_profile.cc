#include "runtime/seccomp_profile.h"

namespace openshell::runtime::seccomp_profile {

// clang-format off
const Syscall kAllowed[] = {
  {"accept"}, {"accept4"}, {"access"}, {"adjtimex"}, {"alarm"}, {"arch_prctl"}, {"bind"},
  {"brk"}, {"capget"}, {"capset"}, {"chdir"}, {"chmod"}, {"chown"}, {"chown32"},
  {"clock_adjtime"}, {"clock_getres"}, {"clock_gettime"}, {"clock_nanosleep"}, {"close"},
  {"close_range"}, {"connect"}, {"copy_file_range"}, {"creat"}, {"dup"}, {"dup2"}, {"dup3"},
  {"epoll_create"}, {"epoll_create1"}, {"epoll_ctl"}, {"epoll_ctl_old"}, {"epoll_pwait"},
  {"epoll_pwait2"}, {"epoll_wait"}, {"epoll_wait_old"}, {"eventfd"}, {"eventfd2"},
  {"execve"}, {"execveat"}, {"exit"}, {"exit_group"}, {"faccessat"}, {"faccessat2"},
  {"fadvise64"}, {"fallocate"}, {"fanotify_mark"}, {"fchdir"}, {"fchmod"}, {"fchmodat"},
  {"fchown"}, {"fchownat"}, {"fcntl"}, {"fdatasync"}, {"fgetxattr"}, {"flistxattr"},
  {"flock"}, {"fork"}, {"fremovexattr"}, {"fsetxattr"}, {"fstat"}, {"fstatfs"}, {"fsync"},
  {"ftruncate"}, {"futex"}, {"futex_waitv"}, {"futimesat"}, {"get_mempolicy"},
  {"get_robust_list"}, {"get_thread_area"}, {"getcpu"}, {"getcwd"}, {"getdents"},
  {"getdents64"}, {"getegid"}, {"geteuid"}, {"getgid"}, {"getgroups"}, {"getitimer"},
  {"getpeername"}, {"getpgid"}, {"getpgrp"}, {"getpid"}, {"getppid"}, {"getpriority"},
  {"getrandom"}, {"getresgid"}, {"getresuid"}, {"getrlimit"}, {"getrusage"}, {"getsid"},
  {"getsockname"}, {"getsockopt"}, {"gettid"}, {"gettimeofday"}, {"getuid"}, {"getxattr"},
  {"inotify_add_watch"}, {"inotify_init"}, {"inotify_init1"}, {"inotify_rm_watch"},
  {"io_cancel"}, {"io_destroy"}, {"io_getevents"}, {"io_pgetevents"}, {"io_setup"},
  {"io_submit"}, {"ioprio_get"}, {"ioprio_set"}, {"kill"}, {"landlock_add_rule"},
  {"landlock_create_ruleset"}, {"landlock_restrict_self"}, {"lchown"}, {"lgetxattr"},
  {"link"}, {"linkat"}, {"listen"}, {"listxattr"}, {"llistxattr"}, {"lremovexattr"},
  {"lseek"}, {"lsetxattr"}, {"lstat"}, {"madvise"}, {"membarrier"}, {"memfd_create"},
  {"memfd_secret"}, {"mincore"}, {"mkdir"}, {"mkdirat"}, {"mknod"}, {"mknodat"}, {"mlock"},
  {"mlock2"}, {"mlockall"}, {"mmap"}, {"mprotect"}, {"mq_getsetattr"}, {"mq_notify"},
  {"mq_open"}, {"mq_timedreceive"}, {"mq_timedsend"}, {"mq_unlink"}, {"mremap"},
  {"msgctl"}, {"msgget"}, {"msgrcv"}, {"msgsnd"}, {"msync"}, {"munlock"}, {"munlockall"},
  {"munmap"}, {"nanosleep"}, {"newfstatat"}, {"open"}, {"openat"}, {"openat2"}, {"pause"},
  {"pidfd_open"}, {"pidfd_send_signal"}, {"pipe"}, {"pipe2"}, {"pkey_alloc"},
  {"pkey_free"}, {"pkey_mprotect"}, {"poll"}, {"ppoll"}, {"prctl"}, {"pread64"},
  {"preadv"}, {"preadv2"}, {"prlimit64"}, {"process_mrelease"}, {"pselect6"},
  {"pwrite64"}, {"pwritev"}, {"pwritev2"}, {"read"}, {"readahead"}, {"readlink"},
  {"readlinkat"}, {"readv"}, {"recvfrom"}, {"recvmmsg"}, {"recvmsg"}, {"remap_file_pages"},
  {"removexattr"}, {"rename"}, {"renameat"}, {"renameat2"}, {"restart_syscall"}, {"rmdir"},
  {"rseq"}, {"rt_sigaction"}, {"rt_sigpending"}, {"rt_sigprocmask"}, {"rt_sigqueueinfo"},
  {"rt_sigreturn"}, {"rt_sigsuspend"}, {"rt_sigtimedwait"}, {"rt_tgsigqueueinfo"},
  {"sched_get_priority_max"}, {"sched_get_priority_min"}, {"sched_getaffinity"},
  {"sched_getattr"}, {"sched_getparam"}, {"sched_getscheduler"}, {"sched_rr_get_interval"},
  {"sched_setaffinity"}, {"sched_setattr"}, {"sched_setparam"}, {"sched_setscheduler"},
  {"sched_yield"}, {"seccomp"}, {"select"}, {"semctl"}, {"semget"}, {"semop"},
  {"semtimedop"}, {"sendfile"}, {"sendmmsg"}, {"sendmsg"}, {"sendto"}, {"set_robust_list"},
  {"set_thread_area"}, {"set_tid_address"}, {"setfsgid"}, {"setfsuid"}, {"setgid"},
  {"setgroups"}, {"setitimer"}, {"setpgid"}, {"setpriority"}, {"setregid"}, {"setresgid"},
  {"setresuid"}, {"setreuid"}, {"setrlimit"}, {"setsid"}, {"setsockopt"}, {"setuid"},
  {"setxattr"}, {"shmat"}, {"shmctl"}, {"shmdt"}, {"shmget"}, {"shutdown"}, {"sigaltstack"},
  {"signalfd"}, {"signalfd4"}, {"splice"}, {"stat"}, {"statfs"}, {"statx"},
  {"symlink"}, {"symlinkat"}, {"sync"}, {"sync_file_range"}, {"syncfs"}, {"sysinfo"},
  {"tee"}, {"tgkill"}, {"time"}, {"timer_create"}, {"timer_delete"}, {"timer_getoverrun"},
  {"timer_gettime"}, {"timer_settime"}, {"timerfd_create"}, {"timerfd_gettime"},
  {"timerfd_settime"}, {"times"}, {"tkill"}, {"truncate"}, {"umask"}, {"uname"}, {"unlink"},
  {"unlinkat"}, {"utime"}, {"utimensat"}, {"utimes"}, {"vfork"}, {"vmsplice"}, {"wait4"},
  {"waitid"}, {"write"}, {"writev"},
  // Newer than libseccomp 2.5's table: by number.
  {"cachestat", 451}, {"fchmodat2", 452}, {"map_shadow_stack", 453}, {"futex_wake", 454},
  {"futex_wait", 455}, {"futex_requeue", 456}, {"mseal", 462}, {"setxattrat", 463},
  {"getxattrat", 464}, {"listxattrat", 465}, {"removexattrat", 466}, {"file_getattr", 468},
  {"file_setattr", 469},
};
const int kAllowedCount = sizeof kAllowed / sizeof kAllowed[0];

const Syscall kRefused[] = {
  // Mounts and the root: the sandbox's view of files is fixed.
  {"mount"}, {"umount"}, {"umount2"}, {"pivot_root"}, {"chroot"}, {"move_mount"},
  {"open_tree"}, {"fsopen"}, {"fsconfig"}, {"fsmount"}, {"fspick"}, {"mount_setattr"},
  {"open_tree_attr", 467}, {"statmount", 457}, {"listmount", 458},
  // Namespaces.
  {"setns"},
  // Kernel keyrings, BPF, perf, tracing and other processes' memory.
  {"keyctl"}, {"add_key"}, {"request_key"}, {"bpf"}, {"perf_event_open"}, {"ptrace"},
  {"process_vm_readv"}, {"process_vm_writev"}, {"process_madvise"}, {"kcmp"},
  {"pidfd_getfd"}, {"userfaultfd"}, {"lookup_dcookie"},
  // io_uring runs system calls that a filter never sees.
  {"io_uring_setup"}, {"io_uring_enter"}, {"io_uring_register"},
  // The kernel itself.
  {"kexec_load"}, {"kexec_file_load"}, {"init_module"}, {"finit_module"},
  {"delete_module"}, {"create_module"}, {"get_kernel_syms"}, {"query_module"},
  {"reboot"}, {"swapon"}, {"swapoff"}, {"acct"}, {"quotactl"}, {"quotactl_fd"},
  {"syslog"}, {"vhangup"}, {"iopl"}, {"ioperm"}, {"modify_ldt"}, {"uselib"}, {"ustat"},
  {"sysfs"}, {"_sysctl"}, {"nfsservctl"}, {"settimeofday"}, {"clock_settime"},
  {"stime"}, {"sethostname"}, {"setdomainname"}, {"fanotify_init"},
  {"open_by_handle_at"}, {"name_to_handle_at"}, {"move_pages"}, {"migrate_pages"},
  {"mbind"}, {"set_mempolicy"}, {"set_mempolicy_home_node"}, {"vm86"}, {"vm86old"},
  {"lsm_get_self_attr", 459}, {"lsm_set_self_attr", 460}, {"lsm_list_modules", 461},
  {"tuxcall"}, {"security"}, {"afs_syscall"}, {"putpmsg"}, {"getpmsg"},
  // Allowed with conditions (see the generator): listed so they are known.
  {"clone"}, {"unshare"}, {"socket"}, {"socketpair"}, {"ioctl"}, {"personality"},
};
const int kRefusedCount = sizeof kRefused / sizeof kRefused[0];

const Syscall kUnavailable[] = {
  {"clone3"},
};
const int kUnavailableCount = sizeof kUnavailable / sizeof kUnavailable[0];
// clang-format on

}  // namespace openshell::runtime::seccomp_profile
