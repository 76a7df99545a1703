#include "oci/monitor.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/logfile.h"
#include "base/packet.h"
#include "base/text.h"
#include "base/time.h"
#include "base/unique_fd.h"
#include "namespaces/id_pool.h"
#include "namespaces/userns.h"
#include "oci/state.h"
#include "runtime/container.h"
#include "runtime/init_protocol.h"

namespace openshell::oci {

namespace {

constexpr uint64_t kMainId = 1;

std::string error_reply(int code, const std::string& message) {
  return runtime::make_message({"error", std::to_string(code), message});
}

// As root, the mount points the config names are made in the root before
// the start, by root on the host, as runc makes them: the sandbox's own
// ids may not write an engine's root (its owners are not theirs). Each
// path resolves inside the root (RESOLVE_IN_ROOT): a symlink in the image
// cannot point it at the host.
void make_mount_point(int root, const std::string& target, bool directory) {
  std::string path;
  auto parts = text::split(target, '/');
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].empty()) continue;
    path += (path.empty() ? "" : "/") + parts[i];
    const bool last = i + 1 == parts.size();
    open_how how{};
    how.flags = O_PATH | O_CLOEXEC;
    how.resolve = RESOLVE_IN_ROOT;
    int fd = static_cast<int>(::syscall(SYS_openat2, root, path.c_str(), &how, sizeof how));
    if (fd >= 0) {
      ::close(fd);
      continue;
    }
    if (errno != ENOENT) return;  // the child says why, if it matters
    // The parent exists (made or found above); the missing part is made
    // below it, through a fd that resolved inside the root.
    const size_t slash = path.rfind('/');
    const std::string parent = slash == std::string::npos ? "." : path.substr(0, slash);
    const std::string name = slash == std::string::npos ? path : path.substr(slash + 1);
    how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
    UniqueFd dir(static_cast<int>(::syscall(SYS_openat2, root, parent.c_str(), &how, sizeof how)));
    if (!dir) return;
    if (!last || directory) {
      if (::mkdirat(dir.get(), name.c_str(), 0755) != 0 && errno != EEXIST) return;
    } else {
      UniqueFd dir_rw(::openat(dir.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
      int made = dir_rw ? ::openat(dir_rw.get(), name.c_str(),
                                   O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)
                        : -1;
      if (made >= 0) ::close(made);
    }
  }
}

void make_mount_points(const runtime::ContainerSpec& spec) {
  if (::geteuid() != 0 || spec.fs.read_only) return;
  UniqueFd root(::open(spec.fs.rootfs.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return;
  for (const auto& bind : spec.fs.binds) {
    struct stat st {};
    const bool directory = ::stat(bind.source.c_str(), &st) != 0 || S_ISDIR(st.st_mode);
    make_mount_point(root.get(), bind.target, directory);
  }
  for (const auto& mount : spec.fs.fs_mounts) make_mount_point(root.get(), mount.target, true);
  make_mount_point(root.get(), spec.fs.workdir, true);
}

class Monitor {
 public:
  Monitor(std::unique_ptr<Bundle> bundle, const CreateOptions& options)
      : bundle_(std::move(bundle)), options_(options) {}

  // Starts the container; throws Error.
  void create() {
    const std::string dir = options_.root + "/" + options_.id;
    // The main process's stdio is the engine's (create's): kept aside for
    // `start`; the monitor itself and the init write nowhere near it.
    // With a terminal the process has the pty instead, and the engine may
    // wait for create's own stdio to close.
    if (!bundle_->terminal)
      for (int i = 0; i < 3; ++i) saved_stdio_[i].reset(::fcntl(i, F_DUPFD_CLOEXEC, 3));
    for (int i = 0; i < options_.preserve_fds; ++i) preserved_.emplace_back(4 + i);
    UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
    for (int i = 0; i < 3 && null; ++i) ::dup2(null.get(), i);

    listener_.reset(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!listener_) throw_errno("socket");
    const std::string sock = dir + "/monitor.sock";
    UniqueFd dir_fd;
    sockaddr_un addr = unix_address(sock, &dir_fd);
    if (::bind(listener_.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(listener_.get(), 16) != 0)
      throw_errno("listen on " + sock);

    runtime::ContainerSpec& spec = bundle_->spec;
    // Root of a nested user namespace (rootless Podman's runtime) has no
    // host ids to give out: its own namespace's ids are the container's.
    if (namespaces::is_host_root() && !spec.id_map) {
      ids_ = namespaces::claim_host_range("", true);
      spec.host_range = ids_.range();
    }
    // The init is the child of whoever forked us (create, run): the engine
    // that ran it reaps it once that has exited.
    spec.orphan = true;
    spec.hook_id = options_.id;
    spec.hook_bundle = bundle_->dir;
    if (bundle_->terminal && options_.console_socket.empty())
      throw Error("process.terminal is true: give --console-socket, where the terminal goes");
    make_mount_points(spec);
    container_ = runtime::Container::start(spec);
    // The policy's network part: the proxy and DNS stub on the container's
    // loopback, served on a thread of this process while the init lives.
    // Its decisions, one JSON line each, go to ROOT/ID/network.log.
    if (spec.egress) {
      auto log = std::make_unique<logfile::RotatingFile>(dir + "/network.log");
      if (!log->is_open()) throw Error(dir + "/network.log: " + log->error());
      if (!options_.start_egress) throw Error("no egress proxy to serve the policy's network part");
      egress_ = options_.start_egress(*container_, spec, *bundle_->policy, std::move(log));
    }
    if (bundle_->terminal) send_console(options_.console_socket, container_->tty_master());

    state_.id = options_.id;
    state_.bundle = bundle_->dir;
    state_.oci_version = bundle_->oci_version;
    state_.created = time::format_ns(time::now_ns());
    state_.pid = container_->pid();
    state_.pid_start = process_start(state_.pid);
    state_.monitor_pid = ::getpid();
    state_.owner = ::geteuid();
    state_.annotations = bundle_->annotations;
    state_.cgroup_dirs = container_->cgroups().dirs();
    state_.rootfs = spec.fs.rootfs;
    write_state(options_.root, state_);
    // As runc's, the cgroups stay until `delete` (which removes them by the
    // state's list): an engine reads a container's stats and watches its
    // OOM events after its processes are gone.
    container_->keep_cgroups();
  }

  pid_t pid() const { return container_->pid(); }

  int serve() {
    for (;;) {
      std::vector<pollfd> fds = {{container_->pidfd(), POLLIN, 0},
                                 {container_->control_fd(), POLLIN, 0},
                                 {listener_.get(), POLLIN, 0}};
      std::vector<int> order;
      for (const auto& [fd, client] : clients_) {
        fds.push_back({fd, POLLIN, 0});
        order.push_back(fd);
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        throw_errno("poll");
      }
      if (fds[1].revents && !from_init()) break;
      if (fds[0].revents) break;  // the init ended
      if (fds[2].revents & POLLIN) accept_clients();
      for (size_t i = 0; i < order.size(); ++i)
        if (fds[3 + i].revents) from_client(order[i]);
    }
    return 0;
  }

 private:
  struct Client {
    UniqueFd fd;
    uint64_t exec_id = 0;  // the exec it asked for, 0 none
    bool start = false;    // waits for the main process
  };

  void accept_clients() {
    for (;;) {
      int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) return;
      clients_[fd].fd.reset(fd);
    }
  }

  void reply(int fd, const std::string& message, int pass = -1) {
    send_packet(fd, message, pass >= 0 ? &pass : nullptr, pass >= 0 ? 1 : 0, MSG_DONTWAIT);
  }

  void drop(int fd) {
    auto it = clients_.find(fd);
    if (it == clients_.end()) return;
    // An exec whose client (`oci exec`, or its relay) is gone ends too: the
    // engine that watched the relay can no longer see it.
    if (it->second.exec_id && running_execs_.count(it->second.exec_id))
      send_to_init({"kill", std::to_string(it->second.exec_id), std::to_string(SIGKILL)});
    clients_.erase(it);
  }

  void send_to_init(const std::vector<std::string>& parts, const int* fds = nullptr,
                    int count = 0) {
    send_packet(container_->control_fd(), runtime::make_message(parts), fds, count);
  }

  void from_client(int fd) {
    std::string packet;
    PacketFds passed;
    long n = receive_packet(fd, &packet, &passed);
    if (n == -EAGAIN || n == -EINTR) return;
    if (n <= 0) return drop(fd);
    runtime::InitMessage m = runtime::parse_message(packet);
    Client& client = clients_[fd];
    const std::string kind = packet.substr(0, packet.find('\0'));
    if (kind == "start") {
      if (started_ || start_client_ >= 0)
        return reply(fd, error_reply(1, "the container has been started already"));
      if (std::string why = run_start_hooks(); !why.empty()) return reply(fd, error_reply(1, why));
      runtime::ExecRequest main = bundle_->process;
      main.id = kMainId;
      main.main = true;
      std::string request = runtime::encode_exec(main);
      // stdio (a terminal's process has the pty instead: /dev/null holds
      // the places of the preserved fds that follow).
      UniqueFd null;
      if (main.tty && !preserved_.empty()) null.reset(::open("/dev/null", O_RDWR | O_CLOEXEC));
      int fds_out[kMaxPacketFds];
      int count = 0;
      if (!main.tty || null)
        for (int i = 0; i < 3; ++i)
          fds_out[count++] = main.tty ? null.get() : saved_stdio_[i].get();
      for (const UniqueFd& kept : preserved_) fds_out[count++] = kept.get();
      if (send_packet(container_->control_fd(), request, fds_out, count) != 0)
        return reply(fd, error_reply(1, "the container's init is gone"));
      client.start = true;
      start_client_ = fd;
      return;
    }
    if (m.kind == runtime::InitMessage::Kind::kExec) {
      auto request = runtime::decode_exec(m);
      if (!request || client.exec_id) return reply(fd, error_reply(1, "bad exec request"));
      request->id = next_id_++;
      request->main = false;
      // stdio, and what the exec preserves as 3, 4, ...
      int fds_out[kMaxPacketFds];
      int count = 0;
      while (count < kMaxPacketFds && passed[static_cast<size_t>(count)].valid())
        fds_out[count] = passed[static_cast<size_t>(count)].get(), ++count;
      if (count < 3) return reply(fd, error_reply(1, "an exec needs stdin, stdout and stderr"));
      if (send_packet(container_->control_fd(), runtime::encode_exec(*request), fds_out, count) !=
          0)
        return reply(fd, error_reply(1, "the container's init is gone"));
      client.exec_id = request->id;
      exec_clients_[request->id] = fd;
      return;
    }
    if (m.kind == runtime::InitMessage::Kind::kKill && m.fields.size() == 1 && client.exec_id) {
      send_to_init({"kill", std::to_string(client.exec_id), m.fields[0]});
      return;
    }
    reply(fd, error_reply(1, "unknown request " + kind));
  }

  // The startContainer hooks: in the container's namespaces, as its root,
  // after `start` and before the main process (runtime-spec); "" or why one
  // failed. A child of ours joins the namespaces (one thread: it may join a
  // user namespace) and runs them there, each with the state on its stdin.
  std::string run_start_hooks() {
    if (bundle_->start_container.empty()) return "";
    const std::string state = spec_state(state_, "created").dump();
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0) return errno_message("pipe", errno);
    UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
    const pid_t pid = ::fork();
    if (pid < 0) return errno_message("fork", errno);
    if (pid == 0) {
      read_end.reset();
      std::string why;
      constexpr int kAll = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET |
                           CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP;
      if (::setns(container_->pidfd(), kAll) != 0) {
        why = errno_message("startContainer hooks: join the container's namespaces", errno);
      } else {
        (void)::setgroups(0, nullptr);  // refused where the map denies it: keeps none anyway
        if (::setresgid(0, 0, 0) != 0 || ::setresuid(0, 0, 0) != 0)
          why = errno_message("startContainer hooks: become the container's root", errno);
        else
          why = runtime::run_hooks(bundle_->start_container, runtime::HookStage::kStartContainer,
                                   state);
      }
      files::write_all(write_end.get(), why);
      ::_exit(0);
    }
    write_end.reset();
    std::string why;
    char buf[512];
    for (ssize_t n; (n = ::read(read_end.get(), buf, sizeof buf)) != 0;) {
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) break;
      why.append(buf, static_cast<size_t>(n));
    }
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (why.empty() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
      why = "startContainer hooks: the process that runs them failed";
    return why;
  }

  // false once the init closed its end.
  bool from_init() {
    std::string packet;
    PacketFds passed;
    long n = receive_packet(container_->control_fd(), &packet, &passed);
    if (n == -EAGAIN || n == -EINTR) return true;
    if (n <= 0) return false;
    runtime::InitMessage m = runtime::parse_message(packet);
    if (m.fields.empty()) return true;
    const uint64_t id = std::strtoull(m.fields[0].c_str(), nullptr, 10);
    if (id == kMainId) {
      main_answer(m);
      return true;
    }
    auto it = exec_clients_.find(id);
    const int client = it == exec_clients_.end() ? -1 : it->second;
    if (m.kind == runtime::InitMessage::Kind::kStarted && m.fields.size() >= 2) {
      running_execs_.insert(id);
      if (client >= 0)
        reply(client, runtime::make_message({"started", m.fields[1]}), passed[0].get());
    } else if (m.kind == runtime::InitMessage::Kind::kFailed && m.fields.size() >= 4) {
      if (client >= 0) reply(client, failure_reply(m));
      exec_clients_.erase(id);
    } else if (m.kind == runtime::InitMessage::Kind::kExited && m.fields.size() >= 2) {
      running_execs_.erase(id);
      if (client >= 0) reply(client, runtime::make_message({"exited", m.fields[1]}));
      exec_clients_.erase(id);
    }
    return true;
  }

  static std::string failure_reply(const runtime::InitMessage& m) {
    // failed ID EXIT_CODE ERRNO WHAT
    int err = std::atoi(m.fields[2].c_str());
    std::string what = m.fields[3];
    return error_reply(std::atoi(m.fields[1].c_str()), err ? errno_message(what, err) : what);
  }

  void main_answer(const runtime::InitMessage& m) {
    const int client = start_client_;
    start_client_ = -1;
    if (m.kind == runtime::InitMessage::Kind::kStarted) {
      started_ = true;
      state_.started = true;
      for (auto& fd : saved_stdio_) fd.reset();
      preserved_.clear();
      try {
        write_state(options_.root, state_);
      } catch (const Error& e) {
        log::warn(e.what());
      }
      if (!bundle_->poststart.empty()) {
        std::string why = runtime::run_hooks(bundle_->poststart, runtime::HookStage::kPoststart,
                                             spec_state(state_, "running").dump());
        if (!why.empty()) log::warn(why);
      }
      if (client >= 0) reply(client, runtime::make_message({"ok"}));
    } else if (m.kind == runtime::InitMessage::Kind::kFailed && m.fields.size() >= 4) {
      if (client >= 0) reply(client, failure_reply(m));
    }
  }

  std::unique_ptr<Bundle> bundle_;
  CreateOptions options_;
  namespaces::RangeClaim ids_;
  std::unique_ptr<runtime::Container> container_;
  std::shared_ptr<void> egress_;  // ends before container_
  UniqueFd listener_;
  UniqueFd saved_stdio_[3];
  std::vector<UniqueFd> preserved_;  // --preserve-fds, until the start
  State state_;
  std::map<int, Client> clients_;
  std::map<uint64_t, int> exec_clients_;
  std::set<uint64_t> running_execs_;
  uint64_t next_id_ = kMainId + 1;
  int start_client_ = -1;
  bool started_ = false;
};

}  // namespace

sockaddr_un unix_address(const std::string& path, UniqueFd* dir) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string use = path;
  if (path.size() >= sizeof addr.sun_path) {
    const size_t slash = path.rfind('/');
    dir->reset(::open(path.substr(0, slash).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    if (!*dir) throw_errno("open " + path.substr(0, slash));
    use = "/proc/self/fd/" + std::to_string(dir->get()) + path.substr(slash);
    if (use.size() >= sizeof addr.sun_path) throw Error("socket path " + path + " is too long");
  }
  std::memcpy(addr.sun_path, use.c_str(), use.size() + 1);
  return addr;
}

int run_monitor(std::unique_ptr<Bundle> bundle, const CreateOptions& options, int report_fd) {
  ::signal(SIGPIPE, SIG_IGN);
  Monitor monitor(std::move(bundle), options);
  try {
    monitor.create();
  } catch (const Error& e) {
    files::write_all(report_fd, "error " + std::to_string(e.exit_code()) + " " + e.what() + "\n");
    ::close(report_fd);
    return 1;
  } catch (const std::exception& e) {
    files::write_all(report_fd, std::string("error 1 ") + e.what() + "\n");
    ::close(report_fd);
    return 1;
  }
  files::write_all(report_fd, "ok " + std::to_string(monitor.pid()) + "\n");
  ::close(report_fd);
  try {
    return monitor.serve();
  } catch (const std::exception& e) {
    log::error(e.what());
    return 1;
  }
}

int connect_monitor(const std::string& root, const std::string& id) {
  const std::string path = root + "/" + id + "/monitor.sock";
  UniqueFd fd(::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("socket");
  UniqueFd dir_fd;
  sockaddr_un addr = unix_address(path, &dir_fd);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw Error("container " + id +
                " is not running (its monitor does not answer: " + std::strerror(errno) + ")");
  return fd.release();
}

void send_console(const std::string& socket_path, int master_fd) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) throw_errno("socket");
  UniqueFd dir_fd;
  sockaddr_un addr = unix_address(socket_path, &dir_fd);
  if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    throw_errno("connect to the console socket " + socket_path);
  // runc sends the pty's name as the message and the master beside it.
  if (int rc = send_packet(fd.get(), "/dev/ptmx", &master_fd, 1); rc != 0)
    throw_errno("send the terminal to the console socket " + socket_path, -rc);
}

}  // namespace openshell::oci
