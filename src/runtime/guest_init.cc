#include "runtime/guest_init.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>

#include <nlohmann/json.hpp>

#include "base/child_failure.h"
#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "policy/policy.h"
#include "runtime/caps.h"
#include "runtime/guest_relay.h"
#include "runtime/init_protocol.h"
#include "runtime/landlock.h"
#include "runtime/seccomp.h"

namespace openshell::runtime::guest {

namespace {

using nlohmann::json;

constexpr const char* kDefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

bool known_type(uint8_t t) {
  switch (static_cast<FrameType>(t)) {
    case FrameType::kExec:
    case FrameType::kStdin:
    case FrameType::kEof:
    case FrameType::kKill:
    case FrameType::kResize:
    case FrameType::kStarted:
    case FrameType::kStdout:
    case FrameType::kStderr:
    case FrameType::kExited:
    case FrameType::kFailed:
      return true;
  }
  return false;
}

// All of data to a socket (no SIGPIPE) or any other fd.
bool send_all(int fd, std::string_view data) {
  while (!data.empty()) {
    ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == ENOTSOCK) return files::write_all(fd, data);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

bool send_frame(int fd, FrameType type, std::string_view bytes) {
  return send_all(fd, encode_frame(type, bytes));
}

// Why the child did not exec, to its parent in one write: an errno alone
// (what = "": starting the command) or a step's failure.
[[noreturn]] void report_failure(int status_fd, const ChildFailure& failure) {
  ssize_t ignored = write(status_fd, &failure, sizeof failure);
  (void)ignored;
  _exit(exit_code::kFailure);
}

// Child side, between fork and exec: async-signal-safe enough for a
// single-threaded parent (the guest init is one).
[[noreturn]] void exec_child(const ExecRequest& request, const Config& config,
                             const Confinement& confinement, int status_fd) {
  auto fail = [status_fd](int err) {
    ChildFailure failure;
    failure.err = err;
    report_failure(status_fd, failure);
  };
  setsid();
  // Its stdin is the pty then: the session's controlling terminal, so that
  // ^C and ^Z signal the foreground job and /dev/tty opens.
  if (request.tty && ioctl(0, TIOCSCTTY, 0) != 0) fail(errno);
  // Every signal at its default and none blocked, whatever this process
  // inherited: an ignored SIGINT (a shell's background job passes one on)
  // would outlive the exec, and ^C would not end the command.
  for (int sig = 1; sig < NSIG; ++sig)
    if (sig != SIGKILL && sig != SIGSTOP) signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  if (chdir(request.workdir.empty() ? "/" : request.workdir.c_str()) != 0) fail(errno);
  uint32_t uid = request.user ? request.user->uid : config.uid;
  uint32_t gid = request.user ? request.user->gid : config.gid;
  // Root (the guest init is) drops every capability, the bounding set's
  // too, as a container sandbox's processes do; an ordinary user has none.
  bool drop = confinement.drop_capabilities && geteuid() == 0;
  ChildFailure failure;
  if (drop && !caps::drop_bounding(0, confinement.last_cap, &failure))
    fail(failure.err ? failure.err : EPERM);
  if (gid != getgid() || uid != getuid()) {
    if (setgroups(0, nullptr) != 0 && errno != EPERM) fail(errno);
    if (setresgid(gid, gid, gid) != 0) fail(errno);
    if (setresuid(uid, uid, uid) != 0) fail(errno);
  }
  if (drop && !caps::set_final(0, confinement.last_cap, &failure))
    fail(failure.err ? failure.err : EPERM);
  if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(errno);
  // The policy's missing paths were told once, by the init (best effort);
  // under hard_requirement one fails the command here.
  char skipped[512] = {};
  if (!landlock::apply(confinement.landlock, -1, skipped, sizeof skipped, &failure))
    report_failure(status_fd, failure);
  if (confinement.seccomp) {
    if (!seccomp::install(seccomp::default_program(), &failure))
      fail(failure.err ? failure.err : EPERM);
  }
  const std::vector<std::string>& env_list = request.env.empty() ? config.env : request.env;
  std::vector<char*> argv;
  for (const std::string& a : request.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> env;
  std::string path = kDefaultPath;
  for (const std::string& e : env_list) {
    env.push_back(const_cast<char*>(e.c_str()));
    if (e.rfind("PATH=", 0) == 0) path = e.substr(5);
  }
  env.push_back(nullptr);
  const std::string& name = request.argv[0];
  int err = ENOENT;
  if (name.find('/') != std::string::npos) {
    execve(name.c_str(), argv.data(), env.data());
    err = errno;
  } else {
    size_t start = 0;
    while (start <= path.size()) {
      size_t end = path.find(':', start);
      if (end == std::string::npos) end = path.size();
      std::string full = path.substr(start, end - start) + "/" + name;
      execve(full.c_str(), argv.data(), env.data());
      if (errno != ENOENT && errno != ENOTDIR) err = errno;
      start = end + 1;
    }
  }
  fail(err);
  _exit(exit_code::kFailure);  // not reached: fail() exits
}

int status_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return exit_code::kFailure;
}

// The CLI's code for a command that could not start.
int failure_code(int start_errno) {
  return start_errno == ENOENT                               ? exit_code::kNotFound
         : (start_errno == EACCES || start_errno == ENOEXEC) ? exit_code::kCannotExecute
                                                             : exit_code::kFailure;
}

// A new pty for request (its size, its user's), the master returned and
// the slave in *slave; an invalid fd with the reason in *error.
UniqueFd open_pty(const ExecRequest& request, const Config& config, UniqueFd* slave,
                  std::string* error) {
  UniqueFd master(posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!master)
    return *error = errno_message("open a pseudo-terminal (/dev/ptmx)", errno), UniqueFd();
  if (unlockpt(master.get()) != 0)
    return *error = errno_message("unlock a pseudo-terminal", errno), UniqueFd();
  slave->reset(ioctl(master.get(), TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC));
  if (!*slave) return *error = errno_message("open a pseudo-terminal's slave", errno), UniqueFd();
  winsize size{request.rows, request.cols, 0, 0};
  if (ioctl(master.get(), TIOCSWINSZ, &size) != 0)
    return *error = errno_message("set a pseudo-terminal's size", errno), UniqueFd();
  // Its user's, as login makes it: what the command runs, as that user,
  // may reopen it by name. Root (the guest init) can; the tests' user keeps it.
  uint32_t uid = request.user ? request.user->uid : config.uid;
  uint32_t gid = request.user ? request.user->gid : config.gid;
  if (uid != geteuid() || gid != getegid()) {
    int ignored = fchown(slave->get(), uid, gid);
    (void)ignored;
  }
  return master;
}

int fail_connection(int fd, int code, const std::string& message) {
  send_frame(fd, FrameType::kFailed, std::to_string(code) + "\n" + message);
  return code;
}

// Starts request; returns the pid, or -1 with the reason in *failure.
pid_t start(const ExecRequest& request, const Config& config, const Confinement& confinement,
            int in_fd, int out_fd, int err_fd, ChildFailure* failure) {
  int status_pipe[2];
  if (pipe2(status_pipe, O_CLOEXEC) != 0) {
    failure->err = errno;
    return -1;
  }
  pid_t pid = fork();
  if (pid == 0) {
    close(status_pipe[0]);
    if (dup2(in_fd, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(err_fd, 2) < 0) {
      ChildFailure dup_failure;
      dup_failure.err = errno;
      report_failure(status_pipe[1], dup_failure);
    }
    exec_child(request, config, confinement, status_pipe[1]);
  }
  close(status_pipe[1]);
  if (pid < 0) {
    failure->err = errno;
    close(status_pipe[0]);
    return -1;
  }
  ssize_t n;
  do {
    n = read(status_pipe[0], failure, sizeof *failure);
  } while (n < 0 && errno == EINTR);
  close(status_pipe[0]);
  if (n == sizeof *failure) {
    int ignored;
    waitpid(pid, &ignored, 0);
    return -1;
  }
  *failure = ChildFailure{};
  return pid;
}

// A command that did not start: the CLI's code and one line. A step of
// the confinement that failed (Landlock's) is named; otherwise the errno
// is the exec's, of `name`.
int start_failure_code(const ChildFailure& failure) {
  return failure.what[0] ? failure.exit_code : failure_code(failure.err);
}

std::string start_failure_message(const ChildFailure& failure, const std::string& name) {
  return failure.what[0] ? failure.message() : errno_message(name, failure.err);
}

void mount_or_throw(const char* source, const char* target, const char* type, unsigned long flags,
                    const char* data) {
  mkdir(target, 0755);
  if (mount(source, target, type, flags, data) != 0 && errno != EBUSY)
    throw_errno(std::string("mount ") + type + " " + source + " on " + target);
}

void console_line(const std::string& line) {
  std::string text = "openshell-guest: " + line + "\n";
  files::write_all(2, text);
}

// The config's Landlock policy, parsed; Error("guest config: ...") for one
// that does not.
policy::Policy landlock_policy(const Config& config) {
  try {
    return policy::parse(config.landlock_policy, "landlock_policy");
  } catch (const Error& e) {
    throw Error(std::string("guest config: ") + e.what());
  }
}

uint32_t id_field(const std::string& key, const json& value) {
  if (!value.is_number_unsigned() || value.get<uint64_t>() > UINT32_MAX)
    throw Error("guest config: \"" + key + "\" must be a whole number from 0 to 4294967295");
  return value.get<uint32_t>();
}

}  // namespace

std::string encode_frame(FrameType type, std::string_view bytes) {
  std::string out;
  out.reserve(5 + bytes.size());
  out.push_back(static_cast<char>(type));
  uint32_t n = static_cast<uint32_t>(bytes.size());
  for (int shift = 24; shift >= 0; shift -= 8)
    out.push_back(static_cast<char>((n >> shift) & 0xff));
  out.append(bytes);
  return out;
}

std::string encode_size(uint16_t rows, uint16_t cols) {
  return std::to_string(rows) + " " + std::to_string(cols);
}

std::optional<std::pair<uint16_t, uint16_t>> decode_size(std::string_view bytes) {
  const size_t space = bytes.find(' ');
  if (space == std::string_view::npos) return std::nullopt;
  auto rows = text::parse_uint(bytes.substr(0, space), 65535);
  auto cols = text::parse_uint(bytes.substr(space + 1), 65535);
  if (!rows || !cols) return std::nullopt;
  return std::pair{static_cast<uint16_t>(*rows), static_cast<uint16_t>(*cols)};
}

std::optional<Frame> take_frame(std::string* buffer) {
  if (buffer->empty()) return std::nullopt;
  uint8_t type = static_cast<uint8_t>((*buffer)[0]);
  if (!known_type(type)) throw Error("guest stream: unknown frame type " + std::to_string(type));
  if (buffer->size() < 5) return std::nullopt;
  uint32_t n = 0;
  for (int i = 1; i <= 4; ++i) n = (n << 8) | static_cast<uint8_t>((*buffer)[i]);
  if (n > kMaxFrame)
    throw Error("guest stream: a frame of " + std::to_string(n) + " bytes (the most is " +
                std::to_string(kMaxFrame) + ")");
  if (buffer->size() < 5 + static_cast<size_t>(n)) return std::nullopt;
  Frame frame{static_cast<FrameType>(type), buffer->substr(5, n)};
  buffer->erase(0, 5 + static_cast<size_t>(n));
  return frame;
}

std::string encode_config(const Config& c) {
  json j = {{"disk", c.disk},
            {"layer", c.layer},
            {"argv", c.argv},
            {"env", c.env},
            {"workdir", c.workdir},
            {"uid", c.uid},
            {"gid", c.gid},
            {"port", c.port},
            {"status_port", c.status_port},
            {"egress_port", c.egress_port},
            {"dns_port", c.dns_port},
            {"hostname", c.hostname},
            {"landlock_policy", c.landlock_policy},
            {"landlock_warn_missing", c.landlock_warn_missing},
            {"proc_read_only", c.proc_read_only}};
  return j.dump();
}

Config decode_config(std::string_view text) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    throw Error(std::string("guest config: not JSON: ") + e.what());
  }
  if (!j.is_object()) throw Error("guest config: not a JSON object");
  Config c;
  try {
    for (auto& [key, value] : j.items()) {
      if (key == "disk")
        c.disk = value.get<std::string>();
      else if (key == "layer")
        c.layer = value.get<std::string>();
      else if (key == "argv")
        c.argv = value.get<std::vector<std::string>>();
      else if (key == "env")
        c.env = value.get<std::vector<std::string>>();
      else if (key == "workdir")
        c.workdir = value.get<std::string>();
      else if (key == "uid")
        c.uid = id_field(key, value);
      else if (key == "gid")
        c.gid = id_field(key, value);
      else if (key == "port")
        c.port = id_field(key, value);
      else if (key == "status_port")
        c.status_port = id_field(key, value);
      else if (key == "egress_port")
        c.egress_port = id_field(key, value);
      else if (key == "dns_port")
        c.dns_port = id_field(key, value);
      else if (key == "hostname")
        c.hostname = value.get<std::string>();
      else if (key == "landlock_policy")
        c.landlock_policy = value.get<std::string>();
      else if (key == "landlock_warn_missing")
        c.landlock_warn_missing = value.get<bool>();
      else if (key == "proc_read_only")
        c.proc_read_only = value.get<bool>();
      else
        throw Error("guest config: unknown key \"" + key + "\"");
    }
  } catch (const json::exception& e) {
    throw Error(std::string("guest config: wrong type: ") + e.what());
  }
  if (c.workdir.empty() || c.workdir[0] != '/')
    throw Error("guest config: workdir must be absolute");
  if (c.layer.size() && c.disk.empty()) throw Error("guest config: a layer without a disk");
  // It goes into /etc/hosts and sethostname(2): a host name's letters only.
  if (c.hostname.size() > 64 ||
      c.hostname.find_first_not_of(
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-.") != std::string::npos)
    throw Error("guest config: hostname must be at most 64 letters, digits, '-' and '.'");
  if (!c.landlock_policy.empty()) (void)landlock_policy(c);  // refused here, not in the guest
  return c;
}

Confinement confinement_for(const Config& config, int landlock_abi) {
  Confinement confinement;
  if (config.landlock_policy.empty()) return confinement;
  confinement.landlock = landlock::plan(landlock_policy(config), config.workdir, landlock_abi);
  confinement.landlock.warn_missing = config.landlock_warn_missing;
  return confinement;
}

std::string missing_landlock_paths(const landlock::Plan& plan) {
  std::string missing;
  if (!plan.enabled) return missing;
  for (const landlock::Rule& rule : plan.rules) {
    struct stat st {};
    if (lstat(rule.path.c_str(), &st) == 0 || errno != ENOENT) continue;
    missing += (missing.empty() ? "" : ", ") + rule.path;
  }
  return missing;
}

int serve_connection(int fd, const Config& config, const Confinement& confinement) {
  std::string in;
  std::optional<Frame> first;
  char buf[65536];
  try {
    while (!(first = take_frame(&in))) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return exit_code::kFailure;
      in.append(buf, static_cast<size_t>(n));
    }
  } catch (const Error& e) {
    return fail_connection(fd, exit_code::kFailure, e.what());
  }
  if (first->type != FrameType::kExec)
    return fail_connection(fd, exit_code::kFailure, "guest stream: the first frame is not exec");
  std::optional<ExecRequest> request = decode_exec(parse_message(first->bytes));
  if (!request || request->argv.empty())
    return fail_connection(fd, exit_code::kFailure, "guest stream: a malformed exec request");

  // The command's ends: with a tty, the pty's slave is its stdin, stdout
  // and stderr, and the master (one descriptor each way, a dup for stdin)
  // is ours; else three pipes. stderr_read stays closed for a tty.
  UniqueFd stdin_read, stdin_write, stdout_read, stdout_write, stderr_read, stderr_write;
  UniqueFd slave;
  // The master's last close hangs the terminal up: SIGHUP to a command that
  // has closed its stdio (the master reads EIO) but not yet exited. This
  // one is held until the command is reaped.
  UniqueFd master_held;
  if (request->tty) {
    std::string error;
    UniqueFd master = open_pty(*request, config, &slave, &error);
    if (!master) return fail_connection(fd, exit_code::kFailure, error);
    stdin_write.reset(fcntl(master.get(), F_DUPFD_CLOEXEC, 0));
    master_held.reset(fcntl(master.get(), F_DUPFD_CLOEXEC, 0));
    if (!stdin_write || !master_held)
      return fail_connection(fd, 125, errno_message("dup the pty", errno));
    stdout_read = std::move(master);
  } else {
    int in_pipe[2], out_pipe[2], err_pipe[2];
    if (pipe2(in_pipe, O_CLOEXEC) != 0)
      return fail_connection(fd, 125, errno_message("pipe", errno));
    stdin_read.reset(in_pipe[0]), stdin_write.reset(in_pipe[1]);
    if (pipe2(out_pipe, O_CLOEXEC) != 0)
      return fail_connection(fd, 125, errno_message("pipe", errno));
    stdout_read.reset(out_pipe[0]), stdout_write.reset(out_pipe[1]);
    if (pipe2(err_pipe, O_CLOEXEC) != 0)
      return fail_connection(fd, 125, errno_message("pipe", errno));
    stderr_read.reset(err_pipe[0]), stderr_write.reset(err_pipe[1]);
  }

  ChildFailure start_failure;
  pid_t pid = slave ? start(*request, config, confinement, slave.get(), slave.get(), slave.get(),
                            &start_failure)
                    : start(*request, config, confinement, stdin_read.get(), stdout_write.get(),
                            stderr_write.get(), &start_failure);
  // Only the command holds its ends now: their last close is its output's end.
  slave.reset();
  stdin_read.reset();
  stdout_write.reset();
  stderr_write.reset();
  if (pid < 0) {
    return fail_connection(fd, start_failure_code(start_failure),
                           start_failure_message(start_failure, request->argv[0]));
  }
  send_frame(fd, FrameType::kStarted, std::to_string(pid));
  // For a tty the same open file as stdout_read: both are non-blocking.
  fcntl(stdin_write.get(), F_SETFL, O_NONBLOCK);

  std::string pending_stdin;
  bool stdin_eof = false;
  bool peer_open = true;
  auto handle = [&](Frame& frame) {
    switch (frame.type) {
      case FrameType::kStdin:
        if (!stdin_eof) pending_stdin += frame.bytes;
        break;
      case FrameType::kEof:
        // A terminal is not closed at the end of input: the end-of-file
        // character is typed, as at a keyboard (a line discipline in
        // canonical mode ends the reader's input with it).
        if (!request->tty) {
          stdin_eof = true;
        } else if (stdin_write) {
          termios modes{};
          pending_stdin.push_back(tcgetattr(stdin_write.get(), &modes) == 0 ? modes.c_cc[VEOF]
                                                                            : '\x04');
        }
        break;
      case FrameType::kResize:
        if (auto size = decode_size(frame.bytes); size && request->tty && stdout_read) {
          winsize ws{size->first, size->second, 0, 0};
          ioctl(stdout_read.get(), TIOCSWINSZ, &ws);
        }
        break;
      case FrameType::kKill: {
        auto sig = text::parse_uint(frame.bytes);
        if (sig && *sig >= 1 && *sig <= 64) kill(-pid, static_cast<int>(*sig));
        break;
      }
      default:
        break;
    }
  };
  try {
    while (auto frame = take_frame(&in)) handle(*frame);
  } catch (const Error&) {
    peer_open = false;
  }
  while (stdout_read || stderr_read) {
    if (stdin_write && stdin_eof && pending_stdin.empty()) stdin_write.reset();
    pollfd fds[4];
    int count = 0;
    int peer_i = -1, stdin_i = -1, out_i = -1, err_i = -1;
    if (peer_open) fds[peer_i = count++] = {fd, POLLIN, 0};
    if (stdin_write && !pending_stdin.empty())
      fds[stdin_i = count++] = {stdin_write.get(), POLLOUT, 0};
    if (stdout_read) fds[out_i = count++] = {stdout_read.get(), POLLIN, 0};
    if (stderr_read) fds[err_i = count++] = {stderr_read.get(), POLLIN, 0};
    if (poll(fds, static_cast<nfds_t>(count), -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (peer_i >= 0 && fds[peer_i].revents) {
      ssize_t n = read(fd, buf, sizeof buf);
      if (n > 0) {
        in.append(buf, static_cast<size_t>(n));
        try {
          while (auto frame = take_frame(&in)) handle(*frame);
        } catch (const Error&) {
          peer_open = false;
        }
      } else if (n == 0 || errno != EINTR) {
        peer_open = false;
      }
      if (!peer_open) {
        // The host is gone: nobody reads the output any more.
        kill(-pid, SIGKILL);
        stdin_write.reset();
      }
    }
    if (stdin_i >= 0 && fds[stdin_i].revents) {
      ssize_t n = write(stdin_write.get(), pending_stdin.data(), pending_stdin.size());
      if (n > 0)
        pending_stdin.erase(0, static_cast<size_t>(n));
      else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        pending_stdin.clear();
        stdin_write.reset();
      }
    }
    for (auto [index, pipe, type] : {std::tuple{out_i, &stdout_read, FrameType::kStdout},
                                     std::tuple{err_i, &stderr_read, FrameType::kStderr}}) {
      if (index < 0 || !fds[index].revents) continue;
      ssize_t n = read(pipe->get(), buf, sizeof buf);
      if (n > 0) {
        if (peer_open && !send_frame(fd, type, std::string_view(buf, static_cast<size_t>(n)))) {
          peer_open = false;
          kill(-pid, SIGKILL);
        }
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        // A pty's master reads EIO once the last of the slave's holders is gone.
        pipe->reset();
        if (request->tty) stdin_write.reset();
      }
    }
  }
  int wait_status = 0;
  while (waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  master_held.reset();
  int status = status_of(wait_status);
  if (peer_open) send_frame(fd, FrameType::kExited, std::to_string(status));
  return status;
}

void serve_forever(int listener, const Config& config, const Confinement& confinement) {
  signal(SIGCHLD, SIG_IGN);  // the connections' processes are reaped by the kernel
  for (;;) {
    int conn = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (conn < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) continue;
      _exit(exit_code::kFailure);
    }
    pid_t pid = fork();
    if (pid == 0) {
      signal(SIGCHLD, SIG_DFL);
      close(listener);
      _exit(serve_connection(conn, config, confinement) == 0 ? 0 : 1);
    }
    close(conn);
  }
}

std::string status_ready(pid_t pid) { return "ready " + std::to_string(pid) + "\n"; }

std::string status_exit(int status) { return "exit " + std::to_string(status) + "\n"; }

std::string status_failed(int code, std::string_view reason) {
  std::string line = "failed " + std::to_string(code) + " ";
  for (char c : reason) line.push_back(c == '\n' || c == '\r' ? ' ' : c);
  return line + "\n";
}

pid_t start_main(const Config& config, const Confinement& confinement, int status_fd) {
  if (config.argv.empty()) {
    if (status_fd >= 0) send_all(status_fd, status_ready(0));
    return 0;
  }
  ExecRequest request;
  request.argv = config.argv;
  request.workdir = config.workdir;
  ChildFailure start_failure;
  pid_t pid = start(request, config, confinement, 0, 1, 2, &start_failure);
  if (pid < 0) {
    std::string reason = start_failure_message(start_failure, "start " + config.argv[0]);
    console_line(reason);
    if (status_fd >= 0)
      send_all(status_fd, status_failed(start_failure_code(start_failure), reason));
    return -1;
  }
  if (status_fd >= 0) send_all(status_fd, status_ready(pid));
  return pid;
}

int supervise_main(pid_t main_pid, int status_fd, bool reap_all) {
  using Clock = std::chrono::steady_clock;
  // Readable when the main process has ended: no signal handler, no race
  // with a SIGCHLD that came before the wait. Without pidfds (before 5.3),
  // it is looked at once a second.
  UniqueFd ended(main_pid > 0 ? static_cast<int>(syscall(SYS_pidfd_open, main_pid, 0)) : -1);
  bool peer_open = status_fd >= 0;
  bool stopping = false;
  Clock::time_point kill_at = Clock::time_point::max();  // max: no SIGKILL due
  std::string in;
  int status = 0;
  for (;;) {
    int wait_status = 0;
    bool main_ended = false;
    if (main_pid > 0 && waitpid(main_pid, &wait_status, WNOHANG) == main_pid) main_ended = true;
    while (reap_all && !main_ended) {
      pid_t pid = waitpid(-1, &wait_status, WNOHANG);
      if (pid <= 0) break;
      main_ended = pid == main_pid;
    }
    if (main_ended) {
      status = status_of(wait_status);
      break;
    }
    if (main_pid <= 0 && stopping) break;  // no main process: a stop ends the guest

    pollfd fds[2];
    nfds_t count = 0;
    if (peer_open) fds[count++] = {status_fd, POLLIN, 0};
    if (ended) fds[count++] = {ended.get(), POLLIN, 0};
    int timeout = ended && !reap_all ? -1 : 1000;
    if (kill_at != Clock::time_point::max()) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now());
      int left_ms = static_cast<int>(std::max<int64_t>(left.count(), 0));
      timeout = timeout < 0 ? left_ms : std::min(timeout, left_ms);
    }
    int ready = poll(fds, count, timeout);
    if (kill_at != Clock::time_point::max() && Clock::now() >= kill_at) {
      kill(-main_pid, SIGKILL);
      kill_at = Clock::time_point::max();
    }
    if (ready <= 0 || !peer_open || !(fds[0].revents)) continue;  // EINTR included
    char buf[512];
    ssize_t n = read(status_fd, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      // The host is gone: the guest goes on as with no stream.
      peer_open = false;
      continue;
    }
    in.append(buf, static_cast<size_t>(n));
    for (size_t eol; (eol = in.find('\n')) != std::string::npos;) {
      std::string line = in.substr(0, eol);
      in.erase(0, eol + 1);
      std::optional<uint64_t> grace;
      if (line.rfind("stop ", 0) == 0) grace = text::parse_uint(line.substr(5));
      if (!grace) {
        console_line("status stream: an unknown request \"" + line.substr(0, 80) + "\"");
        continue;
      }
      if (stopping) continue;
      stopping = true;
      if (main_pid > 0) {
        kill(-main_pid, SIGTERM);
        kill_at = Clock::now() + std::chrono::milliseconds(std::min<uint64_t>(*grace, 86400000));
      }
    }
    if (in.size() > 4096) in.clear();  // no request is that long
  }
  if (status_fd >= 0) send_all(status_fd, status_exit(status));
  return status;
}

namespace {

// The guest's own names: its hostname, /etc/hosts, and /etc/resolv.conf
// naming the DNS relay, written into the root the sandbox sees (they land
// in the overlay's upper layer) over whatever the image holds there.
void write_names(const Config& config) {
  if (!config.hostname.empty() && sethostname(config.hostname.c_str(), config.hostname.size()) != 0)
    throw_errno("set the hostname " + config.hostname);
  mkdir("/etc", 0755);
  std::string hosts = "127.0.0.1\tlocalhost\n";
  if (!config.hostname.empty()) hosts += "127.0.1.1\t" + config.hostname + "\n";
  files::write_atomically("/etc/hosts", hosts, 0644);
  if (config.dns_port != 0)
    files::write_atomically("/etc/resolv.conf", "nameserver 127.0.0.1\n", 0644);
}

// A relay in a process of its own; the init keeps none of its fds.
void fork_relay(const std::function<void()>& serve, int status_fd) {
  pid_t pid = fork();
  if (pid < 0) throw_errno("fork a relay");
  if (pid == 0) {
    if (status_fd >= 0) close(status_fd);
    serve();
    _exit(exit_code::kFailure);
  }
}

}  // namespace

int run_as_pid1(const std::string& config_path) {
  UniqueFd status;
  try {
    mount_or_throw("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    mount_or_throw("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr);
    mount_or_throw("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
    // exec -t's terminals: /dev/ptmx opens only with a devpts beside it.
    mount_or_throw("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
                   "mode=0620,ptmxmode=0666");
    // Without /dev/console in the initramfs the kernel gave init no stdio.
    if (fcntl(1, F_GETFD) < 0) {
      int console = open("/dev/console", O_RDWR);
      for (int fd = 0; console >= 0 && fd < 3; ++fd)
        if (fd != console) dup2(console, fd);
      if (console > 2) close(console);
    }
    Config config = decode_config(files::read(config_path));
    signal(SIGPIPE, SIG_IGN);
    // First, so that the host hears of every failure after this one.
    if (config.status_port != 0) {
      status = connect_to_host(config.status_port);
      if (!status)
        console_line(errno_message("the status stream to the host's vsock port " +
                                       std::to_string(config.status_port) +
                                       " (going on without it)",
                                   errno));
    }
    if (!config.disk.empty()) {
      mount_or_throw(config.disk.c_str(), "/mnt/lower", "ext4", MS_RDONLY | MS_NODEV, nullptr);
      if (config.layer.empty())
        mount_or_throw("tmpfs", "/mnt/layer", "tmpfs", MS_NODEV, "mode=0755");
      else
        mount_or_throw(config.layer.c_str(), "/mnt/layer", "ext4", MS_NODEV, nullptr);
      mkdir("/mnt/layer/upper", 0755);
      mkdir("/mnt/layer/work", 0700);
      mount_or_throw("overlay", "/mnt/root", "overlay", MS_NODEV,
                     "lowerdir=/mnt/lower,upperdir=/mnt/layer/upper,workdir=/mnt/layer/work");
      for (const char* dir : {"/proc", "/sys", "/dev"}) {
        std::string target = std::string("/mnt/root") + dir;
        mkdir(target.c_str(), 0755);
        if (mount(dir, target.c_str(), nullptr, MS_MOVE, nullptr) != 0)
          throw_errno(std::string("move ") + dir + " to " + target);
      }
      // The initramfs cannot be pivoted away from: move the new root over
      // it and enter it (what switch_root does).
      if (chdir("/mnt/root") != 0) throw_errno("chdir /mnt/root");
      if (mount(".", "/", nullptr, MS_MOVE, nullptr) != 0) throw_errno("move the root to /");
      if (chroot(".") != 0 || chdir("/") != 0) throw_errno("enter the sandbox's root");
      // Into the sandbox's root only: without a disk, / may be a test's
      // host root rather than the initramfs.
      write_names(config);
    }
    // This mount only (the init reads /proc, never writes it).
    if (config.proc_read_only &&
        mount(nullptr, "/proc", nullptr,
              MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, nullptr) != 0)
      throw_errno("make /proc read-only");
    // The relays listen before the main process starts: its first
    // connection finds them.
    if (config.egress_port != 0 || config.dns_port != 0) bring_up_loopback();
    if (config.egress_port != 0) {
      UniqueFd listener = listen_loopback_tcp(kProxyPort);
      fork_relay(
          [&] {
            serve_egress(listener.get(), config.egress_port,
                         [](uint32_t port) { return connect_to_host(port); });
          },
          status.get());
    }
    if (config.dns_port != 0) {
      UniqueFd udp = bind_loopback_udp(kDnsPort);
      fork_relay(
          [&] {
            serve_dns(udp.get(), config.dns_port,
                      [](uint32_t port) { return connect_to_host(port); });
          },
          status.get());
    }
    // Planned inside the sandbox's root, for this (the guest's) kernel: a
    // hard_requirement it cannot meet fails the guest here, on the status
    // stream. Under best effort the policy's missing paths are told once,
    // here, rather than on every command's stderr.
    Confinement confinement = confinement_for(config, landlock::abi_version());
    if (confinement.landlock.enabled)
      console_line("landlock: ABI " + std::to_string(confinement.landlock.abi) + ", " +
                   std::to_string(confinement.landlock.rules.size()) + " rules");
    if (confinement.landlock.warn_missing && !confinement.landlock.hard) {
      std::string missing = missing_landlock_paths(confinement.landlock);
      if (!missing.empty()) console_line("landlock: policy paths not in the sandbox: " + missing);
    }
    pid_t main_pid = start_main(config, confinement, status.get());
    if (main_pid < 0) {
      sync();
      reboot(RB_POWER_OFF);
      return exit_code::kFailure;
    }
    if (config.port != 0) {
      pid_t server = fork();
      if (server == 0) {
        status.reset();
        UniqueFd listener(socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0));
        sockaddr_vm addr{};
        addr.svm_family = AF_VSOCK;
        addr.svm_cid = VMADDR_CID_ANY;
        addr.svm_port = config.port;
        if (!listener ||
            bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
            listen(listener.get(), 16) != 0) {
          console_line(errno_message("vsock port " + std::to_string(config.port), errno));
          _exit(exit_code::kFailure);
        }
        serve_forever(listener.get(), config, confinement);
      }
    }
    int exit_status = supervise_main(main_pid, status.get(), true);
    console_line("the main process exited with status " + std::to_string(exit_status));
    sync();
    reboot(RB_POWER_OFF);
    return exit_code::kFailure;
  } catch (const Error& e) {
    console_line(e.what());
    if (status) send_all(status.get(), status_failed(exit_code::kFailure, e.what()));
    sync();
    reboot(RB_POWER_OFF);
    return exit_code::kFailure;
  }
}

}  // namespace openshell::runtime::guest
