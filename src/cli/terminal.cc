#include "cli/terminal.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "runtime/container.h"

namespace openshell::cli {

namespace {

void copy_window_size(int to) {
  winsize size{};
  terminal_size(&size.ws_row, &size.ws_col);
  ::ioctl(to, TIOCSWINSZ, &size);
}

// Returns false at end of input or on error.
bool pump(int from, int to) {
  char buf[16384];
  ssize_t n = ::read(from, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (n <= 0) return false;
  return files::write_all(to, std::string_view(buf, static_cast<size_t>(n)));
}

}  // namespace

RawMode::RawMode(int fd, bool keys_only) : fd_(fd) {
  if (fd < 0 || !::isatty(fd) || ::tcgetattr(fd, &saved_) != 0) return;
  termios raw = saved_;
  if (keys_only) {
    // ^Q and ^S are keys here (detach keys), not flow control; ^V not a prefix.
    raw.c_lflag &= ~static_cast<tcflag_t>(ICANON | ECHO | IEXTEN);
    raw.c_iflag &= ~static_cast<tcflag_t>(IXON);
    raw.c_cc[VMIN] = 1;
    raw.c_cc[VTIME] = 0;
  } else {
    ::cfmakeraw(&raw);
  }
  if (::tcsetattr(fd, TCSANOW, &raw) == 0) active_ = true;
}

RawMode::~RawMode() {
  if (active_) ::tcsetattr(fd_, TCSANOW, &saved_);
}

void terminal_size(unsigned short* rows, unsigned short* cols) {
  winsize size{};
  for (int fd : {STDOUT_FILENO, STDIN_FILENO, STDERR_FILENO})
    if (::ioctl(fd, TIOCGWINSZ, &size) == 0 && size.ws_row && size.ws_col) {
      *rows = size.ws_row;
      *cols = size.ws_col;
      return;
    }
  *rows = 24;
  *cols = 80;
}

namespace {

constexpr int kForwarded[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH};

sigset_t forwarded_set() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : kForwarded) sigaddset(&set, sig);
  return set;
}

}  // namespace

// An init that is stopped (SIGSTOP, a debugger) never acts on a SIGTERM.
std::chrono::milliseconds stop_grace() {
  const char* value = std::getenv("OPENSHELL_STOP_GRACE_MS");
  if (!value) return std::chrono::seconds(10);
  auto ms = text::parse_uint(value, 86400000);
  if (!ms || *ms == 0)
    throw Error(std::string("OPENSHELL_STOP_GRACE_MS '") + value +
                "': not a whole number of milliseconds from 1 to 86400000");
  return std::chrono::milliseconds(*ms);
}

void block_forwarded_signals() {
  sigset_t set = forwarded_set();
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
}

int attach(runtime::Container& container, std::chrono::milliseconds grace) {
  // Armed by a SIGTERM. A plain time_point with a sentinel: GCC reads an
  // optional's value as maybe uninitialized here (-Wmaybe-uninitialized).
  using Clock = std::chrono::steady_clock;
  constexpr Clock::time_point kUnarmed = Clock::time_point::max();
  Clock::time_point kill_at = kUnarmed;
  sigset_t set = forwarded_set();
  sigset_t saved;
  ::sigprocmask(SIG_BLOCK, &set, &saved);
  UniqueFd signals(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals) throw_errno("signalfd");
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction saved_pipe {};
  ::sigaction(SIGPIPE, &ignore, &saved_pipe);

  const int master = container.tty_master();
  const bool tty = master >= 0;
  RawMode raw(tty ? STDIN_FILENO : -1);
  if (tty) {
    copy_window_size(master);
    ::fcntl(master, F_SETFL, ::fcntl(master, F_GETFL) | O_NONBLOCK);
  }

  bool stdin_open = tty;
  bool master_open = tty;
  int status = 0;
  for (;;) {
    pollfd fds[4] = {{container.pidfd(), POLLIN, 0},
                     {signals.get(), POLLIN, 0},
                     {master_open ? master : -1, POLLIN, 0},
                     {stdin_open ? STDIN_FILENO : -1, POLLIN, 0}};
    int timeout = -1;
    if (kill_at != kUnarmed) {
      auto left = std::chrono::ceil<std::chrono::milliseconds>(kill_at - Clock::now());
      timeout = static_cast<int>(std::max<long>(0, left.count()));
    }
    if (::poll(fds, 4, timeout) < 0) {
      if (errno == EINTR) continue;
      throw_errno("poll");
    }
    if (kill_at != kUnarmed && Clock::now() >= kill_at) {
      log::warn("the sandbox did not end within " + std::to_string(grace.count()) +
                " ms of SIGTERM: killing it");
      container.signal(SIGKILL);
      kill_at = kUnarmed;
    }
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo info;
      while (::read(signals.get(), &info, sizeof info) == sizeof info) {
        if (info.ssi_signo == SIGWINCH) {
          if (tty) copy_window_size(master);
        } else {
          container.signal(static_cast<int>(info.ssi_signo));
          if (info.ssi_signo == SIGTERM && kill_at == kUnarmed) kill_at = Clock::now() + grace;
        }
      }
    }
    // EIO once the pty's last writer is gone; the exit follows.
    if (master_open && (fds[2].revents & (POLLIN | POLLHUP | POLLERR)))
      master_open = pump(master, STDOUT_FILENO);
    if (stdin_open && (fds[3].revents & (POLLIN | POLLHUP | POLLERR))) {
      if (!pump(STDIN_FILENO, master)) {
        stdin_open = false;
        // End of input: the end-of-file character (^D, the default VEOF;
        // the master side cannot read the slave's settings).
        files::write_all(master, std::string_view("\x04", 1));
      }
    }
    if (fds[0].revents & POLLIN) {
      if (container.poll_exit(&status)) break;
    }
  }
  // What the sandbox wrote just before it ended.
  if (master_open) {
    char buf[16384];
    ssize_t n;
    while ((n = ::read(master, buf, sizeof buf)) > 0)
      files::write_all(STDOUT_FILENO, std::string_view(buf, static_cast<size_t>(n)));
  }
  ::sigaction(SIGPIPE, &saved_pipe, nullptr);
  ::sigprocmask(SIG_SETMASK, &saved, nullptr);
  if (int kills = container.oom_kills(); kills > 0)
    log::warn("the sandbox ran out of memory: the kernel killed " + std::to_string(kills) +
              (kills == 1 ? " process" : " processes") + " at the --memory limit");
  return status;
}

}  // namespace openshell::cli
