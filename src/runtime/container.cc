#include "runtime/container.h"

#include <fcntl.h>
#include <grp.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/child_failure.h"
#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/packet.h"
#include "base/text.h"
#include "namespaces/network.h"
#include "runtime/init_protocol.h"
#include "runtime/seccomp.h"

namespace openshell::runtime {

namespace {

using child::fail;

// Everything the child needs, prepared by the parent before clone so that the
// child only makes system calls.
struct ChildContext {
  const ContainerSpec* spec;
  const namespaces::MountPlan* mounts;
  int sync_fd;     // read: one byte once the id maps are written
  int report_fd;   // write: ChildFailure records; EOF once the main process runs
  int life_fd;     // read: EOF when the parent is gone
  int socket_fd;   // to the parent: the idmapped root in, the tty master out
  int control_fd;  // the init's end of the control channel
  int self_exe_fd;
  int* tree_fds;  // room for mounts->tree_count() fds from the parent
  // v1 cgroups' `tasks` files: the child writes "0" to each first thing
  // (CgroupSet::open_for_self_join).
  const int* cgroup_fds;
  size_t cgroup_fd_count;
  int last_cap;
  seccomp::Program seccomp;
  seccomp::Program extra_seccomp;  // the caller's, beside ours
  char* const* init_argv;
  char* const* envp;
  char* tty_fd_arg;  // written by the child: the slave's fd number
  size_t tty_fd_arg_size;
  int keep_fds[12];
  int keep_count;
  const Rlimit* rlimits;  // spec->rlimits, and any the parent added
  size_t rlimit_count;
  // The supplementary groups to set (spec->supplementary_gids and the
  // device groups mapped in), unless keep_groups: then none is set and the
  // caller's stay (rootless --gpu).
  const gid_t* groups;
  size_t group_count;
  bool keep_groups;
  // createContainer or startContainer hooks: once the root is built, the
  // child says so and waits for the parent to have run them.
  bool hook_pause;
  // The network or UTS namespace is an engine's, joined before the clone:
  // its loopback and host name are not ours to set.
  bool joined_net;
  bool joined_uts;
};

// A pids limit that no cgroup can hold (rootless without a delegated
// cgroup): RLIMIT_NPROC instead. In the sandbox's own user namespace it
// counts the processes and threads of the sandbox's user there (not the
// caller's others on the host), and the sandbox cannot raise it (it has no
// CAP_SYS_RESOURCE in the host's namespace).
void nproc_fallback(const ContainerSpec& spec, std::vector<Rlimit>* rlimits) {
  for (const Rlimit& r : *rlimits)
    if (r.resource == RLIMIT_NPROC) return;  // the caller's own --rlimit nproc
  rlim_t n = static_cast<rlim_t>(*spec.limits.pids);
  rlimits->push_back(Rlimit{RLIMIT_NPROC, n, n, "nproc"});
  log::debug("--pids: no cgroup can hold the limit of " + std::to_string(n) +
             "; RLIMIT_NPROC holds it (per user inside the sandbox)");
}

// The parent's go-ahead, sent once the id maps are written: what the child
// may do with them.
struct SyncMessage {
  uint32_t setup_uid;  // ids for the setup phase: ones the map holds
  uint32_t setup_gid;
  bool can_setgroups;
  bool tty_group;  // gid 5 is mapped
};

// The setup runs as the inside ids the caller's own ids map to (rootless:
// what it makes on the host stays the caller's), else as root inside.
SyncMessage sync_message_for(const namespaces::IdMap& map) {
  auto inside = [](const std::vector<namespaces::IdRange>& ranges, uint32_t host) -> uint32_t {
    for (const auto& r : ranges)
      if (host >= r.outside && host - r.outside < r.count) return r.inside + (host - r.outside);
    return 0;
  };
  return SyncMessage{inside(map.uid, ::geteuid()), inside(map.gid, ::getegid()),
                     !map.deny_setgroups, map.host_gid(5).has_value()};
}

void format_int(char* out, size_t size, int value) {
  char digits[16];
  int n = 0;
  bool negative = value < 0;
  unsigned v = negative ? static_cast<unsigned>(-value) : static_cast<unsigned>(value);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v && n < 15);
  size_t i = 0;
  if (negative && i + 1 < size) out[i++] = '-';
  while (n > 0 && i + 1 < size) out[i++] = digits[--n];
  out[i] = '\0';
}

void close_other_fds(const int* keep, int count) {
  int sorted[12];
  for (int i = 0; i < count && i < 12; ++i) {
    int j = i;
    for (; j > 0 && sorted[j - 1] > keep[i]; --j) sorted[j] = sorted[j - 1];
    sorted[j] = keep[i];
  }
  unsigned next = 0;
  for (int i = 0; i < count; ++i) {
    if (sorted[i] < 0) continue;
    auto fd = static_cast<unsigned>(sorted[i]);
    if (fd > next) ::close_range(next, fd - 1, 0);
    next = fd + 1;
  }
  ::close_range(next, ~0U, 0);
}

// One "F" (with its fd) or "N" (none) message; any further fd that came
// with it is closed.
bool receive_fd(int socket_fd, int* fd_out, ChildFailure* f) {
  char tag = 0;
  PacketFds fds;
  long n = receive_packet(socket_fd, &tag, 1, &fds);
  if (n != 1)
    return fail(f, n < 0 ? static_cast<int>(-n) : EPROTO, "receive the root from the parent");
  *fd_out = fds[0].release();
  return true;
}

bool send_fd(int socket_fd, int fd) {
  return send_packet(socket_fd, fd >= 0 ? "F" : "N", &fd, fd >= 0 ? 1 : 0) == 0;
}

bool clear_cloexec(int fd, ChildFailure* f) {
  if (fd >= 0 && ::fcntl(fd, F_SETFD, 0) != 0) return fail(f, errno, "fcntl F_SETFD");
  return true;
}

// The pseudo-terminal, from the sandbox's own devpts: the master goes to the
// parent, the slave stays for the main process.
bool open_tty(const ChildContext& c, ChildFailure* f) {
  int master = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (master < 0) return fail(f, errno, "open", "/dev/ptmx");
  int unlock = 0;
  if (::ioctl(master, TIOCSPTLCK, &unlock) != 0) return fail(f, errno, "unlock the pty");
  int slave = ::ioctl(master, TIOCGPTPEER, O_RDWR | O_NOCTTY);
  if (slave < 0) return fail(f, errno, "open the pty's slave");
  // The size is right before the command starts (it may ask at once).
  winsize size{c.spec->tty_rows, c.spec->tty_cols, 0, 0};
  ::ioctl(slave, TIOCSWINSZ, &size);
  if (!send_fd(c.socket_fd, master)) return fail(f, errno, "send the pty to the parent");
  ::close(master);
  format_int(c.tty_fd_arg, c.tty_fd_arg_size, slave);
  return true;
}

[[noreturn]] void report_and_exit(int report_fd, ChildFailure* f) noexcept {
  if (f->exit_code == 0) f->exit_code = exit_code::kFailure;
  ssize_t ignored = ::write(report_fd, f, sizeof *f);
  (void)ignored;
  ::_exit(f->exit_code);
}

// The child between clone and exec, top to bottom the steps that confine it.
// Raw system calls only: on failure it reports and exits.
[[noreturn]] void contain(const ChildContext& c) noexcept {
  ChildFailure f;
  auto die = [&]() { report_and_exit(c.report_fd, &f); };
  const ContainerSpec& spec = *c.spec;

  // Into the sandbox's v1 cgroups, by itself while it has one thread:
  // before anything of the sandbox runs, and without the global lock a
  // move by pid takes.
  for (size_t i = 0; i < c.cgroup_fd_count; ++i)
    if (::write(c.cgroup_fds[i], "0", 1) != 1) fail(&f, errno, "join the sandbox's cgroup"), die();

  // Stdio first, then nothing of the caller's beyond it and our own fds.
  const int stdio[3] = {spec.stdin_fd, spec.stdout_fd, spec.stderr_fd};
  for (int i = 0; i < 3; ++i)
    if (stdio[i] != i && ::dup2(stdio[i], i) < 0) fail(&f, errno, "set up stdio"), die();
  close_other_fds(c.keep_fds, c.keep_count);

  // Wait for the id maps and cgroups; EOF means the parent gave up.
  SyncMessage go{};
  ssize_t n;
  do n = ::read(c.sync_fd, &go, sizeof go);
  while (n < 0 && errno == EINTR);
  if (n != sizeof go) ::_exit(exit_code::kFailure);
  ::close(c.sync_fd);

  // A session of our own: the terminal's signals reach the parent, which
  // forwards them; nothing here can reach the caller's terminal as its own.
  if (::setsid() < 0) fail(&f, errno, "setsid"), die();

  // Ids for the setup: ones the new user namespace maps.
  if (go.can_setgroups && !c.keep_groups && ::setgroups(0, nullptr) != 0)
    fail(&f, errno, "setgroups"), die();
  if (::setresgid(go.setup_gid, go.setup_gid, go.setup_gid) != 0)
    fail(&f, errno, "setresgid"), die();
  if (::setresuid(go.setup_uid, go.setup_uid, go.setup_uid) != 0)
    fail(&f, errno, "setresuid"), die();

  // cgroup namespace rooted at the cgroups the parent put us in.
  if (::unshare(CLONE_NEWCGROUP) != 0) fail(&f, errno, "unshare the cgroup namespace"), die();

  // The file system.
  // The parent's idmapped trees (or none), one message each.
  for (size_t i = 0; i < c.mounts->tree_count(); ++i)
    if (!receive_fd(c.socket_fd, &c.tree_fds[i], &f)) die();
  int init_exe_fd = -1;
  if (!c.mounts->apply(c.tree_fds, go.tty_group, c.self_exe_fd, &init_exe_fd, &f)) die();
  for (size_t i = 0; i < c.mounts->tree_count(); ++i)
    if (c.tree_fds[i] >= 0) ::close(c.tree_fds[i]);
  ::close(c.self_exe_fd);

  // The root is built: the hooks of that moment run on the host now (an
  // "N" each way; a parent that gives up closes the socket).
  if (c.hook_pause) {
    int none = -1;
    if (!send_fd(c.socket_fd, -1)) fail(&f, errno, "tell the parent the root is ready"), die();
    if (!receive_fd(c.socket_fd, &none, &f)) ::_exit(exit_code::kFailure);
    if (none >= 0) ::close(none);
  }

  if (!c.joined_uts && ::sethostname(spec.hostname.data(), spec.hostname.size()) != 0)
    fail(&f, errno, "sethostname", spec.hostname.c_str()), die();
  if (!c.joined_net && !namespaces::bring_up_loopback(&f)) die();
  if (spec.egress) {
    // Made here, in the sandbox's network namespace; served by the parent.
    int proxy = -1, dns = -1;
    if (!namespaces::make_egress_sockets(&proxy, &dns, &f)) die();
    int diag = namespaces::make_sock_diag_socket();  // -1 goes as "none"
    if (!send_fd(c.socket_fd, proxy) || !send_fd(c.socket_fd, dns) || !send_fd(c.socket_fd, diag))
      fail(&f, errno, "hand the egress sockets to the parent"), die();
    ::close(proxy);
    ::close(dns);
    if (diag >= 0) ::close(diag);
  }

  // Resource limits (core dumps off unless asked for).
  for (size_t i = 0; i < c.rlimit_count; ++i) {
    const Rlimit& r = c.rlimits[i];
    rlimit value{r.soft, r.hard};
    if (::setrlimit(r.resource, &value) != 0) fail(&f, errno, "--rlimit", r.name), die();
  }

  // Capabilities out of the bounding set, then the sandbox's ids. An init
  // that starts processes as other ids keeps what that takes for itself
  // (never in the bounding set: no exec can gain it).
  const caps::Set init_caps = spec.cap_add | (spec.exec_as_others ? caps::kInitOnly : 0);
  if (!caps::add_inheritable(init_caps & ~spec.cap_add, &f)) die();
  if (!caps::drop_bounding(spec.cap_add, c.last_cap, &f)) die();
  if (go.can_setgroups && !c.keep_groups && ::setgroups(c.group_count, c.groups) != 0)
    fail(&f, errno, "setgroups"), die();
  if (::setresgid(spec.gid, spec.gid, spec.gid) != 0) fail(&f, errno, "setresgid"), die();
  if (::setresuid(spec.uid, spec.uid, spec.uid) != 0) fail(&f, errno, "setresuid"), die();
  if (!caps::set_final(init_caps, c.last_cap, &f)) die();

  // The terminal belongs to the sandbox user.
  if (spec.tty && !open_tty(c, &f)) die();

  // From here on, nothing can gain privileges.
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) fail(&f, errno, "no_new_privs"), die();

  char skipped[512] = {};
  if (!landlock::apply(spec.landlock, init_exe_fd, skipped, sizeof skipped, &f)) die();
  if (skipped[0] && spec.landlock.warn_missing) {
    ChildFailure warning;
    child::copy(warning.what, sizeof warning.what, "landlock: policy paths not in the sandbox:");
    child::copy(warning.detail, sizeof warning.detail, skipped);
    ssize_t ignored = ::write(c.report_fd, &warning, sizeof warning);
    (void)ignored;
  }

  // With egress, every connect(2) is shown to the owner first (who made
  // which socket counts for the proxy's binaries rule). Before the default
  // profile, which need not allow the kernel probe this makes.
  int connect_listener = spec.egress ? seccomp::install_connect_listener() : -1;
  if (spec.egress && connect_listener < 0) {
    ChildFailure warning;
    child::fail(&warning, -connect_listener,
                "seccomp user notification for connect(2) (the egress proxy cannot see which "
                "process connects)");
    warning.exit_code = 0;
    ssize_t ignored = ::write(c.report_fd, &warning, sizeof warning);
    (void)ignored;
  }

  // Last: the filter also covers what the steps above needed.
  if (c.extra_seccomp.length && !seccomp::install(c.extra_seccomp, &f)) die();
  if (c.seccomp.length && !seccomp::install(c.seccomp, &f)) die();
  if (spec.egress) {
    if (!send_fd(c.socket_fd, connect_listener))
      fail(&f, errno, "hand the connect listener to the parent"), die();
    if (connect_listener >= 0) ::close(connect_listener);
  }

  if (!clear_cloexec(c.report_fd, &f) || !clear_cloexec(c.life_fd, &f) ||
      !clear_cloexec(c.control_fd, &f))
    die();
  ::syscall(SYS_execveat, init_exe_fd, "", c.init_argv, c.envp, AT_EMPTY_PATH);
  fail(&f, errno, "exec the sandbox init");
  report_and_exit(c.report_fd, &f);
}

// waitid for the init; for an orphan (not our child) the pidfd's POLLIN
// says it ended, and the status stays its parent's to learn (0 here).
int wait_for(int pidfd, bool orphan, siginfo_t* info, int options) {
  if (!orphan)
    return ::waitid(static_cast<idtype_t>(P_PIDFD), static_cast<id_t>(pidfd), info, options);
  pollfd p{pidfd, POLLIN, 0};
  int n = ::poll(&p, 1, (options & WNOHANG) ? 0 : -1);
  if (n < 0) return -1;
  *info = siginfo_t{};
  if (n == 0) return 0;  // si_pid 0: still running
  info->si_pid = 1;
  info->si_code = CLD_EXITED;
  info->si_status = 0;
  return 0;
}

std::vector<char*> c_strings(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

}  // namespace

std::unique_ptr<Container> Container::start(const ContainerSpec& spec) {
  const double t_begin = log::elapsed_ms();
  std::unique_ptr<Container> container(new Container());

  namespaces::Identity caller = namespaces::current_identity();
  // Root of the host, not of a nested user namespace (rootless Podman's),
  // whose root holds no privilege over the host's ids and mounts.
  const bool host_root = caller.host_uid == 0 && namespaces::in_initial_user_namespace();
  if (spec.id_map) {
    if (caller.host_uid != 0) throw Error("an id map of the caller's is taken only from root");
    auto maps_zero = [](const std::vector<namespaces::IdRange>& ranges) {
      for (const auto& r : ranges)
        if (r.outside == 0) return true;
      return false;
    };
    if (host_root && (maps_zero(spec.id_map->uid) || maps_zero(spec.id_map->gid)))
      throw Error("the given id map maps the host's root into the sandbox");
    if (!spec.id_map->host_uid(spec.uid))
      throw Error("user id " + std::to_string(spec.uid) + " is not in the given id map");
    if (!spec.id_map->host_gid(spec.gid))
      throw Error("group id " + std::to_string(spec.gid) + " is not in the given id map");
    container->id_map_ = *spec.id_map;
  } else {
    container->id_map_ =
        namespaces::plan_id_map_for_host(caller, spec.uid, spec.gid, spec.host_range);
  }
  namespaces::IdMap& id_map = container->id_map_;
  namespaces::FilesystemSpec fs = spec.fs;
  fs.workdir_uid = spec.uid;
  fs.workdir_gid = spec.gid;
  char exe_path[4096];
  ssize_t exe_len = ::readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
  if (exe_len <= 0) throw_errno("readlink /proc/self/exe");
  fs.exe_path.assign(exe_path, static_cast<size_t>(exe_len));
  fs.exe_sealed = spec.init_image_fd >= 0;
  // A joined network namespace is not the sandbox's user namespace's:
  // its net.* parameters are written from here, as root, while this thread
  // is in it for the clone (/proc/sys/net is the opener's namespace's).
  // Root of a nested user namespace writes a new one's from inside: it
  // could enter it from here, but not go back to the host's.
  std::vector<std::pair<std::string, std::string>> net_sysctls;
  if (caller.host_uid == 0 && (host_root || !spec.join_net.empty()))
    std::erase_if(fs.sysctls, [&](const auto& kv) {
      if (kv.first.rfind("net.", 0) != 0 && kv.first.rfind("net/", 0) != 0) return false;
      net_sysctls.push_back(kv);
      return true;
    });
  namespaces::MountPlan mounts(fs);

  // The device nodes' groups (--gpu): mapped in as root, kept rootless.
  std::vector<gid_t> groups(spec.supplementary_gids.begin(), spec.supplementary_gids.end());
  bool keep_groups = false;
  if (!spec.host_groups.empty()) {
    if (host_root && id_map.method == namespaces::IdMap::Method::kDirect) {
      for (uint32_t gid : namespaces::map_host_groups(&id_map, spec.host_groups))
        groups.push_back(gid);
    } else {
      keep_groups = true;
      std::vector<gid_t> mine(static_cast<size_t>(std::max(::getgroups(0, nullptr), 0)));
      mine.resize(static_cast<size_t>(
          std::max(::getgroups(static_cast<int>(mine.size()), mine.data()), 0)));
      for (uint32_t gid : spec.host_groups)
        if (gid != ::getegid() && std::find(mine.begin(), mine.end(), gid) == mine.end())
          log::warn("--gpu: a device node is group " + std::to_string(gid) +
                    "'s, and you are not in that group: the sandbox cannot open it (see "
                    "docs/gpu.md)");
    }
  }
  bool hook_pause = false;
  for (const Hook& hook : spec.hooks)
    hook_pause = hook_pause || hook.stage == HookStage::kCreateContainer ||
                 hook.stage == HookStage::kStartContainer;
  container->hooks_ = spec.hooks;
  container->hook_id_ = !spec.hook_id.empty()      ? spec.hook_id
                        : spec.cgroup_name.empty() ? "openshell-" + std::to_string(::getpid())
                                                   : spec.cgroup_name;
  container->hook_bundle_ = spec.hook_bundle;

  // Limits: a cgroup per hierarchy that holds a needed controller.
  std::vector<Rlimit> rlimits = spec.rlimits;
  if (spec.limits.any() || !spec.cgroup_path.empty()) {
    std::string name = !spec.cgroup_path.empty()  ? spec.cgroup_path
                       : spec.cgroup_name.empty() ? "openshell-" + std::to_string(::getpid())
                                                  : spec.cgroup_name;
    std::vector<std::string> not_enforced;
    container->cgroups_ =
        CgroupSet::create(CgroupLayout::discover(), name, spec.limits, &not_enforced);
    for (const auto& why : not_enforced) {
      if (why.rfind("--pids", 0) == 0) {
        nproc_fallback(spec, &rlimits);
        continue;
      }
      if (why.rfind("--gpu", 0) == 0) {
        // Rootless: no devices cgroup; /dev holds only the nodes given, and
        // no node can be made (no mknod in a user namespace).
        log::debug(why + " (the device rules are not enforced)");
        continue;
      }
      log::warn(why + " (the limit is NOT enforced)");
    }
  }

  Pipe sync = Pipe::create();
  Pipe report = Pipe::create();
  Pipe life = Pipe::create();
  int sockets[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0)
    throw_errno("socketpair");
  UniqueFd parent_socket(sockets[0]), child_socket(sockets[1]);
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sockets) != 0)
    throw_errno("socketpair");
  UniqueFd control(sockets[0]), init_control(sockets[1]);
  // The init's program: the caller's image, else this binary.
  UniqueFd self_exe(fs.exe_sealed ? ::fcntl(spec.init_image_fd, F_DUPFD_CLOEXEC, 3)
                                  : ::open("/proc/self/exe", O_RDONLY | O_CLOEXEC));
  if (!self_exe) throw_errno(fs.exe_sealed ? "keep the init's program" : "open /proc/self/exe");

  // The init's command line:
  //   openshell-init __init REPORT LIFE TTY CONTROL CAPS FLAGS -- ARGV...
  // CAPS: what its children keep ("-": all it has). FLAGS: "o" when it
  // outlives its parent (spec.orphan), else "-".
  char tty_fd_arg[16] = "-1";
  std::vector<std::string> argv_strings = {"openshell-init",
                                           "__init",
                                           std::to_string(report.write.get()),
                                           std::to_string(life.read.get()),
                                           "",  // the tty slot, pointed at tty_fd_arg below
                                           std::to_string(init_control.get()),
                                           spec.exec_as_others ? std::to_string(spec.cap_add) : "-",
                                           spec.orphan ? "o" : "-",
                                           "--"};
  argv_strings.insert(argv_strings.end(), spec.argv.begin(), spec.argv.end());
  std::vector<char*> init_argv = c_strings(argv_strings);
  init_argv[4] = tty_fd_arg;
  std::vector<std::string> env_strings = spec.env;
  std::vector<char*> envp = c_strings(env_strings);

  ChildContext ctx{};
  ctx.spec = &spec;
  ctx.rlimits = rlimits.data();
  // As root the parent sets them (prlimit below): raising a hard limit
  // takes a privilege the sandbox's user namespace does not give.
  ctx.rlimit_count = caller.host_uid == 0 ? 0 : rlimits.size();
  ctx.groups = groups.data();
  ctx.group_count = groups.size();
  ctx.keep_groups = keep_groups;
  ctx.hook_pause = hook_pause;
  ctx.mounts = &mounts;
  ctx.sync_fd = sync.read.get();
  ctx.report_fd = report.write.get();
  ctx.life_fd = life.read.get();
  ctx.socket_fd = child_socket.get();
  ctx.control_fd = init_control.get();
  ctx.self_exe_fd = self_exe.get();
  std::vector<int> tree_fds(mounts.tree_count(), -1);
  ctx.tree_fds = tree_fds.data();
  std::vector<UniqueFd> cgroup_fds = container->cgroups_.open_for_self_join();
  std::vector<int> cgroup_fd_numbers;
  for (const UniqueFd& fd : cgroup_fds) cgroup_fd_numbers.push_back(fd.get());
  ctx.cgroup_fds = cgroup_fd_numbers.data();
  ctx.cgroup_fd_count = cgroup_fd_numbers.size();
  ctx.last_cap = caps::last_cap();
  if (spec.seccomp) ctx.seccomp = seccomp::default_program();
  ctx.extra_seccomp = spec.seccomp_program;
  ctx.joined_net = !spec.join_net.empty();
  ctx.joined_uts = !spec.join_uts.empty();
  ctx.init_argv = init_argv.data();
  ctx.envp = envp.data();
  ctx.tty_fd_arg = tty_fd_arg;
  ctx.tty_fd_arg_size = sizeof tty_fd_arg;
  int keep[] = {ctx.sync_fd,
                ctx.report_fd,
                ctx.life_fd,
                ctx.socket_fd,
                ctx.control_fd,
                ctx.self_exe_fd,
                0,
                1,
                2};
  std::copy(std::begin(keep), std::end(keep), ctx.keep_fds);
  ctx.keep_count = static_cast<int>(std::size(keep));

  // Namespaces to join: entered by this thread for the clone, which takes
  // them from it, and left again after.
  struct Join {
    const std::string* path;
    int type;
    const char* name;
  };
  const Join joins[] = {{&spec.join_net, CLONE_NEWNET, "net"},
                        {&spec.join_ipc, CLONE_NEWIPC, "ipc"},
                        {&spec.join_uts, CLONE_NEWUTS, "uts"}};
  uint64_t new_namespaces = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID;
  std::vector<std::pair<UniqueFd, int>> restore;  // our own, to return to
  auto leave_joined = [&]() {
    for (auto& [own, type] : restore)
      if (::setns(own.get(), type) != 0)
        log::warn(errno_message("return to this process's own namespace", errno));
    restore.clear();
  };
  for (const Join& join : joins) {
    if (join.path->empty()) {
      new_namespaces |= static_cast<uint64_t>(join.type);
      continue;
    }
    UniqueFd target(::open(join.path->c_str(), O_RDONLY | O_CLOEXEC));
    if (!target) {
      int err = errno;
      leave_joined();
      throw_errno(std::string("open the ") + join.name + " namespace " + *join.path, err);
    }
    UniqueFd own(
        ::open((std::string("/proc/thread-self/ns/") + join.name).c_str(), O_RDONLY | O_CLOEXEC));
    if (!own || ::setns(target.get(), join.type) != 0) {
      int err = errno;
      leave_joined();
      throw_errno(std::string("join the ") + join.name + " namespace " + *join.path, err);
    }
    restore.emplace_back(std::move(own), join.type);
  }

  auto write_net_sysctls = [&]() {
    for (const auto& [key, value] : net_sysctls) {
      std::string path = "/proc/sys/" + key;
      std::replace(path.begin() + 10, path.end(), '.', '/');
      if (int err = files::write_once(path, value); err != 0) throw_errno("sysctl " + key, err);
    }
  };
  if (!spec.join_net.empty()) {
    try {
      write_net_sysctls();
    } catch (...) {
      leave_joined();
      throw;
    }
    net_sysctls.clear();
  }

  int pidfd = -1;
  clone_args args{};
  args.flags = new_namespaces | CLONE_PIDFD | (spec.orphan ? CLONE_PARENT : 0);
  args.pidfd = reinterpret_cast<uint64_t>(&pidfd);
  // With CLONE_PARENT the kernel takes the signal our parent gets for us
  // (clone3 refuses one of ours).
  args.exit_signal = spec.orphan ? 0 : SIGCHLD;
  if (container->cgroups_.unified_fd() >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<uint64_t>(container->cgroups_.unified_fd());
  }
  const double t_clone = log::elapsed_ms();
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) contain(ctx);
  const int clone_error = errno;
  leave_joined();
  if (pid < 0)
    throw_errno("clone3 (new user, mount, pid, network, uts and ipc namespaces)", clone_error);

  container->pid_ = static_cast<pid_t>(pid);
  container->pidfd_.reset(pidfd);
  container->orphan_ = spec.orphan;
  container->lifeline_ = std::move(life.write);
  container->control_ = std::move(control);
  init_control.reset();
  sync.read.reset();
  report.write.reset();
  life.read.reset();
  child_socket.reset();

  auto abandon = [&]() {
    ::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
    siginfo_t info;
    wait_for(pidfd, spec.orphan, &info, WEXITED);
    container->reaped_ = true;
  };

  // Parent's half of the handshake: id maps, cgroups, the idmapped root.
  try {
    namespaces::apply_id_map(container->pid_, &id_map);
    container->cgroups_.attach(container->pid_);
    if (caller.host_uid == 0)
      for (const Rlimit& r : rlimits) {
        rlimit value{r.soft, r.hard};
        const auto resource = static_cast<__rlimit_resource>(r.resource);
        if (::prlimit(static_cast<pid_t>(pid), resource, &value, nullptr) == 0) continue;
        // Above our own hard limit without CAP_SYS_RESOURCE (a root that
        // lacks it): ours, said so.
        rlimit own{};
        if (errno != EPERM || ::getrlimit(resource, &own) != 0 || own.rlim_max >= r.hard)
          throw_errno(std::string("--rlimit ") + r.name);
        rlimit clamped{std::min(r.soft, own.rlim_max), own.rlim_max};
        if (::prlimit(static_cast<pid_t>(pid), resource, &clamped, nullptr) != 0)
          throw_errno(std::string("--rlimit ") + r.name);
        log::warn(std::string("--rlimit ") + r.name + ": " + std::to_string(r.hard) +
                  " is above this process's hard limit and it may not raise it (no "
                  "CAP_SYS_RESOURCE): " +
                  std::to_string(own.rlim_max) + " instead");
      }
    if (!net_sysctls.empty()) {
      // The sandbox's own network namespace, entered for the writes: as
      // root, values of the host's ids (a ping group range of gids the
      // sandbox's user namespace does not map) are the kernel's to take.
      UniqueFd own(::open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
      UniqueFd theirs(
          ::open(("/proc/" + std::to_string(pid) + "/ns/net").c_str(), O_RDONLY | O_CLOEXEC));
      if (!own || !theirs || ::setns(theirs.get(), CLONE_NEWNET) != 0)
        throw_errno("enter the sandbox's network namespace");
      try {
        write_net_sysctls();
      } catch (...) {
        ::setns(own.get(), CLONE_NEWNET);
        throw;
      }
      if (::setns(own.get(), CLONE_NEWNET) != 0)
        throw_errno("leave the sandbox's network namespace");
    }
    if (spec.oom_score_adj) {
      const std::string path = "/proc/" + std::to_string(pid) + "/oom_score_adj";
      if (int err = files::write_once(path, std::to_string(*spec.oom_score_adj)); err != 0)
        throw_errno("set the OOM score adjustment " + std::to_string(*spec.oom_score_adj), err);
    }
    if (!spec.hooks.empty()) {
      if (spec.hook_bundle.empty())
        container->bundle_ = HookBundle::create(container->pid_, spec.hostname);
      if (auto why = container->run_hooks(HookStage::kCreateRuntime, "creating"); !why.empty())
        throw Error(why);
    }
    std::vector<UniqueFd> trees;
    if (host_root) {
      UniqueFd userns(
          ::open(("/proc/" + std::to_string(pid) + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC));
      if (userns)
        trees = mounts.idmapped_trees(userns.get(), id_map, spec.uid, spec.gid, !spec.id_map);
    }
    trees.resize(mounts.tree_count());
    for (const UniqueFd& tree : trees)
      if (!send_fd(parent_socket.get(), tree.get())) throw_errno("send mounts to the sandbox");
    SyncMessage go = sync_message_for(id_map);
    if (::write(sync.write.get(), &go, sizeof go) != sizeof go) throw_errno("start the sandbox");
  } catch (...) {
    abandon();
    throw;
  }
  sync.write.reset();
  const double t_maps = log::elapsed_ms();

  // The root is built (or the child failed, and its report says why).
  if (hook_pause) {
    int none = -1;
    ChildFailure ignored;
    if (receive_fd(parent_socket.get(), &none, &ignored)) {
      if (none >= 0) ::close(none);
      std::string why = container->run_hooks(HookStage::kCreateContainer, "created");
      if (why.empty()) why = container->run_hooks(HookStage::kStartContainer, "created");
      if (!why.empty()) {
        abandon();
        throw Error(why);
      }
      if (!send_fd(parent_socket.get(), -1)) {
        abandon();
        throw_errno("let the sandbox go on after its hooks");
      }
    }
  }

  // Until the main process runs, the child reports warnings and failures.
  ChildFailure failure;
  bool failed = false;
  for (;;) {
    ChildFailure record;
    ssize_t n = ::read(report.read.get(), &record, sizeof record);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (n != static_cast<ssize_t>(sizeof record)) continue;
    if (record.exit_code == 0) {
      log::warn(record.message());
    } else if (!failed) {
      failure = record;
      failed = true;
    }
  }
  if (failed) {
    abandon();
    throw Error(failure.message(), failure.exit_code);
  }
  if (spec.egress) {
    int proxy = -1, dns = -1, diag = -1;
    ChildFailure ignored;
    bool received = receive_fd(parent_socket.get(), &proxy, &ignored) &&
                    receive_fd(parent_socket.get(), &dns, &ignored) &&
                    receive_fd(parent_socket.get(), &diag, &ignored);
    container->proxy_listener_.reset(proxy);
    container->dns_socket_.reset(dns);
    container->diag_socket_.reset(diag);  // may be -1: no sock_diag
    if (!received || proxy < 0 || dns < 0) {
      abandon();
      throw Error("the sandbox ended before its egress sockets were ready");
    }
  }
  if (spec.tty) {
    int master = -1;
    ChildFailure ignored;
    if (!receive_fd(parent_socket.get(), &master, &ignored) || master < 0) {
      // The child exited before sending it: its status says why.
      siginfo_t info{};
      wait_for(pidfd, spec.orphan, &info, WEXITED);
      container->reaped_ = true;
      throw Error("the sandbox ended before its terminal was ready");
    }
    container->tty_master_.reset(master);
  }
  if (spec.egress) {
    int listener = -1;
    ChildFailure ignored;
    if (!receive_fd(parent_socket.get(), &listener, &ignored)) {
      abandon();
      throw Error("the sandbox ended before its connect listener was ready");
    }
    container->connect_listener_.reset(listener);  // -1: the kernel gave none
  }
  if (auto why = container->run_hooks(HookStage::kPoststart, "running"); !why.empty())
    log::warn(why);
  const double t_running = log::elapsed_ms();
  log::debug("started pid " + std::to_string(pid) + " (" + id_map.describe() + "): prepare " +
             text::format_ms(t_clone - t_begin) + " ms, clone+maps " +
             text::format_ms(t_maps - t_clone) + " ms, setup+exec " +
             text::format_ms(t_running - t_maps) + " ms");
  return container;
}

Container::~Container() {
  if (!reaped_ && pidfd_) {
    ::syscall(SYS_pidfd_send_signal, pidfd_.get(), SIGKILL, nullptr, 0);
    siginfo_t info;
    while (wait_for(pidfd_.get(), orphan_, &info, WEXITED) < 0 && errno == EINTR) {
    }
  }
  cgroups_.remove();
  poststop();
}

std::string Container::run_hooks(HookStage stage, const char* status) const {
  if (hooks_.empty()) return "";
  return runtime::run_hooks(
      hooks_, stage,
      hook_state_json(hook_id_, status, pid_, hook_bundle_.empty() ? bundle_.dir() : hook_bundle_));
}

void Container::poststop() noexcept {
  if (poststop_done_ || hooks_.empty()) return;
  poststop_done_ = true;
  try {
    if (auto why = run_hooks(HookStage::kPoststop, "stopped"); !why.empty()) log::warn(why);
  } catch (const std::exception& e) {
    log::warn(std::string("poststop hooks: ") + e.what());
  }
  bundle_ = HookBundle();
}

void Container::signal(int sig) const {
  if (!reaped_) ::syscall(SYS_pidfd_send_signal, pidfd_.get(), sig, nullptr, 0);
}

int Container::finish(const siginfo_t& info) {
  reaped_ = true;
  if (info.si_code == CLD_EXITED)
    status_ = info.si_status;
  else
    status_ = 128 + info.si_status;
  lifeline_.reset();
  oom_kills_ = cgroups_.oom_kills();
  cgroups_.remove();
  poststop();
  return status_;
}

int Container::wait() {
  if (reaped_) return status_;
  siginfo_t info{};
  while (wait_for(pidfd_.get(), orphan_, &info, WEXITED) != 0) {
    if (errno != EINTR) throw_errno("wait for the sandbox");
  }
  return finish(info);
}

bool Container::poll_exit(int* status) {
  if (reaped_) {
    *status = status_;
    return true;
  }
  siginfo_t info{};
  if (wait_for(pidfd_.get(), orphan_, &info, WEXITED | WNOHANG) != 0) return false;
  if (info.si_pid == 0) return false;
  *status = finish(info);
  return true;
}

}  // namespace openshell::runtime
