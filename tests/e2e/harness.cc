#include "harness.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

namespace e2e {

namespace {

constexpr const char* kSubuidUser = "osh-e2e-sub";
constexpr const char* kSingleUser = "osh-e2e-one";

struct State {
  std::string binary, rootfs, scratch;
  uid_t sub_uid = 0, single_uid = 0;
  gid_t sub_gid = 0, single_gid = 0;
  std::vector<std::string> users_created;
  // What the tests made, for the leftover scans: the openshell processes
  // the harness started in this test (pid -> start time: pids are reused,
  // by others' runs too), and the ids of the sandboxes that appeared in the
  // state directories of the tests' gateways.
  std::mutex made_mutex;
  std::map<std::string, std::string> started_pids;
  std::set<std::string> sandbox_ids;
};
State g;

// Field 22 of /proc/PID/stat, when the process started ("" when it is gone).
std::string start_time_of(const std::string& pid) {
  std::string stat = file_contents("/proc/" + pid + "/stat");
  auto at = stat.rfind(')');
  if (at == std::string::npos) return "";
  std::istringstream fields(stat.substr(at + 2));  // from field 3, the state
  std::string field;
  for (int i = 3; i <= 22; ++i)
    if (!(fields >> field)) return "";
  return field;
}

// The sandboxes of the state directory that openshell run with this
// environment uses, when it is one the tests made (under scratch()).
void note_sandboxes(Mode mode, const std::vector<std::string>& env) {
  std::string state;
  for (const auto& kv : env)
    if (kv.rfind("OPENSHELL_HOME=", 0) == 0) state = kv.substr(15);
  if (state.empty() && mode != Mode::kRoot) state = g.scratch + "/.local/state/openshell";
  if (state.rfind(g.scratch + "/", 0) != 0) return;
  DIR* d = ::opendir((state + "/sandboxes").c_str());
  if (!d) return;
  std::lock_guard<std::mutex> lock(g.made_mutex);
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') g.sandbox_ids.insert(e->d_name);
  ::closedir(d);
}

std::string env_or(const char* name, const char* fallback) {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

int shell(const std::string& command) {
  int status = std::system(command.c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool lookup_user(const std::string& name, uid_t* uid, gid_t* gid) {
  std::ifstream passwd("/etc/passwd");
  std::string line;
  while (std::getline(passwd, line)) {
    std::vector<std::string> fields;
    std::stringstream ss(line);
    std::string field;
    while (std::getline(ss, field, ':')) fields.push_back(field);
    if (fields.size() >= 4 && fields[0] == name) {
      *uid = static_cast<uid_t>(std::stoul(fields[2]));
      *gid = static_cast<gid_t>(std::stoul(fields[3]));
      return true;
    }
  }
  return false;
}

bool has_subuid(const std::string& name) {
  std::ifstream subuid("/etc/subuid");
  std::string line;
  while (std::getline(subuid, line))
    if (line.rfind(name + ":", 0) == 0) return true;
  return false;
}

void ensure_user(const std::string& name, bool system_user) {
  uid_t uid;
  gid_t gid;
  if (!lookup_user(name, &uid, &gid)) {
    std::string cmd = "useradd -M -s /usr/sbin/nologin ";
    if (system_user) cmd += "-r ";
    if (shell(cmd + name + " >/dev/null 2>&1") != 0) {
      std::fprintf(stderr, "e2e: useradd %s failed\n", name.c_str());
      std::exit(1);
    }
    g.users_created.push_back(name);
  }
  if (!system_user && !has_subuid(name))
    shell("usermod --add-subuids 400000-465535 --add-subgids 400000-465535 " + name);
}

class Environment : public testing::Environment {
 public:
  void SetUp() override {
    if (::geteuid() != 0) return;
    char dir[] = "/tmp/osh-e2e-XXXXXX";
    if (!::mkdtemp(dir)) {
      std::perror("mkdtemp");
      std::exit(1);
    }
    g.scratch = dir;
    ::chmod(dir, 0755);
    g.binary = g.scratch + "/openshell";
    if (shell("cp '" + env_or("OPENSHELL_BIN", "build/openshell") + "' '" + g.binary + "'") != 0) {
      std::fprintf(stderr, "e2e: cannot copy the openshell binary\n");
      std::exit(1);
    }
    g.rootfs = g.scratch + "/rootfs";
    std::string script = env_or("OSH_ROOTFS_SCRIPT", "rootfs-tools/build-busybox-rootfs");
    std::string probe = env_or("OSH_PROBE", "build/tests/e2e/osh-probe");
    if (shell("'" + script + "' '" + g.rootfs + "' '" + probe + "' >/dev/null") != 0) {
      std::fprintf(stderr, "e2e: building the busybox root failed\n");
      std::exit(1);
    }
    ensure_user(kSubuidUser, false);
    ensure_user(kSingleUser, true);
    lookup_user(kSubuidUser, &g.sub_uid, &g.sub_gid);
    lookup_user(kSingleUser, &g.single_uid, &g.single_gid);
  }

  void TearDown() override {
    if (!g.scratch.empty()) shell("rm -rf '" + g.scratch + "'");
    for (const auto& user : g.users_created) shell("userdel " + user + " >/dev/null 2>&1");
  }
};

[[maybe_unused]] testing::Environment* const g_env =
    testing::AddGlobalTestEnvironment(new Environment);

long now_ms() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void drop_to(Mode mode, const std::vector<gid_t>& groups) {
  if (mode == Mode::kRoot) return;
  uid_t uid = uid_of(mode);
  gid_t gid = gid_of(mode);
  if (::setgroups(groups.size(), groups.data()) != 0 || ::setresgid(gid, gid, gid) != 0 ||
      ::setresuid(uid, uid, uid) != 0) {
    std::perror("drop privileges");
    ::_exit(121);
  }
}

}  // namespace

std::string mode_name(Mode mode) {
  switch (mode) {
    case Mode::kRoot:
      return "Root";
    case Mode::kRootlessSubuid:
      return "RootlessSubuid";
    case Mode::kRootlessSingle:
      return "RootlessSingle";
  }
  return "?";
}

bool is_rootless(Mode mode) { return mode != Mode::kRoot; }

std::string param_name(const testing::TestParamInfo<Mode>& info) { return mode_name(info.param); }

void GatewayTest::SetUp() {
  ModeTest::SetUp();
  if (IsSkipped()) return;
  static std::map<std::string, int> counters;
  home_ = make_dir(
      mode(), prefix_ + "-" + mode_name(mode()) + "-" + std::to_string(++counters[prefix_]), 0700);
}

void GatewayTest::TearDown() {
  if (!home_.empty()) {
    EXPECT_EQ(stop_gateway(mode(), home_), std::vector<std::string>{})
        << "gateway or supervisors left";
    if (check_sandbox_files_) {
      EXPECT_EQ(file_contents_of_dir(home_ + "/sandboxes"), "") << "sandbox files left";
    }
  }
  ModeTest::TearDown();
}

Options GatewayTest::with_home(Options o) const {
  o.env.push_back("OPENSHELL_HOME=" + home_);
  return o;
}

Result GatewayTest::os(const std::vector<std::string>& args, Options o) {
  return openshell(mode(), args, with_home(std::move(o)));
}

std::string GatewayTest::field(const std::string& name, const std::string& key) {
  Result r = os({"sandbox", "get", name, "-o", "json"});
  auto pos = r.out.find("\"" + key + "\": ");
  if (pos == std::string::npos) return "";
  pos += key.size() + 4;
  auto end = r.out.find_first_of(",\n", pos);
  std::string value = r.out.substr(pos, end - pos);
  if (!value.empty() && value.front() == '"') value = value.substr(1, value.size() - 2);
  return value;
}

bool GatewayTest::wait_phase(const std::string& name, const std::string& want, int ms) {
  for (int i = 0; i < ms / 20; ++i) {
    if (phase(name) == want) return true;
    ::usleep(20000);
  }
  return false;
}

const std::string& binary() { return g.binary; }
const std::string& rootfs() { return g.rootfs; }
const std::string& scratch() { return g.scratch; }
uid_t uid_of(Mode mode) {
  return mode == Mode::kRoot ? 0 : mode == Mode::kRootlessSubuid ? g.sub_uid : g.single_uid;
}
gid_t gid_of(Mode mode) {
  return mode == Mode::kRoot ? 0 : mode == Mode::kRootlessSubuid ? g.sub_gid : g.single_gid;
}

namespace {

// A pty's settings, read through its master (which reads the slave's).
std::string pty_settings(int master) {
  termios t{};
  if (::tcgetattr(master, &t) != 0) return "unreadable";
  std::string out = "iflag=" + std::to_string(t.c_iflag) + " oflag=" + std::to_string(t.c_oflag) +
                    " cflag=" + std::to_string(t.c_cflag) + " lflag=" + std::to_string(t.c_lflag) +
                    " cc=";
  for (cc_t c : t.c_cc) out += std::to_string(c) + ",";
  return out;
}

// The environment openshell runs with: a small fixed one, and the test's
// KEY=VALUE entries, each replacing the default of its key (getenv takes
// the first), so that a test may give openshell a PATH of its own.
std::vector<std::string> openshell_env(const std::vector<std::string>& extras) {
  std::vector<std::string> env = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + g.scratch,
                                  "LANG=C"};
  for (const auto& extra : extras) {
    const std::string key = extra.substr(0, extra.find('=') + 1);
    std::erase_if(env, [&](const std::string& e) { return e.starts_with(key); });
  }
  env.insert(env.end(), extras.begin(), extras.end());
  return env;
}

}  // namespace

Result openshell(Mode mode, const std::vector<std::string>& args, const Options& options) {
  Result result;
  if (::geteuid() != 0) {
    result.err = "e2e tests need root (to create the test users)";
    return result;
  }
  int out_pipe[2], err_pipe[2], in_pipe[2];
  int master = -1, slave = -1;
  if (options.pty) {
    winsize size{options.rows, options.cols, 0, 0};
    if (::openpty(&master, &slave, nullptr, nullptr, &size) != 0) {
      result.err = "openpty failed";
      return result;
    }
    result.pty_settings_before = pty_settings(master);
  }
  if (::pipe2(out_pipe, O_CLOEXEC) || ::pipe2(err_pipe, O_CLOEXEC) || ::pipe2(in_pipe, O_CLOEXEC)) {
    result.err = "pipe failed";
    return result;
  }
  std::vector<std::string> argv_strings = {g.binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& s : argv_strings) argv.push_back(s.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = openshell_env(options.env);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);

  pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    if (options.pty) {
      ::setsid();
      ::ioctl(slave, TIOCSCTTY, 0);
      ::dup2(slave, 0);
      ::dup2(slave, 1);
      ::dup2(slave, 2);
    } else {
      ::dup2(in_pipe[0], 0);
      ::dup2(out_pipe[1], 1);
      ::dup2(err_pipe[1], 2);
    }
    for (int fd : options.leak_fds) ::fcntl(fd, F_SETFD, 0);
    if (!options.pass_fds.empty()) {
      const int above = 3 + static_cast<int>(options.pass_fds.size()) + 64;
      std::vector<int> lifted;
      for (int fd : options.pass_fds) lifted.push_back(::fcntl(fd, F_DUPFD_CLOEXEC, above));
      for (size_t i = 0; i < lifted.size(); ++i) ::dup2(lifted[i], 3 + static_cast<int>(i));
    }
    drop_to(mode, options.groups);
    if (::chdir(g.scratch.c_str()) != 0) ::_exit(122);
    ::execve(argv[0], argv.data(), envp.data());
    std::perror("exec openshell");
    ::_exit(123);
  }
  {
    std::lock_guard<std::mutex> lock(g.made_mutex);
    g.started_pids[std::to_string(pid)] = start_time_of(std::to_string(pid));
  }
  ::close(in_pipe[0]);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (slave >= 0) ::close(slave);

  // Feed stdin, collect output, enforce the timeout.
  std::string pending = options.stdin_data;
  int in_fd = in_pipe[1];
  if (options.pty) {
    ::close(in_fd);
    in_fd = -1;
    if (!pending.empty()) {
      ssize_t ignored = ::write(master, pending.data(), pending.size());
      (void)ignored;
    }
    pending.clear();
  } else if (pending.empty()) {
    ::close(in_fd);
    in_fd = -1;
  }
  int out_fd = options.pty ? master : out_pipe[0];
  int err_fd = options.pty ? -1 : err_pipe[0];
  if (options.pty) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
  }
  const long deadline = now_ms() + options.timeout_s * 1000L;
  bool signalled = false;
  // Once openshell has exited, what it left running (a detached
  // container's process holds the pipes it was given) may keep them open:
  // its output is what came before the pipes fell quiet for a moment.
  int status = 0;
  bool exited = false;
  long quiet_since = 0;
  while (out_fd >= 0 || err_fd >= 0) {
    if (!exited && ::waitpid(pid, &status, WNOHANG) == pid) {
      exited = true;
      quiet_since = now_ms();
    }
    if (exited && now_ms() - quiet_since > 300) break;
    if (options.signal && !signalled && result.out.find(options.signal_when) != std::string::npos) {
      ::kill(pid, options.signal);
      signalled = true;
    }
    long left = deadline - now_ms();
    if (left <= 0) {
      result.timed_out = true;
      ::kill(-pid, SIGKILL);
      ::kill(pid, SIGKILL);
      break;
    }
    pollfd fds[3] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}, {in_fd, POLLOUT, 0}};
    if (::poll(fds, 3, static_cast<int>(std::min(left, exited ? 50L : 200L))) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      quiet_since = now_ms();
      char buf[8192];
      ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? result.out : result.err).append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        if (options.pty && fds[i].fd == master) result.pty_settings_after = pty_settings(master);
        ::close(fds[i].fd);
        (i == 0 ? out_fd : err_fd) = -1;
      }
    }
    if (in_fd >= 0 && fds[2].revents) {
      ssize_t n = ::write(in_fd, pending.data(), pending.size());
      if (n > 0) pending.erase(0, static_cast<size_t>(n));
      if (n < 0 || pending.empty()) {
        ::close(in_fd);
        in_fd = -1;
      }
    }
  }
  if (options.pty && out_fd == master) result.pty_settings_after = pty_settings(master);
  for (int fd : {out_fd, err_fd, in_fd})
    if (fd >= 0) ::close(fd);
  while (!exited && ::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  note_sandboxes(mode, options.env);
  return result;
}

PtyProcess::PtyProcess(Mode mode, const std::vector<std::string>& args,
                       const std::vector<std::string>& env, unsigned short rows,
                       unsigned short cols)
    : mode_(mode), env_(env) {
  winsize size{rows, cols, 0, 0};
  int slave = -1;
  if (::openpty(&master_, &slave, nullptr, nullptr, &size) != 0) {
    master_ = -1;
    return;
  }
  ::fcntl(master_, F_SETFD, FD_CLOEXEC);
  std::vector<std::string> argv_strings = {g.binary};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_strings) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_strings = openshell_env(env);
  std::vector<char*> envp;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  pid_ = ::fork();
  if (pid_ == 0) {
    ::setsid();
    ::ioctl(slave, TIOCSCTTY, 0);
    for (int fd = 0; fd < 3; ++fd) ::dup2(slave, fd);
    if (slave > 2) ::close(slave);
    drop_to(mode, {});
    if (::chdir(g.scratch.c_str()) != 0) ::_exit(122);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(123);
  }
  ::close(slave);
  std::lock_guard<std::mutex> lock(g.made_mutex);
  g.started_pids[std::to_string(pid_)] = start_time_of(std::to_string(pid_));
}

PtyProcess::~PtyProcess() {
  if (pid_ > 0 && !status_) {
    ::kill(pid_, SIGKILL);
    wait(5000);
  }
  if (master_ >= 0) ::close(master_);
}

void PtyProcess::write(const std::string& bytes) {
  size_t done = 0;
  while (done < bytes.size() && master_ >= 0) {
    ssize_t n = ::write(master_, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
}

void PtyProcess::resize(unsigned short rows, unsigned short cols) {
  winsize size{rows, cols, 0, 0};
  ::ioctl(master_, TIOCSWINSZ, &size);
  if (pid_ > 0) ::kill(pid_, SIGWINCH);
}

bool PtyProcess::read_some(int timeout_ms) {
  if (master_ < 0 || eof_) return false;
  pollfd p{master_, POLLIN, 0};
  if (::poll(&p, 1, timeout_ms) <= 0) return false;
  char buf[65536];
  ssize_t n = ::read(master_, buf, sizeof buf);
  if (n > 0) {
    output_.append(buf, static_cast<size_t>(n));
    return true;
  }
  // EIO: the last holder of the terminal's other side has gone.
  if (n == 0 || errno != EINTR) eof_ = true;
  return false;
}

bool PtyProcess::wait_for(const std::string& text, int timeout_ms, size_t from) {
  const long deadline = now_ms() + timeout_ms;
  for (;;) {
    if (output_.size() > from && output_.find(text, from) != std::string::npos) return true;
    const long left = deadline - now_ms();
    if (left <= 0 || eof_) return false;
    read_some(static_cast<int>(std::min(left, 200L)));
  }
}

int PtyProcess::wait(int timeout_ms) {
  if (status_) return *status_;
  if (pid_ <= 0) return -1;
  const long deadline = now_ms() + timeout_ms;
  for (;;) {
    int status = 0;
    pid_t got = ::waitpid(pid_, &status, WNOHANG);
    if (got == pid_) {
      while (read_some(50)) {
      }
      status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      note_sandboxes(mode_, env_);
      return *status_;
    }
    if (now_ms() >= deadline) {
      ::kill(pid_, SIGKILL);
      while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
      }
      status_ = -1;
      note_sandboxes(mode_, env_);
      return -1;
    }
    if (!read_some(50)) ::usleep(10000);
  }
}

Result sandbox(Mode mode, const std::vector<std::string>& run_args,
               const std::vector<std::string>& command, const Options& options) {
  std::vector<std::string> args = {"run", "--rootfs", g.rootfs};
  args.insert(args.end(), run_args.begin(), run_args.end());
  args.push_back("--");
  args.insert(args.end(), command.begin(), command.end());
  return openshell(mode, args, options);
}

std::string make_dir(Mode mode, const std::string& name, mode_t perms) {
  std::string path = g.scratch + "/" + name;
  ::mkdir(path.c_str(), perms);
  ::chmod(path.c_str(), perms);
  if (::chown(path.c_str(), uid_of(mode), gid_of(mode)) != 0) std::perror("chown");
  return path;
}

std::string write_file(const std::string& path, const std::string& content, mode_t perms) {
  std::ofstream out(path, std::ios::trunc);
  out << content;
  out.close();
  ::chmod(path.c_str(), perms);
  return path;
}

std::string file_contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool take_http_body(const std::string& data, size_t from, bool chunked, size_t length,
                    std::string* body, size_t* next) {
  if (!chunked) {
    if (data.size() < from + length) return false;
    body->assign(data, from, length);
    *next = from + length;
    return true;
  }
  body->clear();
  for (size_t at = from;;) {
    size_t eol = data.find("\r\n", at);
    if (eol == std::string::npos) return false;
    size_t size = std::strtoul(data.substr(at, eol - at).c_str(), nullptr, 16);
    if (data.size() < eol + 2 + size + 2) return false;
    if (size == 0) {
      *next = eol + 4;
      return true;
    }
    body->append(data, eol + 2, size);
    at = eol + 2 + size + 2;
  }
}

std::string file_contents_of_dir(const std::string& dir) {
  std::string out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    if (!std::strcmp(e->d_name, ".") || !std::strcmp(e->d_name, "..")) continue;
    out += (out.empty() ? "" : " ") + std::string(e->d_name);
  }
  ::closedir(d);
  return out;
}

std::vector<std::string> files_holding(const std::string& dir, const std::string& text) {
  std::vector<std::string> found;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
    if (it->is_regular_file(ec) && file_contents(it->path()).find(text) != std::string::npos)
      found.push_back(it->path());
  return found;
}

std::string command_of(const std::string& pid) {
  std::string cmd = file_contents("/proc/" + pid + "/cmdline");
  for (char& c : cmd)
    if (c == '\0') c = ' ';
  return cmd;
}

std::string environment_of(const std::string& pid) {
  return file_contents("/proc/" + pid + "/environ");
}

std::vector<std::string> processes_matching(const std::string& text) {
  std::vector<std::string> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  std::string self = std::to_string(::getpid());
  while (dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9' || self == e->d_name) continue;
    if (command_of(e->d_name).find(text) != std::string::npos) out.push_back(e->d_name);
  }
  ::closedir(proc);
  return out;
}

std::vector<std::string> gateway_processes(const std::string& home) {
  std::vector<std::string> out;
  for (const auto& pid : processes_matching("openshell"))
    if (environment_of(pid).find("OPENSHELL_HOME=" + home + '\0') != std::string::npos)
      out.push_back(pid + ":" + command_of(pid));
  return out;
}

std::vector<std::string> stop_gateway(Mode mode, const std::string& home) {
  Options o;
  o.env.push_back("OPENSHELL_HOME=" + home);
  note_sandboxes(mode, o.env);
  openshell(mode, {"sandbox", "delete", "--all"}, o);
  openshell(mode, {"gateway", "stop"}, o);
  // Generous for a loaded machine; ends as soon as they are gone.
  for (int i = 0; i < 3000 && !gateway_processes(home).empty(); ++i) ::usleep(10000);
  return gateway_processes(home);
}

bool kill_and_wait(const std::string& pid) {
  if (::kill(std::stoi(pid), SIGKILL) != 0) return errno == ESRCH;
  // Ended: gone from /proc, or a zombie (its files are closed).
  auto alive = [&] {
    std::string stat = file_contents("/proc/" + pid + "/stat");
    auto paren = stat.rfind(')');
    return paren != std::string::npos && paren + 2 < stat.size() && stat[paren + 2] != 'Z';
  };
  for (int i = 0; i < 1500 && alive(); ++i) ::usleep(20000);
  return !alive();
}

GatewayGuard::~GatewayGuard() {
  EXPECT_EQ(stop_gateway(mode_, home_), std::vector<std::string>{}) << "gateway left: " << home_;
}

namespace {

// Others may run sandboxes beside the tests: a sandbox process counts as
// another's when the first of its ancestors outside any sandbox (in our pid
// namespace) runs another binary than the tests' copy. An orphan, whose
// owner is gone, counts as ours: a leak is a leak.
int pid_depth(const std::string& pid) {
  std::string status = file_contents("/proc/" + pid + "/status");
  auto at = status.find("\nNSpid:");
  if (at == std::string::npos) return 0;
  std::istringstream words(status.substr(at + 8, status.find('\n', at + 1) - at - 8));
  int depth = 0;
  for (long p; words >> p;) ++depth;
  return depth;
}

std::string parent_of(const std::string& pid) {
  std::string status = file_contents("/proc/" + pid + "/status");
  auto at = status.find("\nPPid:\t");
  if (at == std::string::npos) return "";
  return status.substr(at + 7, status.find('\n', at + 1) - at - 7);
}

bool started_by_another(const std::string& pid) {
  static const int own_depth = pid_depth("self");
  std::string p = pid;
  for (int hops = 0; hops < 64 && !p.empty() && p != "0" && p != "1"; ++hops) {
    // A process gone meanwhile leaks nothing, and says nothing of whose it was.
    if (file_contents("/proc/" + p + "/status").empty()) return true;
    if (pid_depth(p) <= own_depth) {
      char exe[4096];
      ssize_t n = ::readlink(("/proc/" + p + "/exe").c_str(), exe, sizeof exe - 1);
      // A zombie, or one on its way out, has no program left: judge it by
      // its parent.
      if (n > 0) return std::string(exe, static_cast<size_t>(n)) != g.binary;
    }
    p = parent_of(p);
  }
  return false;
}

// A cgroup is the tests' when its name is one a test's openshell gives it
// (openshell-run-PID for `run`, openshell-ID for a gateway's sandbox), or
// when a process of the tests' is in it. An empty one of another's is not.
bool made_by_tests(const std::string& cgroup) {
  std::string name = cgroup.substr(cgroup.rfind('/') + 1);
  {
    std::lock_guard<std::mutex> lock(g.made_mutex);
    if (name.rfind("openshell-run-", 0) == 0) {
      // Ours unless that pid is now another process (another's run).
      auto it = g.started_pids.find(name.substr(14));
      if (it != g.started_pids.end()) {
        std::string now = start_time_of(it->first);
        if (now.empty() || now == it->second) return true;
      }
    }
    if (g.sandbox_ids.count(name.substr(10))) return true;
  }
  std::istringstream pids(file_contents(cgroup + "/cgroup.procs"));
  for (std::string pid; pids >> pid;)
    if (!started_by_another(pid)) return true;
  return false;
}

}  // namespace

void forget_started_processes() {
  std::lock_guard<std::mutex> lock(g.made_mutex);
  g.started_pids.clear();
}

std::vector<std::string> leftover_mounts() {
  std::vector<std::string> out;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  // Field 5 is the mount point. Another e2e run's scratch directory (and
  // its users' state) is not ours; a pivot's leftover anywhere is a leak.
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    fields >> id >> parent >> dev >> root >> point;
    bool ours = point.rfind(g.scratch + "/", 0) == 0 || root.rfind(g.scratch + "/", 0) == 0;
    bool pivot = point.ends_with("/newroot") || point.ends_with("/oldroot");
    if (ours || pivot) out.push_back(line);
  }
  return out;
}

std::vector<std::string> leftover_cgroups() {
  std::vector<std::string> out;
  // Depth-limited walk of the cgroup hierarchies for openshell-* directories.
  std::vector<std::pair<std::string, int>> stack = {{"/sys/fs/cgroup", 0}};
  while (!stack.empty()) {
    auto [dir, depth] = stack.back();
    stack.pop_back();
    DIR* d = ::opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = ::readdir(d)) {
      if (e->d_type != DT_DIR || e->d_name[0] == '.') continue;
      std::string path = dir + "/" + e->d_name;
      if (std::strncmp(e->d_name, "openshell-", 10) == 0) {
        if (made_by_tests(path)) out.push_back(path);
      } else if (depth < 4)
        stack.push_back({path, depth + 1});
    }
    ::closedir(d);
  }
  return out;
}

void remove_empty_cgroups(const std::string& name) {
  std::error_code ec;
  for (const auto& hierarchy : std::filesystem::directory_iterator("/sys/fs/cgroup", ec)) {
    const std::filesystem::path top = hierarchy.path() / name;
    if (!std::filesystem::is_directory(top, ec)) continue;
    std::vector<std::string> dirs;
    for (const auto& e : std::filesystem::recursive_directory_iterator(top, ec))
      if (e.is_directory(ec)) dirs.push_back(e.path().string());
    // Deepest first, then the top.
    std::sort(dirs.begin(), dirs.end(), [](const std::string& a, const std::string& b) {
      return std::count(a.begin(), a.end(), '/') > std::count(b.begin(), b.end(), '/');
    });
    for (const std::string& dir : dirs) ::rmdir(dir.c_str());
    ::rmdir(top.c_str());
  }
}

std::vector<std::string> leftover_processes() {
  std::vector<std::string> out;
  DIR* proc = ::opendir("/proc");
  if (!proc) return out;
  while (dirent* e = ::readdir(proc)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::string cmdline = file_contents(std::string("/proc/") + e->d_name + "/cmdline");
    if (cmdline.rfind("openshell-init", 0) == 0 && !started_by_another(e->d_name))
      out.push_back(e->d_name);
  }
  ::closedir(proc);
  return out;
}

namespace {

void serve_connection(int fd) {
  std::string data;
  char buf[4096];
  bool echo = false;
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) break;
    ssize_t n = ::read(fd, buf, sizeof buf);
    if (n <= 0) break;
    if (echo) {
      if (::write(fd, buf, static_cast<size_t>(n)) < 0) break;
      continue;
    }
    data.append(buf, static_cast<size_t>(n));
    size_t end = data.find("\r\n\r\n");
    if (data.rfind("GET ", 0) == 0 && end != std::string::npos) {
      if (data.find("Upgrade: websocket") != std::string::npos) {
        std::string reply =
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
        if (::write(fd, reply.data(), reply.size()) < 0) break;
        std::string rest = data.substr(end + 4);
        if (!rest.empty() && ::write(fd, rest.data(), rest.size()) < 0) break;
        echo = true;
        continue;
      }
      std::string body = "hello from the test server\n";
      std::string reply = "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) +
                          "\r\nConnection: close\r\n\r\n" + body;
      ssize_t ignored = ::write(fd, reply.data(), reply.size());
      (void)ignored;
      break;
    }
    if (data.rfind("GET ", 0) != 0 && data.size() >= 4) {
      // Not HTTP: echo from now on.
      echo = true;
      if (::write(fd, data.data(), data.size()) < 0) break;
    }
  }
  ::close(fd);
}

}  // namespace

LoopbackTcpServer::LoopbackTcpServer(std::function<void(int fd)> serve) {
  listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  ::listen(listener_, 64);
  socklen_t len = sizeof addr;
  ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this, serve = std::move(serve)] {
    std::vector<std::thread> connections;
    while (!stop_) {
      pollfd p{listener_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd >= 0) connections.emplace_back(serve, fd);
    }
    for (auto& t : connections) t.join();
  });
}

RefusedPort::RefusedPort() {
  socket_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (socket_ < 0 || ::bind(socket_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
    ADD_FAILURE() << "bind a port to refuse: " << std::strerror(errno);
  socklen_t len = sizeof addr;
  ::getsockname(socket_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
}

RefusedPort::~RefusedPort() {
  if (socket_ >= 0) ::close(socket_);
}

LoopbackTcpServer::~LoopbackTcpServer() {
  stop_ = true;
  thread_.join();
  ::close(listener_);
}

bool hardware_kvm() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line);
    for (std::string w; words >> w;)
      if (w == "vmx" || w == "svm") return true;
  }
  return false;
}

TestServer::TestServer()
    : server_([this](int fd) {
        ++connections_;
        serve_connection(fd);
        ++finished_;
      }) {}

TestDnsServer::TestDnsServer() {
  socket_ = ::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(socket_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(socket_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] {
    while (!stop_) {
      pollfd p{socket_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      unsigned char q[512];
      sockaddr_in from{};
      socklen_t flen = sizeof from;
      ssize_t n = ::recvfrom(socket_, q, sizeof q, 0, reinterpret_cast<sockaddr*>(&from), &flen);
      if (n < 12) continue;
      ++queries_;
      // Echo the query as a response with one answer for A queries.
      std::string r(reinterpret_cast<char*>(q), static_cast<size_t>(n));
      r[2] = static_cast<char>(0x81);  // QR, RD
      r[3] = static_cast<char>(0x80);  // RA, NOERROR
      uint16_t qtype = static_cast<uint16_t>((q[n - 4] << 8) | q[n - 3]);
      if (qtype == 1) {
        r[7] = 1;  // ANCOUNT 1
        const unsigned char answer[] = {0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 30, 0, 4, 127, 0, 0, 1};
        r.append(reinterpret_cast<const char*>(answer), sizeof answer);
      }
      ::sendto(socket_, r.data(), r.size(), 0, reinterpret_cast<sockaddr*>(&from), flen);
    }
  });
}

TestDnsServer::~TestDnsServer() {
  stop_ = true;
  thread_.join();
  ::close(socket_);
}

}  // namespace e2e
