// `openshell oci ...`, also run as `openshell-runc`: the runc command line,
// so that containerd's shim, Podman's conmon and dockerd drive openshell's
// runtime as they drive runc. The commands, their flags, their output and
// their exit statuses (0, else 1) are runc's; see docs/oci.md.
#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <optional>
#include <set>
#include <thread>

#include <CLI/CLI.hpp>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/packet.h"
#include "base/text.h"
#include "base/unique_fd.h"
#include "cli/commands.h"
#include "cli/egress_thread.h"
#include "cli/oci.h"
#include "cli/table.h"
#include "cli/terminal.h"
#include "oci/config.h"
#include "oci/monitor.h"
#include "oci/state.h"
#include "runtime/init_protocol.h"

namespace openshell::cli {

namespace {

using nlohmann::json;

struct Globals {
  std::string root;
  std::string log_file;
  std::string log_format = "text";
  bool debug = false;
  bool systemd_cgroup = false;
  std::string rootless = "auto";
};

std::string absolute(const std::string& path) {
  if (!path.empty() && path[0] == '/') return path;
  char cwd[4096];
  if (!::getcwd(cwd, sizeof cwd)) throw_errno("getcwd");
  return path.empty() || path == "." ? std::string(cwd) : std::string(cwd) + "/" + path;
}

void make_dirs(const std::string& path) {
  for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
    std::string part = slash == std::string::npos ? path : path.substr(0, slash);
    if (::mkdir(part.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + part);
    if (slash == std::string::npos) break;
  }
}

int parse_signal(const std::string& text) {
  if (auto n = text::parse_uint(text, 64); n && *n > 0) return static_cast<int>(*n);
  std::string name = text;
  for (char& c : name) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (name.rfind("SIG", 0) == 0) name = name.substr(3);
  for (int sig = 1; sig < NSIG; ++sig) {
    const char* abbrev = sigabbrev_np(sig);
    if (abbrev && name == abbrev) return sig;
  }
  if (name.rfind("RTMIN+", 0) == 0)
    if (auto n = text::parse_uint(name.substr(6), 30)) return SIGRTMIN + static_cast<int>(*n);
  throw Error("unknown signal \"" + text + "\"");
}

// The container's init, by a pidfd checked against the recorded start time
// (a pid reused since is not the container's).
UniqueFd init_pidfd(const oci::State& state) {
  if (oci::live_status(state) == "stopped") return {};
  UniqueFd fd(static_cast<int>(::syscall(SYS_pidfd_open, state.pid, 0)));
  if (fd && oci::process_start(state.pid) != state.pid_start) return {};
  return fd;
}

// Waits up to timeout_ms for the pidfd to say its process ended.
bool wait_gone(int pidfd, int timeout_ms) {
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, timeout_ms) > 0;
}

// A monitor's reply: "ok", or Error with its message.
std::vector<std::string> monitor_reply(int fd, PacketFds* fds = nullptr) {
  std::string packet;
  PacketFds ignored;
  long n = receive_packet(fd, &packet, fds ? fds : &ignored);
  if (n <= 0) throw Error("the container's monitor ended without an answer");
  runtime::InitMessage m = runtime::parse_message(packet);
  std::vector<std::string> parts;
  parts.push_back(packet.substr(0, packet.find('\0')));
  parts.insert(parts.end(), m.fields.begin(), m.fields.end());
  if (parts[0] == "error") {
    int code = parts.size() > 1 ? std::atoi(parts[1].c_str()) : 1;
    throw Error(parts.size() > 2 ? parts[2] : "failed", code > 0 ? code : 1);
  }
  return parts;
}

// What run and exec pass on to the container's process.
sigset_t forwarded_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGWINCH})
    sigaddset(&set, sig);
  return set;
}

// --- create / start / run -------------------------------------------------

struct CreateFlags {
  std::string id;
  std::string bundle = ".";
  std::string pid_file;
  std::string console_socket;
  int preserve_fds = 0;
  bool no_pivot = false;
  bool no_new_keyring = false;
  bool detach = false;
  bool keep = false;
};

void write_pid_file(const std::string& path, pid_t pid) {
  if (path.empty()) return;
  files::write_atomically(absolute(path), std::to_string(pid), 0644);
}

// --preserve-fds N: fds 3 to 3+N-1 of this process, each open, go to the
// process as the same numbers (runc's meaning).
void check_preserve_fds(int n) {
  if (n < 0 || n > kMaxExtraFds)
    throw Error("--preserve-fds " + std::to_string(n) + ": between 0 and " +
                std::to_string(kMaxExtraFds));
  for (int fd = 3; fd < 3 + n; ++fd)
    if (::fcntl(fd, F_GETFD) < 0)
      throw Error("--preserve-fds " + std::to_string(n) + ": fd " + std::to_string(fd) +
                  " is not open");
}

// Starts the monitor and returns the init's pid once the container is
// created; throws Error (and leaves nothing) otherwise.
pid_t create_container(const Globals& g, const CreateFlags& f) {
  oci::check_id(f.id);
  check_preserve_fds(f.preserve_fds);
  auto bundle = oci::read_bundle(absolute(f.bundle));
  make_dirs(g.root);
  const std::string dir = g.root + "/" + f.id;
  if (::mkdir(dir.c_str(), 0700) != 0) {
    if (errno == EEXIST) throw Error("container with id " + f.id + " already exists");
    throw_errno("create " + dir);
  }
  Pipe report = Pipe::create();
  oci::CreateOptions options{f.id, g.root,
                             f.console_socket.empty() ? "" : absolute(f.console_socket)};
  std::fflush(nullptr);
  pid_t monitor = ::fork();
  if (monitor < 0) {
    int err = errno;
    files::remove_tree(dir);
    throw_errno("fork the monitor", err);
  }
  if (monitor == 0) {
    report.read.reset();
    ::setsid();
    // Nothing of the engine's beyond stdio (and --preserve-fds' fds) stays
    // open here: it may wait for the ends of pipes it gave create. The
    // report goes to 3, the preserved fds to 4, 5, ...: each moved above
    // where any of them goes first, then into place.
    const int n = f.preserve_fds, above = 4 + n;
    int report_fd = ::fcntl(report.write.get(), F_DUPFD_CLOEXEC, above);
    report.write.reset();
    std::vector<int> kept;
    for (int i = 0; i < n; ++i) kept.push_back(::fcntl(3 + i, F_DUPFD_CLOEXEC, above));
    ::dup3(report_fd, 3, O_CLOEXEC);
    for (int i = 0; i < n; ++i) ::dup3(kept[static_cast<size_t>(i)], 4 + i, O_CLOEXEC);
    ::close_range(static_cast<unsigned>(above), ~0U, 0);
    options.preserve_fds = n;
    options.start_egress = [](runtime::Container& container, const runtime::ContainerSpec& spec,
                              const policy::Policy& policy,
                              std::unique_ptr<logfile::RotatingFile> log) -> std::shared_ptr<void> {
      return std::make_shared<EgressThread>(container, spec, policy, std::move(log));
    };
    // The monitor's own lines go to --log only: its stderr is the container's.
    if (!g.log_file.empty()) {
      int fd = ::open(g.log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
      log::set_file(fd, g.log_format == "json", false);
    } else {
      log::set_file(-1, false, false);
    }
    ::_exit(oci::run_monitor(std::move(bundle), options, 3));
  }
  report.write.reset();
  std::string answer;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(report.read.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    answer.append(buf, static_cast<size_t>(n));
  }
  if (answer.rfind("ok ", 0) == 0) {
    pid_t pid = static_cast<pid_t>(std::atoi(answer.c_str() + 3));
    return pid;
  }
  // The monitor failed and is gone (or going): nothing of it stays.
  int status = 0;
  ::waitpid(monitor, &status, 0);
  try {
    files::remove_tree(dir);
  } catch (const Error& e) {
    log::warn(e.what());
  }
  if (answer.rfind("error ", 0) == 0) {
    size_t space = answer.find(' ', 6);
    int code = std::atoi(answer.c_str() + 6);
    std::string message = space == std::string::npos ? answer : answer.substr(space + 1);
    while (!message.empty() && message.back() == '\n') message.pop_back();
    throw Error(message, code > 0 ? code : 1);
  }
  throw Error("the container's monitor ended before the container was created");
}

void start_container(const Globals& g, const std::string& id) {
  oci::State state = oci::read_state(g.root, id);
  const std::string status = oci::live_status(state);
  if (status != "created")
    throw Error("cannot start a container that is " + status + " (" + id + ")");
  UniqueFd fd(oci::connect_monitor(g.root, id));
  if (send_packet(fd.get(), runtime::make_message({"start"}), nullptr, 0) != 0)
    throw Error("container " + id + ": its monitor does not listen");
  monitor_reply(fd.get());
}

std::string freezer_knob(const oci::State& state, bool* v2) {
  for (const auto& dir : state.cgroup_dirs) {
    if (files::exists(dir + "/freezer.state")) {
      *v2 = false;
      return dir + "/freezer.state";
    }
    if (files::exists(dir + "/cgroup.freeze")) {
      *v2 = true;
      return dir + "/cgroup.freeze";
    }
  }
  throw Error("container " + state.id +
              " has no freezer cgroup (pause needs config.json's linux.cgroupsPath)");
}

// Removes what is left of a stopped container: its cgroups, its record;
// runs its poststop hooks. With force, a live one is killed first.
// A container that does not exist is deleted with --force (as runc): what
// an aborted create left (a directory without state.json) goes too.
void delete_container(const Globals& g, const std::string& id, bool force) {
  oci::check_id(id);
  if (force && !files::exists(g.root + "/" + id + "/state.json")) {
    files::remove_tree(g.root + "/" + id);
    return;
  }
  oci::State state = oci::read_state(g.root, id);
  const std::string status = oci::live_status(state);
  if ((status == "running" || status == "paused") && !force)
    throw Error("cannot delete container " + id + " that is not stopped: " + status +
                " (use --force)");
  if (status == "paused") {
    // Frozen processes die of SIGKILL only once thawed.
    bool v2 = false;
    files::write_once(freezer_knob(state, &v2), v2 ? "0" : "THAWED");
  }
  if (status != "stopped") {
    UniqueFd pidfd = init_pidfd(state);
    if (pidfd) {
      ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0);
      if (!wait_gone(pidfd.get(), 10000)) log::warn("container " + id + " did not end in 10 s");
    }
  }
  // The monitor ends with the init and removes the cgroups; wait for it.
  if (state.monitor_pid > 0) {
    UniqueFd monitor(static_cast<int>(::syscall(SYS_pidfd_open, state.monitor_pid, 0)));
    if (monitor) wait_gone(monitor.get(), 5000);
  }
  for (auto it = state.cgroup_dirs.rbegin(); it != state.cgroup_dirs.rend(); ++it)
    for (int attempt = 0; attempt < 200; ++attempt) {
      if (::rmdir(it->c_str()) == 0 || errno == ENOENT) break;
      if (errno != EBUSY) break;
      ::usleep(10000);
    }
  // poststop: from the bundle's config, when it is still there.
  try {
    if (files::exists(state.bundle + "/config.json")) {
      auto bundle = oci::read_bundle(state.bundle, oci::ReadFor::kInspect);
      if (!bundle->poststop.empty()) {
        std::string why = runtime::run_hooks(bundle->poststop, runtime::HookStage::kPoststop,
                                             oci::spec_state(state, "stopped").dump());
        if (!why.empty()) log::warn(why);
      }
    }
  } catch (const Error& e) {
    log::warn(std::string("poststop hooks: ") + e.what());
  }
  files::remove_tree(g.root + "/" + id);
}

// Relays a terminal's master both ways with our own stdio (raw mode).
void relay_terminal(int master, int stop_fd) {
  RawMode raw(0);
  char buf[8192];
  pollfd fds[3] = {{0, POLLIN, 0}, {master, POLLIN, 0}, {stop_fd, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, stop_fd >= 0 ? 3 : 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents) {
      ssize_t n = ::read(master, buf, sizeof buf);
      if (n <= 0) return;
      if (::write(1, buf, static_cast<size_t>(n)) < 0) return;
    }
    if (fds[0].revents) {
      ssize_t n = ::read(0, buf, sizeof buf);
      if (n <= 0) {
        fds[0].fd = -1;
      } else if (::write(master, buf, static_cast<size_t>(n)) < 0) {
        return;
      }
    }
    if (stop_fd >= 0 && fds[2].revents) return;
  }
}

// A console socket of our own, for a foreground terminal: its path, and
// the listener.
std::pair<std::string, UniqueFd> own_console_socket(const std::string& root,
                                                    const std::string& id) {
  const std::string path = root + "/" + id + ".console";
  ::unlink(path.c_str());
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  UniqueFd dir;
  sockaddr_un addr = oci::unix_address(path, &dir);
  if (!fd || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(fd.get(), 1) != 0)
    throw_errno("listen on " + path);
  return {path, std::move(fd)};
}

int receive_console(int listener) {
  UniqueFd conn(::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC));
  if (!conn) throw_errno("accept the terminal");
  std::string name;
  PacketFds fds;
  if (receive_packet(conn.get(), &name, &fds) <= 0 || !fds[0]) throw Error("no terminal came");
  return fds[0].release();
}

int run_container(const Globals& g, CreateFlags f) {
  block_forwarded_signals();
  auto bundle = oci::read_bundle(absolute(f.bundle), oci::ReadFor::kInspect);
  const bool terminal = bundle->terminal;
  bundle.reset();
  std::optional<std::pair<std::string, UniqueFd>> console;
  if (terminal && f.console_socket.empty() && !f.detach) {
    make_dirs(g.root);
    console = own_console_socket(g.root, f.id);
    f.console_socket = console->first;
  }
  pid_t pid;
  UniqueFd master;
  std::thread accepter;
  int master_fd = -1;
  if (console)
    accepter = std::thread([&] {
      try {
        master_fd = receive_console(console->second.get());
      } catch (const Error&) {
      }
    });
  try {
    pid = create_container(g, f);
  } catch (...) {
    if (console) {
      // The accept returns once the listener is shut down; then it goes.
      ::shutdown(console->second.get(), SHUT_RDWR);
      if (accepter.joinable()) accepter.join();
      if (master_fd >= 0) ::close(master_fd);
      console->second.reset();
      ::unlink(console->first.c_str());
    }
    throw;
  }
  if (accepter.joinable()) accepter.join();
  if (console) ::unlink(console->first.c_str());
  master.reset(master_fd);
  write_pid_file(f.pid_file, pid);
  try {
    start_container(g, f.id);
  } catch (...) {
    delete_container(g, f.id, true);
    throw;
  }
  if (f.detach) return 0;
  // The init is our child (the monitor made it so): its status is ours.
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  std::thread relay;
  if (master) relay = std::thread([&] { relay_terminal(master.get(), pidfd.get()); });
  // Forward the signals a caller sends to the container.
  const sigset_t set = forwarded_signals();
  UniqueFd signals(::signalfd(-1, &set, SFD_CLOEXEC));
  int status = 0;
  for (;;) {
    pollfd fds[2] = {{pidfd.get(), POLLIN, 0}, {signals.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) break;
    if (fds[1].revents) {
      signalfd_siginfo info;
      if (::read(signals.get(), &info, sizeof info) == sizeof info)
        ::syscall(SYS_pidfd_send_signal, pidfd.get(), info.ssi_signo, nullptr, 0);
    }
    if (fds[0].revents) break;
  }
  int wstatus = 0;
  if (::waitpid(pid, &wstatus, 0) == pid)
    status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  if (relay.joinable()) relay.join();
  if (!f.keep) delete_container(g, f.id, true);
  return status;
}

// --- exec -------------------------------------------------------------------

struct ExecFlags {
  std::string id;
  std::vector<std::string> command;
  std::string process_file;
  std::string console_socket;
  std::string cwd;
  std::vector<std::string> env;
  std::string user;
  bool tty = false;
  bool detach = false;
  std::string pid_file;
  std::vector<std::string> additional_gids;
  std::vector<std::string> cap;
  bool no_new_privs = false;
  int preserve_fds = 0;
};

runtime::ExecRequest exec_request(const oci::State& state, const ExecFlags& f) {
  runtime::ExecRequest r;
  if (!f.process_file.empty()) {
    auto text = files::try_read(absolute(f.process_file));
    if (!text) throw Error(errno_message("read " + f.process_file, errno));
    json p = json::parse(*text, nullptr, false);
    if (p.is_discarded()) throw Error(f.process_file + ": not valid JSON");
    // The same reader as config.json's process, on a config that holds it.
    json config = {{"ociVersion", "1.0.2"},
                   {"root", {{"path", state.rootfs}}},
                   {"process", p},
                   {"linux", json::object()}};
    auto bundle = oci::bundle_from_json(config, state.bundle);
    r = bundle->process;
    r.main = false;
    if (bundle->spec.uid != 0 || bundle->spec.gid != 0)
      r.user = runtime::ExecUser{bundle->spec.uid, bundle->spec.gid};
  } else {
    if (f.command.empty()) throw Error("exec needs a command (or --process FILE)");
    r.argv = f.command;
    r.tty = f.tty;
    r.workdir = f.cwd.empty() ? "/" : f.cwd;
    // The main process's environment, from the bundle, then --env.
    try {
      auto bundle = oci::read_bundle(state.bundle, oci::ReadFor::kInspect);
      r.env = bundle->process.env;
      if (f.cwd.empty()) r.workdir = bundle->process.workdir;
    } catch (const Error&) {
      r.env = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"};
    }
    for (const auto& e : f.env) {
      if (e.find('=') == std::string::npos) throw Error("--env " + e + ": not KEY=VALUE");
      const std::string key = e.substr(0, e.find('='));
      std::erase_if(r.env, [&](const std::string& x) { return x.rfind(key + "=", 0) == 0; });
      r.env.push_back(e);
    }
    if (!f.user.empty()) {
      auto parts = text::split(f.user, ':');
      auto uid = text::parse_uint(parts[0], 0xFFFFFFFE);
      auto gid =
          parts.size() > 1 ? text::parse_uint(parts[1], 0xFFFFFFFE) : std::optional<uint64_t>(0);
      if (!uid || !gid || parts.size() > 2) throw Error("--user " + f.user + ": not UID[:GID]");
      r.user = runtime::ExecUser{static_cast<uint32_t>(*uid), static_cast<uint32_t>(*gid)};
    }
  }
  if (!f.cap.empty())
    throw Error("--cap: not supported (an exec has the container's capabilities)");
  if (!f.additional_gids.empty()) throw Error("--additional-gids: not supported yet");
  terminal_size(&r.rows, &r.cols);
  return r;
}

// Waits for the exec's end on the monitor connection, passing on the
// signals this process gets; returns its status.
int follow_exec(int conn) {
  const sigset_t set = forwarded_signals();
  ::sigprocmask(SIG_BLOCK, &set, nullptr);
  UniqueFd signals(::signalfd(-1, &set, SFD_CLOEXEC));
  for (;;) {
    pollfd fds[2] = {{conn, POLLIN, 0}, {signals.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return 1;
    }
    if (fds[1].revents) {
      signalfd_siginfo info;
      if (::read(signals.get(), &info, sizeof info) == sizeof info)
        send_packet(conn, runtime::make_message({"kill", std::to_string(info.ssi_signo)}), nullptr,
                    0);
    }
    if (fds[0].revents) {
      auto parts = monitor_reply(conn);
      if (parts[0] == "exited" && parts.size() > 1) return std::atoi(parts[1].c_str());
    }
  }
}

int exec_in_container(const Globals& g, const ExecFlags& f) {
  oci::State state = oci::read_state(g.root, f.id);
  const std::string status = oci::live_status(state);
  if (status == "stopped") throw Error("cannot exec in a stopped container (" + f.id + ")");
  runtime::ExecRequest request = exec_request(state, f);
  if (request.tty && f.detach && f.console_socket.empty())
    throw Error("--tty with --detach needs --console-socket");
  check_preserve_fds(f.preserve_fds);
  UniqueFd conn(oci::connect_monitor(g.root, f.id));
  // stdio, then --preserve-fds' fds, which the process gets as 3, 4, ...
  int fds_out[kMaxPacketFds];
  for (int i = 0; i < 3 + f.preserve_fds; ++i) fds_out[i] = i;
  if (send_packet(conn.get(), runtime::encode_exec(request), fds_out, 3 + f.preserve_fds) != 0)
    throw Error("container " + f.id + ": its monitor does not listen");
  PacketFds fds;
  auto started = monitor_reply(conn.get(), &fds);
  if (started[0] != "started") throw Error("unexpected answer from the monitor: " + started[0]);
  UniqueFd master = std::move(fds[0]);
  if (master && !f.console_socket.empty()) {
    oci::send_console(absolute(f.console_socket), master.get());
    master.reset();
  }
  if (f.detach) {
    // A relay stays for the engine to watch: it ends with the process's
    // status, and passes on the signals sent to it.
    std::fflush(nullptr);
    pid_t relay = ::fork();
    if (relay < 0) throw_errno("fork");
    if (relay == 0) {
      UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
      for (int i = 0; i < 3 && null; ++i) ::dup2(null.get(), i);
      log::set_file(-1, false, false);
      int code = 1;
      try {
        code = follow_exec(conn.get());
      } catch (...) {
      }
      ::_exit(code);
    }
    write_pid_file(f.pid_file, relay);
    return 0;
  }
  write_pid_file(f.pid_file, ::getpid());
  std::thread relay;
  Pipe stop = Pipe::create();
  if (master) relay = std::thread([&] { relay_terminal(master.get(), stop.read.get()); });
  int code = follow_exec(conn.get());
  stop.write.reset();
  if (relay.joinable()) relay.join();
  return code;
}

// --- the rest -------------------------------------------------------------

json features() {
  json caps = json::array();
  for (int c = 0; c <= 40; ++c) {
    std::string name = runtime::caps::describe(runtime::caps::Set{1} << c);
    if (!name.empty()) caps.push_back(name);
  }
  return {
      {"ociVersionMin", "1.0.0"},
      {"ociVersionMax", "1.2.0"},
      {"hooks",
       {"prestart", "createRuntime", "createContainer", "startContainer", "poststart", "poststop"}},
      {"mountOptions",
       {"ro", "rw", "nosuid", "suid", "nodev", "dev", "noexec", "exec", "bind", "rbind", "private",
        "rprivate", "slave", "rslave", "relatime", "strictatime", "noatime"}},
      {"linux",
       {{"namespaces", {"cgroup", "ipc", "mount", "network", "pid", "user", "uts"}},
        {"capabilities", caps},
        {"cgroup", {{"v1", true}, {"v2", true}, {"systemd", false}, {"systemdUser", false}}},
        {"seccomp",
         {{"enabled", true},
          {"actions",
           {"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO", "SCMP_ACT_KILL", "SCMP_ACT_KILL_PROCESS",
            "SCMP_ACT_KILL_THREAD", "SCMP_ACT_LOG", "SCMP_ACT_TRACE", "SCMP_ACT_TRAP"}},
          {"operators",
           {"SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_LE", "SCMP_CMP_LT",
            "SCMP_CMP_MASKED_EQ", "SCMP_CMP_NE"}}}},
        {"apparmor", {{"enabled", false}}},
        {"selinux", {{"enabled", false}}}}},
      {"annotations",
       {{"org.openshell.policy", "a policy file's path (read, not applied yet: docs/oci.md)"}}}};
}

// For `exec`: removes and returns the words after the container's id (the
// first word after "exec" that is neither a flag nor a flag's value).
std::vector<std::string> exec_command(std::vector<char*>* args) {
  static const std::set<std::string> with_value = {"--root",
                                                   "--log",
                                                   "--log-format",
                                                   "--rootless",
                                                   "--criu",
                                                   "-p",
                                                   "--process",
                                                   "--console-socket",
                                                   "--cwd",
                                                   "-e",
                                                   "--env",
                                                   "-u",
                                                   "--user",
                                                   "--pid-file",
                                                   "-g",
                                                   "--additional-gids",
                                                   "-c",
                                                   "--cap",
                                                   "--preserve-fds",
                                                   "--process-label",
                                                   "--apparmor",
                                                   "--cgroup"};
  size_t i = 1;
  while (i < args->size() && std::strcmp((*args)[i], "exec") != 0) {
    // Global flags come first; a value of one may be "exec" only after it.
    if (with_value.count((*args)[i])) ++i;
    ++i;
  }
  if (i >= args->size()) return {};
  for (++i; i < args->size(); ++i) {
    const std::string word = (*args)[i];
    if (word == "--") {
      args->erase(args->begin() + static_cast<long>(i));
      break;
    }
    if (word.empty() || word[0] != '-') break;
    if (with_value.count(word)) ++i;
  }
  // i: the id; after it, the command.
  std::vector<std::string> command;
  if (i + 1 < args->size()) {
    for (size_t j = i + 1; j < args->size(); ++j) command.emplace_back((*args)[j]);
    args->resize(i + 1);
  }
  return command;
}

void add_create_flags(CLI::App* cmd, CreateFlags* f) {
  cmd->add_option("-b,--bundle", f->bundle, "The bundle directory (config.json, rootfs)")
      ->type_name("DIR");
  cmd->add_option("--pid-file", f->pid_file, "Write the container init's pid here")
      ->type_name("FILE");
  cmd->add_option("--console-socket", f->console_socket,
                  "A unix socket to send the terminal's master to (process.terminal)")
      ->type_name("PATH");
  cmd->add_option("--preserve-fds", f->preserve_fds,
                  "Pass fds 3 to 3+N-1 on to the process, as the same numbers")
      ->type_name("N");
  cmd->add_flag("--no-pivot", f->no_pivot, "Accepted; openshell always pivots");
  cmd->add_flag("--no-new-keyring", f->no_new_keyring, "Accepted; the session keyring stays");
}

}  // namespace

int oci_main(int argc, char** argv) {
  Globals g;
  Action action;
  CLI::App app{
      "openshell's OCI runtime: the runc command line over openshell's sandboxes "
      "(engines call it as openshell-runc).",
      "openshell-runc"};
  app.require_subcommand(1);
  app.fallthrough(true);
  app.set_version_flag("-v,--version",
                       std::string("openshell-runc ") + OPENSHELL_VERSION + "\nspec: 1.2.0");
  app.add_option("--root", g.root,
                 "Where containers' state lives (default: " + oci::default_state_root() + ")")
      ->type_name("DIR");
  app.add_option("--log", g.log_file, "Write diagnostics to this file too")->type_name("FILE");
  app.add_option("--log-format", g.log_format, "text or json")
      ->check(CLI::IsMember({"text", "json"}));
  app.add_flag("--debug", g.debug, "Say more");
  app.add_flag("--systemd-cgroup", g.systemd_cgroup, "Refused: openshell manages cgroups itself");
  app.add_option("--rootless", g.rootless, "Accepted (true, false, auto): openshell decides");
  std::string criu;
  app.add_option("--criu", criu, "Accepted; checkpoints are not supported")->group("");
  app.footer(
      "Exit status: 0, else 1 (as runc's); run's and exec's: the process's own.\n"
      "See openshell-oci(1) and docs/oci.md.");

  CreateFlags create;
  auto* c = app.add_subcommand("create", "Create a container from a bundle; `start` runs it");
  c->add_option("id", create.id, "The container's id")->required();
  add_create_flags(c, &create);
  c->callback([&] {
    action = [&] {
      write_pid_file(create.pid_file, create_container(g, create));
      return 0;
    };
  });

  std::string start_id;
  auto* s = app.add_subcommand("start", "Run a created container's process");
  s->add_option("id", start_id, "The container's id")->required();
  s->callback([&] {
    action = [&] {
      start_container(g, start_id);
      return 0;
    };
  });

  CreateFlags run;
  auto* r = app.add_subcommand("run", "Create and start a container, and wait for it");
  r->add_option("id", run.id, "The container's id")->required();
  add_create_flags(r, &run);
  r->add_flag("-d,--detach", run.detach, "Return once it runs");
  r->add_flag("--keep", run.keep, "Keep its record after it ends (delete it later)");
  r->callback([&] { action = [&] { return run_container(g, run); }; });

  std::string state_id;
  auto* st = app.add_subcommand("state", "Print a container's state (JSON)");
  st->add_option("id", state_id, "The container's id")->required();
  st->callback([&] {
    action = [&] {
      oci::State state = oci::read_state(g.root, state_id);
      std::cout << oci::spec_state(state, oci::live_status(state)).dump(2) << "\n";
      return 0;
    };
  });

  std::string kill_id, kill_signal = "SIGTERM";
  bool kill_all = false;
  auto* k =
      app.add_subcommand("kill", "Send a signal to a container's init (or all its processes)");
  k->add_option("id", kill_id, "The container's id")->required();
  k->add_option("signal", kill_signal, "Name or number (default SIGTERM)");
  k->add_flag("-a,--all", kill_all, "Every process of the container");
  k->callback([&] {
    action = [&] {
      const int sig = parse_signal(kill_signal);
      oci::State state = oci::read_state(g.root, kill_id);
      UniqueFd pidfd = init_pidfd(state);
      if (!pidfd) throw Error("container " + kill_id + " is not running");
      if (kill_all) {
        for (pid_t pid : oci::container_pids(state)) ::kill(pid, sig);
        return 0;
      }
      if (::syscall(SYS_pidfd_send_signal, pidfd.get(), sig, nullptr, 0) != 0)
        throw_errno("signal container " + kill_id);
      return 0;
    };
  });

  std::string delete_id;
  bool force = false;
  auto* d = app.add_subcommand("delete", "Remove a stopped container (--force: any)");
  d->add_option("id", delete_id, "The container's id")->required();
  d->add_flag("-f,--force", force, "Kill it first if it runs");
  d->callback([&] {
    action = [&] {
      delete_container(g, delete_id, force);
      return 0;
    };
  });

  ExecFlags exec;
  auto* e = app.add_subcommand(
      "exec", "Run another process in a running container: exec [OPTIONS] ID COMMAND [ARG...]");
  e->add_option("id", exec.id, "The container's id")->required();
  e->add_option("-p,--process", exec.process_file, "A process.json (runtime-spec) instead")
      ->type_name("FILE");
  e->add_option("--console-socket", exec.console_socket, "Where its terminal's master goes")
      ->type_name("PATH");
  e->add_option("--cwd", exec.cwd, "Its working directory")->type_name("DIR");
  e->add_option("-e,--env", exec.env, "KEY=VALUE, more than once")->type_name("KEY=VALUE");
  e->add_option("-u,--user", exec.user, "UID[:GID]")->type_name("UID[:GID]");
  e->add_flag("-t,--tty", exec.tty, "A terminal");
  e->add_flag("-d,--detach", exec.detach, "Return once it runs");
  e->add_option("--pid-file", exec.pid_file, "Write its pid (the process an engine watches)")
      ->type_name("FILE");
  e->add_option("-g,--additional-gids", exec.additional_gids, "Not yet");
  e->add_option("-c,--cap", exec.cap, "Refused: an exec has the container's capabilities");
  e->add_flag("--no-new-privs", exec.no_new_privs, "Always on");
  e->add_option("--preserve-fds", exec.preserve_fds,
                "Pass fds 3 to 3+N-1 on to the process, as the same numbers");
  e->callback([&] { action = [&] { return exec_in_container(g, exec); }; });

  std::string ps_id, ps_format = "table";
  auto* p = app.add_subcommand("ps", "List a container's processes");
  p->add_option("id", ps_id, "The container's id")->required();
  p->add_option("-f,--format", ps_format, "table or json")->check(CLI::IsMember({"table", "json"}));
  p->callback([&] {
    action = [&] {
      oci::State state = oci::read_state(g.root, ps_id);
      auto pids = oci::container_pids(state);
      if (ps_format == "json") {
        std::cout << json(pids).dump() << "\n";
      } else {
        std::cout << "PID\n";
        for (pid_t pid : pids) std::cout << pid << "\n";
      }
      return 0;
    };
  });

  std::string list_format = "table";
  bool quiet = false;
  auto* l = app.add_subcommand("list", "List containers");
  l->alias("ls");
  l->add_option("-f,--format", list_format, "table or json")
      ->check(CLI::IsMember({"table", "json"}));
  l->add_flag("-q,--quiet", quiet, "Ids only");
  l->callback([&] {
    action = [&] {
      json all = json::array();
      std::vector<std::vector<std::string>> rows;
      for (const auto& id : oci::list_ids(g.root)) {
        try {
          oci::State state = oci::read_state(g.root, id);
          json j = oci::spec_state(state, oci::live_status(state));
          all.push_back(j);
          const passwd* owner = ::getpwuid(state.owner);
          rows.push_back({id, std::to_string(j["pid"].get<int>()), j["status"], state.bundle,
                          state.created, owner ? owner->pw_name : std::to_string(state.owner)});
        } catch (const Error&) {
        }
      }
      if (quiet) {
        for (const auto& row : rows) std::cout << row[0] << "\n";
      } else if (list_format == "json") {
        std::cout << all.dump() << "\n";
      } else {
        rows.insert(rows.begin(), {"ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER"});
        std::cout.flush();
        print_table(rows);
      }
      return 0;
    };
  });

  std::string pause_id, resume_id;
  auto* pa = app.add_subcommand("pause", "Freeze every process of a container");
  pa->add_option("id", pause_id, "The container's id")->required();
  pa->callback([&] {
    action = [&] {
      oci::State state = oci::read_state(g.root, pause_id);
      bool v2 = false;
      files::write(freezer_knob(state, &v2), v2 ? "1" : "FROZEN");
      return 0;
    };
  });
  auto* re = app.add_subcommand("resume", "Thaw a paused container");
  re->add_option("id", resume_id, "The container's id")->required();
  re->callback([&] {
    action = [&] {
      oci::State state = oci::read_state(g.root, resume_id);
      bool v2 = false;
      files::write(freezer_knob(state, &v2), v2 ? "0" : "THAWED");
      return 0;
    };
  });

  auto* fe = app.add_subcommand("features", "What this runtime supports (JSON)");
  fe->callback([&] {
    action = [&] {
      std::cout << features().dump(2) << "\n";
      return 0;
    };
  });

  std::string spec_bundle = ".";
  bool spec_rootless = false;
  auto* sp = app.add_subcommand("spec", "Write an example config.json");
  sp->add_option("-b,--bundle", spec_bundle, "Into this directory")->type_name("DIR");
  sp->add_flag("--rootless", spec_rootless, "For an ordinary user");
  sp->callback([&] {
    action = [&] {
      const std::string path = absolute(spec_bundle) + "/config.json";
      if (files::exists(path)) throw Error(path + " exists already");
      files::write_atomically(path, oci::example_config(spec_rootless).dump(2) + "\n", 0644);
      return 0;
    };
  });

  if (argc == 1) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  }
  // exec ID COMMAND [ARG...]: what follows the id is the command's, flags
  // and all (`exec ID sh -c ...`), taken out before the flags are parsed.
  std::vector<char*> args(argv, argv + argc);
  exec.command = exec_command(&args);
  try {
    app.parse(static_cast<int>(args.size()), args.data());
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    log::error(e.what());
    return 1;
  }
  UniqueFd log_fd;
  if (!g.log_file.empty()) {
    log_fd.reset(::open(g.log_file.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644));
    if (log_fd) log::set_file(log_fd.get(), g.log_format == "json", true);
  }
  log::set_verbose(g.debug);
  if (g.root.empty()) g.root = oci::default_state_root();
  g.root = absolute(g.root);
  try {
    if (g.systemd_cgroup)
      throw Error(
          "--systemd-cgroup is not supported: openshell manages cgroups itself (use "
          "the engine's cgroupfs manager)");
    return action ? action() : 1;
  } catch (const Error& e) {
    log::error(e.what());
    // runc's statuses: 1 for its own failures; a process that could not be
    // executed keeps 126/127 (a shell's, which engines pass on).
    return e.exit_code() == exit_code::kCannotExecute || e.exit_code() == exit_code::kNotFound
               ? e.exit_code()
               : 1;
  } catch (const std::exception& e) {
    log::error(e.what());
    return 1;
  }
}

}  // namespace openshell::cli
