// A copy supervisor (supervisor.h): the sandbox's container, with no main
// process and no network, for the one tar of a download or an upload.
#include <fcntl.h>
#include <linux/magic.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>

#include "base/error.h"
#include "base/event_loop.h"
#include "base/log.h"
#include "base/process_name.h"
#include "namespaces/mount_ops.h"
#include "supervisor/exec_session.h"
#include "supervisor/guest_exec.h"
#include "supervisor/owner.h"
#include "supervisor/supervisor.h"

namespace openshell::supervisor {

namespace {

namespace fs = std::filesystem;

// How long a copy supervisor waits for its exec before it gives up.
constexpr auto kIdle = std::chrono::seconds(30);

}  // namespace

void Supervisor::copy_ready(const std::string& line) {
  if (ready_fd_ < 0) return;
  std::string text = line + "\n";
  // A gateway that went away meanwhile hears nothing: the copy ends unused.
  [[maybe_unused]] ssize_t n = ::write(ready_fd_, text.data(), text.size());
  ::close(ready_fd_);
  ready_fd_ = -1;
}

void Supervisor::start_copy_container() {
  if (!spec_error_.empty()) throw Error(spec_error_);
  copy_lock_.reset(::open(paths_.copy_lock(launch_.sandbox_id).c_str(),
                          O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!copy_lock_) throw_errno("open " + paths_.copy_lock(launch_.sandbox_id));
  if (::flock(copy_lock_.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK)
      throw Error("another copy into or out of sandbox '" + launch_.sandbox_name +
                  "' is in progress");
    throw_errno("lock " + paths_.copy_lock(launch_.sandbox_id));
  }
  // The sandbox's own container, less what a copy must not have: a main
  // process (the init just waits), a network (no proxy, no DNS stub: the
  // namespace holds only its loopback) and a terminal. A micro-VM's is its
  // VM, booted with the same less: its writes are in its layer's ext4,
  // which only its guest's kernel reads (the host never parses a file
  // system its guest wrote).
  container_spec_.argv.clear();
  container_spec_.egress = false;
  container_spec_.fs.dns_stub = false;
  container_spec_.tty = false;
  container_spec_.cgroup_name += "-copy";
  socket_path_ = paths_.copy_socket(launch_.sandbox_id);
  listen_for_exec();
  if (spec_.vm) return start_copy_vm();
  UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
  container_spec_.stdin_fd = container_spec_.stdout_fd = container_spec_.stderr_fd = null.get();
  container_ = runtime::Container::start(container_spec_);
  pidfd_.assign(::dup(container_->pidfd()));
  control_.assign(::dup(container_->control_fd()));
  watch_exit();
  watch_control();
}

void Supervisor::copy_container_gone() {
  // A copy's container or VM: nothing of it is the sandbox's record. Its
  // exec hears that it is gone, and has a moment to say so (exec_closed).
  for (auto& [id, session] : std::map(execs_)) session->sandbox_gone();
  for (auto& [id, session] : std::map(guest_execs_)) session->sandbox_gone();
  boost::system::error_code ignored;
  control_.close(ignored);
  if (open_execs_ == 0) return io_.stop();
  exit_timer_.expires_after(std::chrono::milliseconds(5000));
  exit_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec) io_.stop();
  });
}

std::string Supervisor::copy_refusal(const std::vector<std::string>& argv, bool tty) const {
  if (argv.empty() || argv[0] != "tar" || tty)
    return "a sandbox that is not running takes only a download or an upload (see 'openshell "
           "sandbox start')";
  // An upload into a tmpfs of the sandbox's runs (/tmp, /dev/shm) would be
  // gone before anything read it: refused, so that nothing is lost.
  if (argv.size() < 2 || argv[1] != "-x") return {};
  auto c = std::find(argv.begin(), argv.end(), "-C");
  if (c == argv.end() || c + 1 == argv.end()) return {};
  const std::string& dir = *(c + 1);
  if (spec_.vm) {
    // A guest's /dev, /proc and /sys are its kernel's, gone at power-off.
    const fs::path path = fs::path(dir).lexically_normal();
    auto part = path.begin();
    if (part != path.end() && *part == "/") ++part;
    const std::string top = part == path.end() ? "" : part->string();
    if (top != "dev" && top != "proc" && top != "sys") return {};
    return "upload to " + dir + ": the guest kernel's /" + top +
           ", which lives only while the sandbox runs; this one is not running (upload into "
           "/sandbox, or start it first)";
  }
  if (!container_) return {};
  // Resolved in the copy's own root and mounts, as tar there resolves it.
  UniqueFd root(::open(("/proc/" + std::to_string(container_->pid()) + "/root").c_str(),
                       O_PATH | O_DIRECTORY | O_CLOEXEC));
  if (!root) return {};
  UniqueFd target(namespaces::mount_ops::openat2_in_root(
      root.get(), dir.c_str() + dir.find_first_not_of('/'), O_PATH | O_DIRECTORY));
  struct statfs st {};
  if (!target || ::fstatfs(target.get(), &st) != 0 || st.f_type != TMPFS_MAGIC) return {};
  return "upload to " + dir +
         ": a tmpfs that lives only while the sandbox runs; this one is not running (upload into "
         "/sandbox, or start it first)";
}

int Supervisor::run_copy() {
  try {
    load();
    // The sandbox's binds name its CA bundle: a copy has no gateway's
    // welcome, so it makes its own, as every start before made one.
    take_ca("", "");
    start_copy_container();
  } catch (const std::exception& e) {
    copy_ready(std::string("error ") + e.what());
    if (!socket_path_.empty()) ::unlink(socket_path_.c_str());
    if (container_) {
      container_->signal(SIGKILL);
      container_->wait();
    }
    vm_.reset();
    return exit_code::kFailure;
  }
  signals_.async_wait([this](const boost::system::error_code& ec, int) {
    if (!ec) stop(0);
  });
  idle_timer_.expires_after(kIdle);
  idle_timer_.async_wait([this](const boost::system::error_code& ec) {
    if (!ec && next_exec_ == 1) {
      log::error("copy supervisor: no copy came within 30 s");
      stop(0);
    }
  });
  // A VM's copy is ready when its guest's init says so (start_copy_vm).
  if (!spec_.vm) copy_ready("ready");
  run_handling_exceptions(io_, "copy supervisor");
  ::unlink(socket_path_.c_str());
  return result_;
}

void Supervisor::exec_closed() {
  if (!copy_ || --open_execs_ > 0) return;
  // The copy's one exec is over, its last word sent: so is its container.
  if (state_ == State::kRunning)
    stop(0);
  else if (state_ == State::kEnded)
    io_.stop();
}

int copy_main(const std::string& launch_file, int ready_fd) {
  ::signal(SIGPIPE, SIG_IGN);
  process_name::set_comm(process_name::kSupervisorComm);
  if (ready_fd >= 0) ::fcntl(ready_fd, F_SETFD, FD_CLOEXEC);
  try {
    asio::io_context io;
    Supervisor supervisor(io, launch_file, true, ready_fd);
    return supervisor.run_copy();
  } catch (const std::exception& e) {
    log::error(std::string("copy supervisor: ") + e.what());
    return exit_code::kFailure;
  }
}

}  // namespace openshell::supervisor
