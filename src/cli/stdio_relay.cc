#include "cli/stdio_relay.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>

#include "base/error.h"
#include "base/files.h"
#include "runtime/spec.h"

namespace openshell::cli {

namespace {

bool same_file(int a, int b) {
  struct stat sa, sb;
  return ::fstat(a, &sa) == 0 && ::fstat(b, &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino && sa.st_rdev == sb.st_rdev;
}

void make_pipe(UniqueFd* read_end, UniqueFd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) throw_errno("pipe for the sandbox's stdio");
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
}

// Reading the terminal from the background would stop this process
// (SIGTTIN): read it only while in the foreground.
bool in_foreground() {
  pid_t group = ::tcgetpgrp(STDIN_FILENO);
  return group < 0 || group == ::getpgrp();
}

}  // namespace

StdioRelay::StdioRelay(runtime::ContainerSpec* spec) {
  if (spec->tty) return;
  const bool in_tty = ::isatty(STDIN_FILENO), out_tty = ::isatty(STDOUT_FILENO),
             err_tty = ::isatty(STDERR_FILENO);
  if (!in_tty && !out_tty && !err_tty) return;
  if (in_tty) {
    make_pipe(&sandbox_in_, &to_stdin_);
    ::fcntl(to_stdin_.get(), F_SETFL, O_NONBLOCK);
    spec->stdin_fd = sandbox_in_.get();
  }
  if (out_tty) {
    make_pipe(&from_stdout_, &sandbox_out_);
    spec->stdout_fd = sandbox_out_.get();
  }
  if (err_tty) {
    // Both on one terminal: one pipe, so that their order is kept.
    if (out_tty && same_file(STDOUT_FILENO, STDERR_FILENO)) {
      spec->stderr_fd = sandbox_out_.get();
    } else {
      make_pipe(&from_stderr_, &sandbox_err_);
      spec->stderr_fd = sandbox_err_.get();
    }
  }
  make_pipe(&stop_read_, &stop_write_);
}

StdioRelay::~StdioRelay() { finish(); }

void StdioRelay::start() {
  if (!stop_write_) return;
  sandbox_in_.reset();
  sandbox_out_.reset();
  sandbox_err_.reset();
  sigset_t all, saved;
  sigfillset(&all);
  ::pthread_sigmask(SIG_BLOCK, &all, &saved);
  thread_ = std::thread([this] { run(); });
  ::pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

void StdioRelay::finish() {
  if (!thread_.joinable()) return;
  stop_write_.reset();  // EOF on stop_read_
  thread_.join();
}

void StdioRelay::run() {
  std::string pending;  // read from the terminal, not yet taken by the sandbox
  bool stopping = false;
  bool stdin_open = static_cast<bool>(to_stdin_);
  auto deadline = std::chrono::steady_clock::time_point::max();
  char buf[16384];
  while (from_stdout_ || from_stderr_ || (!stopping && stdin_open)) {
    if (stopping && std::chrono::steady_clock::now() > deadline) break;
    const bool read_stdin = !stopping && stdin_open && pending.empty() && in_foreground();
    pollfd fds[5] = {{from_stdout_ ? from_stdout_.get() : -1, POLLIN, 0},
                     {from_stderr_ ? from_stderr_.get() : -1, POLLIN, 0},
                     {read_stdin ? STDIN_FILENO : -1, POLLIN, 0},
                     {!stopping && !pending.empty() ? to_stdin_.get() : -1, POLLOUT, 0},
                     {stopping ? -1 : stop_read_.get(), POLLIN, 0}};
    // Short waits while the terminal is another group's, or while draining.
    int timeout = stopping ? 100 : (stdin_open && !read_stdin && pending.empty()) ? 200 : -1;
    if (::poll(fds, 5, timeout) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (!fds[i].revents) continue;
      UniqueFd& from = i == 0 ? from_stdout_ : from_stderr_;
      ssize_t n = ::read(from.get(), buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || !files::write_all(i == 0 ? STDOUT_FILENO : STDERR_FILENO,
                                      std::string_view(buf, static_cast<size_t>(n))))
        from.reset();
    }
    if (fds[2].revents) {
      ssize_t n = ::read(STDIN_FILENO, buf, sizeof buf);
      if (n > 0) {
        pending.assign(buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        stdin_open = false;  // end of input: the sandbox reads EOF
        to_stdin_.reset();
      }
    }
    if (fds[3].revents) {
      ssize_t n = ::write(to_stdin_.get(), pending.data(), pending.size());
      if (n > 0) {
        pending.erase(0, static_cast<size_t>(n));
      } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
        // The sandbox closed its stdin: what the terminal has stays there.
        pending.clear();
        stdin_open = false;
        to_stdin_.reset();
      }
    }
    if (fds[4].revents) {
      // The sandbox has ended: its output's last writers go with it.
      stopping = true;
      to_stdin_.reset();
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    }
  }
  to_stdin_.reset();
  from_stdout_.reset();
  from_stderr_.reset();
}

}  // namespace openshell::cli
