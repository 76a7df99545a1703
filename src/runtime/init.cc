// PID 1 of a sandbox: runs the main process, passes signals to it, reaps
// orphans, and exits with the main process's status. It runs from a sealed
// image of this binary (see MountPlan::apply), already confined like
// everything else in the sandbox.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "base/child_failure.h"
#include "base/error.h"
#include "runtime/container.h"

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

// The main process: a fresh process image with default signal handling.
[[noreturn]] void exec_main(char** argv, int report_fd, int tty_fd) {
  sigset_t none;
  sigemptyset(&none);
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) ::signal(sig, SIG_DFL);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  if (tty_fd >= 0) {
    // Its own session, with the pty as controlling terminal and stdio.
    if (::setsid() < 0 || ::ioctl(tty_fd, TIOCSCTTY, 0) != 0) {
      report(report_fd, errno, "set the controlling terminal", nullptr, exit_code::kFailure);
      ::_exit(exit_code::kFailure);
    }
    for (int i = 0; i < 3; ++i) ::dup2(tty_fd, i);
    if (tty_fd > 2) ::close(tty_fd);
  } else {
    // Its own process group: signals go to the whole job.
    ::setpgid(0, 0);
  }
  // Everything beyond stdio closes on exec, the report pipe included: its
  // EOF tells the parent the command runs.
  ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
  ::execvp(argv[0], argv);
  int err = errno;
  int code = err == ENOENT || err == ENOTDIR ? exit_code::kNotFound : exit_code::kCannotExecute;
  report(report_fd, err, "cannot run", argv[0], code);
  ::_exit(code);
}

}  // namespace

int init_main(int argc, char** argv) {
  // openshell-init __init REPORT LIFE TTY -- ARGV...
  if (argc < 7 || std::strcmp(argv[5], "--") != 0) {
    static const char usage[] = "openshell: __init is internal to the runtime\n";
    ssize_t ignored = ::write(2, usage, sizeof usage - 1);
    (void)ignored;
    return exit_code::kFailure;
  }
  int report_fd = parse_fd(argv[2]);
  int life_fd = parse_fd(argv[3]);
  int tty_fd = parse_fd(argv[4]);
  if (report_fd < -1 || life_fd < -1 || tty_fd < -1) return exit_code::kFailure;
  char** command = argv + 6;

  // Nothing in the sandbox may open /proc/1/mem, /proc/1/exe and the like.
  ::prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
  for (int fd : {report_fd, life_fd, tty_fd})
    if (fd >= 0) ::fcntl(fd, F_SETFD, FD_CLOEXEC);

  // Every signal is read from a signalfd; for PID 1 a blocked signal from
  // the parent namespace is queued, where an unhandled one would be dropped.
  sigset_t all;
  sigfillset(&all);
  ::sigprocmask(SIG_BLOCK, &all, nullptr);
  int signals = ::signalfd(-1, &all, SFD_CLOEXEC);
  if (signals < 0) {
    report(report_fd, errno, "signalfd", nullptr, exit_code::kFailure);
    return exit_code::kFailure;
  }

  pid_t main_pid = ::fork();
  if (main_pid < 0) {
    report(report_fd, errno, "fork the main process", nullptr, exit_code::kFailure);
    return exit_code::kFailure;
  }
  if (main_pid == 0) exec_main(command, report_fd, tty_fd);
  if (report_fd >= 0) ::close(report_fd);
  if (tty_fd >= 0) ::close(tty_fd);

  pollfd fds[2] = {{signals, POLLIN, 0}, {life_fd, POLLIN, 0}};
  const nfds_t nfds = life_fd >= 0 ? 2 : 1;
  for (;;) {
    if (::poll(fds, nfds, -1) < 0) {
      if (errno == EINTR) continue;
      return exit_code::kFailure;
    }
    if (nfds > 1 && fds[1].revents) {
      // The owner is gone: so is the sandbox.
      ::kill(-1, SIGKILL);
      return 128 + SIGKILL;
    }
    if (!(fds[0].revents & POLLIN)) continue;
    signalfd_siginfo info;
    if (::read(signals, &info, sizeof info) != sizeof info) continue;
    int sig = static_cast<int>(info.ssi_signo);
    if (sig != SIGCHLD) {
      if (::kill(-main_pid, sig) != 0) ::kill(main_pid, sig);
      continue;
    }
    for (;;) {
      int status;
      pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      // The sandbox lives as long as its main process; the kernel ends the
      // rest when PID 1 exits.
      if (pid == main_pid) return encode_status(status);
    }
  }
}

}  // namespace openshell::runtime
