// PID 1 of a sandbox: runs the main process (or, without one, just waits),
// starts the processes its owner asks for over the control channel, passes
// signals on, reaps orphans, and exits with the main process's status. It
// runs from a sealed image of this binary (see MountPlan::apply), already
// confined like everything else in the sandbox.
#include "runtime/init.h"

#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>

#include "base/child_failure.h"
#include "base/error.h"
#include "base/unique_fd.h"
#include "runtime/caps.h"
#include "runtime/init_protocol.h"

namespace openshell::runtime {

namespace {

int parse_fd(const char* text) {
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  if (!end || *end != '\0' || value < -1 || value > 65535) return -2;
  return static_cast<int>(value);
}

void report(int fd, int err, const char* what, const char* detail, int code) {
  if (fd < 0) return;
  ChildFailure f;
  child::fail(&f, err, what, detail, code);
  ssize_t ignored = ::write(fd, &f, sizeof f);
  (void)ignored;
}

int encode_status(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return exit_code::kFailure;
}

int exec_failure_code(int err) {
  return err == ENOENT || err == ENOTDIR ? exit_code::kNotFound : exit_code::kCannotExecute;
}

// What a child of the init is given beyond its command: the ids it runs as
// (none: the init's) and the capabilities it keeps (none given: all the init
// has, which are then exactly the main process's).
struct ChildPrivileges {
  const ExecUser* user = nullptr;
  const caps::Set* keep = nullptr;
  int last_cap = 0;
};

// The signals the init was started with ignored (SIGPIPE, say), found
// once: its children get their default dispositions back.
sigset_t inherited_ignored;

void find_ignored_signals() {
  sigemptyset(&inherited_ignored);
  for (int sig = 1; sig < NSIG; ++sig) {
    struct sigaction old {};
    if (sig != SIGKILL && sig != SIGSTOP && ::sigaction(sig, nullptr, &old) == 0 &&
        old.sa_handler == SIG_IGN)
      sigaddset(&inherited_ignored, sig);
  }
}

// Async-signal-safe: the ids, then the capabilities; an errno on failure.
int set_privileges(const ChildPrivileges& p, const char** what) {
  if (p.user) {
    // Kept across the change, dropped below to what the child keeps.
    if (::prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) return *what = "PR_SET_KEEPCAPS", errno;
    gid_t gid = p.user->gid;
    // A sandbox of one id denies setgroups: its processes keep no group of
    // another's anyway.
    // The system calls themselves: the child may share the init's memory
    // (vfork), and libc's wrappers would act for every thread of a process.
    if (::syscall(SYS_setgroups, 1, &gid) != 0 && errno != EPERM) return *what = "setgroups", errno;
    if (::syscall(SYS_setresgid, gid, gid, gid) != 0) return *what = "setresgid", errno;
    if (::syscall(SYS_setresuid, p.user->uid, p.user->uid, p.user->uid) != 0)
      return *what = "setresuid", errno;
  }
  if (p.keep) {
    ChildFailure failure;
    if (!caps::set_final(*p.keep, p.last_cap, &failure))
      return *what = "set the capabilities", failure.err;
  }
  return 0;
}

// In a freshly forked child: default signal handling, stdio set up (and
// `extra` fds as 3, 4, ...), the ids and capabilities, then exec. On
// failure writes the errno to error_fd and exits.
[[noreturn]] void exec_child(char* const* argv, char* const* envp, int tty_fd, const int* stdio,
                             const char* workdir, int error_fd, int report_fd,
                             const ChildPrivileges& privileges, const int* extra = nullptr,
                             int n_extra = 0) {
  sigset_t none;
  sigemptyset(&none);
  // The init installs no handler (an exec resets those anyway): only what
  // it inherited ignored needs its default back.
  for (int sig = 1; sig < NSIG; ++sig)
    if (sigismember(&inherited_ignored, sig) == 1) ::signal(sig, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  int err = 0;
  if (tty_fd >= 0) {
    // Its own session, with the pty as controlling terminal and stdio.
    if (::setsid() < 0 || ::ioctl(tty_fd, TIOCSCTTY, 0) != 0) err = errno;
    for (int i = 0; i < 3 && !err; ++i)
      if (::dup2(tty_fd, i) < 0) err = errno;
    if (tty_fd > 2) ::close(tty_fd);
  } else {
    // Its own process group: signals go to the whole job.
    ::setpgid(0, 0);
    for (int i = 0; i < 3 && stdio && !err; ++i)
      if (stdio[i] >= 0 && stdio[i] != i && ::dup2(stdio[i], i) < 0) err = errno;
  }
  // The extra fds at 3, 4, ...: first everything this child still uses
  // (and the extras themselves) above where they go, then each in place.
  const int above = 3 + n_extra;
  if (n_extra > 0 && !err) {
    auto lift = [&](int* fd) {
      if (*fd < 0 || *fd >= above) return;
      int moved = ::fcntl(*fd, F_DUPFD_CLOEXEC, above);
      if (moved < 0) err = errno;
      *fd = moved;
    };
    lift(&error_fd);
    lift(&report_fd);
    int lifted[kMaxExtraFds];
    for (int i = 0; i < n_extra && i < kMaxExtraFds && !err; ++i) {
      lifted[i] = ::fcntl(extra[i], F_DUPFD_CLOEXEC, above);
      if (lifted[i] < 0) err = errno;
    }
    for (int i = 0; i < n_extra && i < kMaxExtraFds && !err; ++i)
      if (::dup2(lifted[i], 3 + i) < 0) err = errno;
  }
  const char* what = "set up the process";
  if (!err) err = set_privileges(privileges, &what);
  if (!err && workdir && ::chdir(workdir) != 0) err = errno, what = "set up the process";
  if (err) {
    int code = exit_code::kFailure;
    if (error_fd >= 0) {
      int message[2] = {err, code};
      ssize_t ignored = ::write(error_fd, message, sizeof message);
      (void)ignored;
    }
    report(report_fd, err, what, nullptr, code);
    ::_exit(code);
  }
  // Everything beyond stdio (and the extras) closes on exec, the error
  // channels included.
  ::close_range(static_cast<unsigned>(above), ~0U, CLOSE_RANGE_CLOEXEC);
  if (envp)
    ::execvpe(argv[0], argv, envp);
  else
    ::execvp(argv[0], argv);
  err = errno;
  int code = exec_failure_code(err);
  if (error_fd >= 0) {
    int message[2] = {err, code};
    ssize_t ignored = ::write(error_fd, message, sizeof message);
    (void)ignored;
  }
  report(report_fd, err, "cannot run", argv[0], code);
  ::_exit(code);
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

class Init {
 public:
  Init(int report_fd, int life_fd, int tty_fd, int control_fd, std::optional<caps::Set> child_caps,
       bool orphan)
      : orphan_(orphan),
        report_fd_(report_fd),
        life_fd_(life_fd),
        tty_fd_(tty_fd),
        control_fd_(control_fd),
        child_caps_(child_caps) {}

  int run(char** command) {
    // Nothing in the sandbox may open /proc/1/mem, /proc/1/exe and the like.
    ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
    // An orphan's parent is the engine's, which ends soon (oci create).
    if (!orphan_) ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    for (int fd : {report_fd_, life_fd_, tty_fd_, control_fd_})
      if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);
    find_ignored_signals();

    // Every signal is read from a signalfd; for PID 1 a blocked signal from
    // the parent namespace is queued, where an unhandled one would be dropped.
    sigset_t all;
    sigfillset(&all);
    ::sigprocmask(SIG_BLOCK, &all, nullptr);
    signals_ = ::signalfd(-1, &all, SFD_CLOEXEC);
    if (signals_ < 0) {
      report(report_fd_, errno, "signalfd", nullptr, exit_code::kFailure);
      return exit_code::kFailure;
    }

    if (command[0]) {
      main_pid_ = ::fork();
      if (main_pid_ < 0) {
        report(report_fd_, errno, "fork the main process", nullptr, exit_code::kFailure);
        return exit_code::kFailure;
      }
      if (main_pid_ == 0)
        exec_child(command, nullptr, tty_fd_, nullptr, nullptr, -1, report_fd_,
                   privileges(nullptr));
    }
    // The report pipe's last copy goes with the main process's exec: its EOF
    // tells the owner that the sandbox runs.
    if (report_fd_ >= 0) ::close(report_fd_);
    // Without a main process yet, the terminal waits for it ("main").
    if (tty_fd_ >= 0 && command[0]) {
      ::close(tty_fd_);
      tty_fd_ = -1;
    }
    return loop();
  }

 private:
  int loop() {
    pollfd fds[3] = {{signals_, POLLIN, 0}, {life_fd_, POLLIN, 0}, {control_fd_, POLLIN, 0}};
    for (;;) {
      if (::poll(fds, 3, -1) < 0) {
        if (errno == EINTR) continue;
        return exit_code::kFailure;
      }
      if (life_fd_ >= 0 && fds[1].revents) {
        // The owner is gone: so is the sandbox.
        ::kill(-1, SIGKILL);
        return 128 + SIGKILL;
      }
      if (control_fd_ >= 0 && fds[2].revents) {
        if (!serve_control()) {
          // The owner closed its end: it can no longer hear us.
          fds[2].fd = -1;
          control_fd_ = -1;
        }
      }
      if (fds[0].revents & POLLIN) {
        int status;
        if (handle_signal(&status)) return status;
      }
    }
  }

  // Returns true (with *status) when the sandbox must end.
  bool handle_signal(int* status) {
    signalfd_siginfo info;
    if (::read(signals_, &info, sizeof info) != sizeof info) return false;
    int sig = static_cast<int>(info.ssi_signo);
    if (sig != SIGCHLD) {
      if (main_pid_ > 0) {
        if (::kill(-main_pid_, sig) != 0) ::kill(main_pid_, sig);
        return false;
      }
      // No main process: a stop request ends the sandbox.
      if (sig == SIGTERM || sig == SIGINT || sig == SIGHUP || sig == SIGQUIT) {
        *status = 128 + sig;
        return true;
      }
      return false;
    }
    for (;;) {
      int wstatus;
      pid_t pid = ::waitpid(-1, &wstatus, WNOHANG);
      if (pid <= 0) break;
      // The sandbox lives as long as its main process; the kernel ends the
      // rest when PID 1 exits.
      if (pid == main_pid_) {
        *status = encode_status(wstatus);
        return true;
      }
      auto it = execs_.find(pid);
      if (it != execs_.end()) {
        send(make_message(
            {"exited", std::to_string(it->second), std::to_string(encode_status(wstatus))}));
        execs_.erase(it);
      }
    }
    return false;
  }

  void send(const std::string& packet, const int* fds = nullptr, int count = 0) {
    if (control_fd_ >= 0) send_packet(control_fd_, packet, fds, count);
  }

  // One request from the owner; false when the channel is closed.
  bool serve_control() {
    std::string packet;
    PacketFds fds;  // whatever start() does not dup onto stdio closes here
    long n = receive_packet(control_fd_, &packet, &fds);
    if (n == 0 || n == -ECONNRESET) return false;
    if (n < 0) return n == -EAGAIN || n == -EINTR || n == -EMSGSIZE;
    InitMessage message = parse_message(packet);
    if (message.kind == InitMessage::Kind::kMain) {
      auto request = decode_exec(message);
      if (!request || main_pid_ > 0 || main_started_) {
        send(make_message({"failed", request ? std::to_string(request->id) : "0",
                           std::to_string(exit_code::kFailure), "0",
                           request ? "the main process was started already" : "bad request"}));
      } else {
        start(*request, fds);
      }
    } else if (message.kind == InitMessage::Kind::kExec) {
      if (auto request = decode_exec(message)) {
        start(*request, fds);
      } else {
        send(
            make_message({"failed", "0", std::to_string(exit_code::kFailure), "0", "bad request"}));
      }
    } else if (message.kind == InitMessage::Kind::kSocket && message.fields.size() == 1) {
      // For a port forward (see init_protocol.h): made here, connected by the owner.
      UniqueFd sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      const int fd = sock.get();
      send(make_message({"socket", message.fields[0], std::to_string(sock ? 0 : errno)}),
           sock ? &fd : nullptr, sock ? 1 : 0);
    } else if (message.kind == InitMessage::Kind::kKill && message.fields.size() == 2) {
      uint64_t id = std::strtoull(message.fields[0].c_str(), nullptr, 10);
      int sig = std::atoi(message.fields[1].c_str());
      for (const auto& [pid, exec_id] : execs_)
        if (exec_id == id && ::kill(-pid, sig) != 0) ::kill(pid, sig);
    }
    return true;
  }

  // fds: stdio, then the fds the process gets as 3, 4, ... (as many as
  // came, in order).
  void start(ExecRequest& request, const PacketFds& fds) {
    const int stdio[3] = {fds[0].get(), fds[1].get(), fds[2].get()};
    int extra[kMaxExtraFds];
    int n_extra = 0;
    while (n_extra < kMaxExtraFds && fds[3 + n_extra].valid()) {
      extra[n_extra] = fds[3 + n_extra].get();
      ++n_extra;
    }
    const std::string id = std::to_string(request.id);
    auto fail = [&](int err, int code, const char* what) {
      send(make_message({"failed", id, std::to_string(code), std::to_string(err), what}));
    };
    UniqueFd master, slave;
    if (request.main && request.tty && tty_fd_ >= 0) {
      // The pty made at the start: its master is the owner's already.
      slave.reset(tty_fd_);
      tty_fd_ = -1;
    } else if (request.tty) {
      // A pty from the sandbox's own devpts; the master goes to the owner.
      master.reset(::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC));
      int unlock = 0;
      if (master && ::ioctl(master.get(), TIOCSPTLCK, &unlock) == 0)
        slave.reset(::ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
      if (!slave) return fail(errno, exit_code::kFailure, "open a pseudo-terminal");
      winsize size{request.rows, request.cols, 0, 0};
      ::ioctl(master.get(), TIOCSWINSZ, &size);
    }
    int pipe_ends[2];
    if (::pipe2(pipe_ends, O_CLOEXEC) != 0) return fail(errno, exit_code::kFailure, "pipe");
    UniqueFd error_read(pipe_ends[0]), error_write(pipe_ends[1]);
    std::vector<char*> argv = c_strings(request.argv);
    std::vector<char*> envp = c_strings(request.env);
    // vfork: the child borrows the init's memory until its exec (or its
    // _exit), so no page table is copied and torn down per command; the
    // init waits those microseconds. exec_child touches only its own stack
    // frames, the strings above and async-signal-safe calls.
    pid_t pid = ::vfork();
    if (pid == 0)
      exec_child(argv.data(), envp.data(), slave.get(), stdio, request.workdir.c_str(),
                 error_write.get(), -1, privileges(request.user ? &*request.user : nullptr), extra,
                 n_extra);
    const int fork_error = errno;
    error_write.reset();
    slave.reset();
    if (pid < 0) return fail(fork_error, exit_code::kFailure, "fork");
    // The child's exec closes the pipe; a failure writes errno and code.
    int message[2] = {0, 0};
    ssize_t n;
    do n = ::read(error_read.get(), message, sizeof message);
    while (n < 0 && errno == EINTR);
    // Reaped by the SIGCHLD loop; it is not reported as an exec.
    // 126 and 127 are the exec's own failure: the line names the command.
    if (n == sizeof message) {
      const bool exec_failed = message[1] != exit_code::kFailure && !request.argv.empty();
      const std::string what =
          exec_failed ? "cannot run " + request.argv[0] : std::string("set up the process");
      return fail(message[0], message[1], what.c_str());
    }
    if (request.main) {
      main_pid_ = pid;
      main_started_ = true;
    } else {
      execs_[pid] = request.id;
    }
    const int tty = master.get();
    send(make_message({"started", id, std::to_string(pid)}), tty >= 0 ? &tty : nullptr,
         tty >= 0 ? 1 : 0);
  }

  ChildPrivileges privileges(const ExecUser* user) const {
    return ChildPrivileges{user, child_caps_ ? &*child_caps_ : nullptr, last_cap_};
  }

  bool orphan_;
  bool main_started_ = false;
  int report_fd_, life_fd_, tty_fd_, control_fd_;
  std::optional<caps::Set> child_caps_;  // none: the init has no more than its children
  int last_cap_ = caps::last_cap();
  int signals_ = -1;
  pid_t main_pid_ = -1;
  std::map<pid_t, uint64_t> execs_;  // processes started for the owner
};

}  // namespace

int init_main(int argc, char** argv) {
  // openshell-init __init REPORT LIFE TTY CONTROL CAPS FLAGS -- [ARGV...]
  if (argc < 9 || std::strcmp(argv[8], "--") != 0) {
    static const char usage[] = "openshell: __init is internal to the runtime\n";
    ssize_t ignored = ::write(2, usage, sizeof usage - 1);
    (void)ignored;
    return exit_code::kFailure;
  }
  int fds[4];
  for (int i = 0; i < 4; ++i)
    if ((fds[i] = parse_fd(argv[2 + i])) < -1) return exit_code::kFailure;
  std::optional<caps::Set> child_caps;
  if (std::strcmp(argv[6], "-") != 0) {
    char* end = nullptr;
    errno = 0;
    unsigned long long set = std::strtoull(argv[6], &end, 10);
    if (errno || !end || *end || end == argv[6]) return exit_code::kFailure;
    child_caps = set;
  }
  const bool orphan = std::strchr(argv[7], 'o') != nullptr;
  // One name in ps whichever program runs it (this binary, or the small
  // one from a memfd, which the kernel would call "memfd:openshell").
  ::prctl(PR_SET_NAME, "osh-init", 0, 0, 0);
  return Init(fds[0], fds[1], fds[2], fds[3], child_caps, orphan).run(argv + 9);
}

}  // namespace openshell::runtime
