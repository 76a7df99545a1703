#include "supervisor/guest_vm.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <utility>
#include <variant>

#include "base/directory.h"
#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "image/resolve.h"
#include "image/store.h"
#include "policy/policy.h"
#include "runtime/guest_init.h"
#include "supervisor/vm_disks.h"
#include "vm/disk.h"
#include "vm/host_channel.h"
#include "vm/initramfs.h"
#include "vm/layout.h"

namespace openshell::supervisor {

namespace {

// The guest's kernel command line: the console on the serial port (kept in
// the sandbox's log), a reset for a reboot (the VMM ends there), a panic
// that ends the guest at once rather than hanging it. The devices' windows
// are added by the VMM.
constexpr const char* kCmdline = "console=ttyS0 reboot=k panic=-1 quiet";

// After the grace a stop gives the main process: the time the guest's init
// has to report and power off before its VMM is killed.
constexpr int kPowerOffMs = 3000;

// DIR/init-<device>-<inode>-<size>-<mtime>.cpio: this binary's archive,
// found again by every start until the binary is replaced; the archives of
// binaries replaced since are removed when a new one is made.
std::string init_archive(const std::string& dir) {
  struct stat st {};
  if (::stat("/proc/self/exe", &st) != 0) throw_errno("stat /proc/self/exe");
  const std::string name = "init-" + std::to_string(st.st_dev) + "-" + std::to_string(st.st_ino) +
                           "-" + std::to_string(st.st_size) + "-" +
                           std::to_string(st.st_mtim.tv_sec) + "." +
                           std::to_string(st.st_mtim.tv_nsec) + ".cpio";
  const std::string path = dir + "/" + name;
  if (files::exists(path)) return path;
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) throw_errno("create " + dir);
  files::write_atomically(path, vm::initramfs::init_archive("/proc/self/exe"));
  for (const std::string& other : files::list_directory(dir))
    if (other != name && other.rfind("init-", 0) == 0 && other.size() > 5 &&
        other.compare(other.size() - 5, 5, ".cpio") == 0)
      ::unlink((dir + "/" + other).c_str());
  return path;
}

image::ImageRecord image_record(const SandboxImage& image) {
  image::ImageRecord record;
  record.name = image.name;
  record.config_digest = image.id;
  record.manifest_digest = image.digest;
  record.diff_ids = image.layers;
  return record;
}

}  // namespace

runtime::guest::Config guest_config(const runtime::ContainerSpec& container) {
  runtime::guest::Config config;
  config.disk = "/dev/vda";
  config.layer = "/dev/vdb";
  config.argv = container.argv;
  config.env = container.env;
  config.workdir = container.fs.workdir.empty() ? "/" : container.fs.workdir;
  config.uid = container.uid;
  config.gid = container.gid;
  config.port = vm::layout::kGuestInitPort;
  config.status_port = vm::layout::kHostStatusPort;
  config.egress_port = container.egress ? vm::layout::kHostEgressPort : 0;
  config.dns_port = container.egress ? vm::layout::kHostDnsPort : 0;
  config.hostname = container.hostname;
  // The policy, not this kernel's plan: the guest's kernel has an ABI of
  // its own.
  if (container.landlock_policy.has_filesystem_policy) {
    config.landlock_policy = policy::to_toml(container.landlock_policy);
    config.landlock_warn_missing = container.landlock.warn_missing;
  }
  config.proc_read_only = container.fs.proc_read_only;
  return config;
}

GuestVmPlan prepare_guest_vm(const SandboxSpec& spec, const runtime::ContainerSpec& container,
                             const std::string& sandbox_dir, const std::string& images_dir) {
  if (!spec.vm) throw Error("sandbox spec: not a micro-VM sandbox");
  if (!spec.image && (spec.from.empty() || spec.from[0] != '/'))
    throw Error("--vm needs an image or a directory: the host's root cannot be a guest's disk");
  GuestVmPlan plan;
  plan.kernel = spec.vm->kernel;
  plan.vcpus = spec.vm->vcpus;
  plan.memory_mib = spec.vm->memory_mib;
  plan.cmdline = kCmdline;
  image::Store store(images_dir);
  if (spec.image) {
    plan.image_disk = image_vm_disk(store, image_record(*spec.image)).path;
  } else {
    plan.image_disk = sandbox_dir + "/root.ext4";
    vm::disk::directory_disk(plan.image_disk, spec.from);
  }
  plan.layer = sandbox_vm_layer(sandbox_dir);

  const runtime::guest::Config config = guest_config(container);
  // Two archives, uncompressed (the guest's kernel unpacks them faster than
  // it would inflate them): this binary as /init, made once per binary and
  // kept with the image disks, and the configuration, made at each start
  // and removed when the VM ends.
  plan.initramfs = {init_archive(images_dir + "/vm-disks"), sandbox_dir + "/vm-config.cpio"};
  files::write_atomically(plan.initramfs[1],
                          vm::initramfs::config_archive(runtime::guest::encode_config(config)));
  return plan;
}

egress::NetworkRules::PathResolver guest_path_resolver(const SandboxSpec& spec,
                                                       const std::string& images_dir) {
  std::vector<std::string> roots;  // top first
  if (spec.image) {
    image::Store store(images_dir);
    for (auto it = spec.image->layers.rbegin(); it != spec.image->layers.rend(); ++it)
      roots.push_back(store.layer_root(*it));
  } else if (!spec.from.empty() && spec.from[0] == '/') {
    roots.push_back(spec.from);
  } else {
    return {};
  }
  return [roots = std::move(roots)](const std::string& path) {
    return image::resolve_in_layers(roots, path);
  };
}

std::vector<std::string> vmm_argv(const GuestVmPlan& plan) {
  std::vector<std::string> argv = {"openshell",    "__vmm",
                                   "--kernel",     plan.kernel,
                                   "--cmdline",    plan.cmdline,
                                   "--memory",     std::to_string(plan.memory_mib),
                                   "--vcpus",      std::to_string(plan.vcpus),
                                   "--disk-ro",    plan.image_disk,
                                   "--disk",       plan.layer,
                                   "--channel-fd", std::to_string(kVmmChannelFd)};
  for (const std::string& part : plan.initramfs) {
    argv.push_back("--initramfs");
    argv.push_back(part);
  }
  for (uint32_t port :
       {vm::layout::kHostStatusPort, vm::layout::kHostEgressPort, vm::layout::kHostDnsPort}) {
    argv.push_back("--host-port");
    argv.push_back(std::to_string(port));
  }
  return argv;
}

void serve_guest_port(egress::Proxy& proxy, uint32_t host_port, UniqueFd fd) {
  if (host_port == vm::layout::kHostEgressPort)
    proxy.serve_guest_connection(std::move(fd));
  else if (host_port == vm::layout::kHostDnsPort)
    proxy.serve_dns_stream(std::move(fd));
}

GuestVm::GuestVm(asio::io_context& io, Events events)
    : io_(io),
      events_(std::move(events)),
      pidfd_(io),
      channel_(io),
      status_(io),
      out_(io),
      err_(io),
      kill_timer_(io) {}

GuestVm::~GuestVm() {
  *alive_ = false;
  if (running()) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  if (!initramfs_.empty()) ::unlink(initramfs_.c_str());
}

void GuestVm::start(const GuestVmPlan& plan) {
  int channel[2], out[2], err[2];
  if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, channel) != 0)
    throw_errno("socketpair");
  UniqueFd ours(channel[0]), theirs(channel[1]);
  if (::pipe2(out, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd out_read(out[0]), out_write(out[1]);
  if (::pipe2(err, O_CLOEXEC) != 0) throw_errno("pipe");
  UniqueFd err_read(err[0]), err_write(err[1]);
  UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!null) throw_errno("open /dev/null");

  // Everything the child needs is made before the fork: between fork and
  // exec it only moves descriptors.
  const std::vector<std::string> args = vmm_argv(plan);
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) throw_errno("fork");
  if (pid == 0) {
    // The VMM ends with its supervisor, whatever kills that.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(125);
    ::setsid();
    if (::dup2(null.get(), 0) < 0 || ::dup2(out_write.get(), 1) < 0 ||
        ::dup2(err_write.get(), 2) < 0 || ::dup2(theirs.get(), kVmmChannelFd) < 0)
      ::_exit(125);
    ::syscall(SYS_close_range, kVmmChannelFd + 1, ~0U, 0);
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::execv("/proc/self/exe", argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  initramfs_ = plan.initramfs.back();
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    const int e = errno;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    exited_ = true;
    throw_errno("pidfd_open", e);
  }
  pidfd_.assign(pidfd);
  channel_.assign(ours.release());
  out_.assign(out_read.release());
  err_.assign(err_read.release());
  open_streams_ = 2;
  read_stream(out_, "stdout");
  read_stream(err_, "stderr");
  watch_channel();
  watch_exit();
}

void GuestVm::read_stream(asio::posix::stream_descriptor& stream, const std::string& name) {
  auto buffer = std::make_shared<std::array<char, 16384>>();
  std::weak_ptr<bool> alive = alive_;
  stream.async_read_some(asio::buffer(*buffer), [this, alive, &stream, name, buffer](
                                                    const boost::system::error_code& ec, size_t n) {
    if (alive.expired() || !*alive.lock()) return;
    if (ec) {
      if (!err_partial_.empty() && name == "stderr") last_err_line_ = err_partial_;
      --open_streams_;
      maybe_end();
      return;
    }
    const std::string_view bytes(buffer->data(), n);
    if (name == "stderr") {
      // The last whole line the VMM wrote: why it ended, when it says.
      err_partial_.append(bytes);
      size_t nl;
      while ((nl = err_partial_.find('\n')) != std::string::npos) {
        if (nl > 0) last_err_line_ = err_partial_.substr(0, nl);
        err_partial_.erase(0, nl + 1);
      }
      if (err_partial_.size() > 4096) err_partial_.erase(0, err_partial_.size() - 4096);
    }
    if (events_.output) events_.output(name, bytes);
    read_stream(stream, name);
  });
}

void GuestVm::watch_exit() {
  std::weak_ptr<bool> alive = alive_;
  pidfd_.async_wait(
      asio::posix::descriptor_base::wait_read, [this, alive](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !*alive.lock()) return;
        int status = 0;
        while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
        }
        exited_ = true;
        kill_timer_.cancel();
        vmm_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        boost::system::error_code ignored;
        channel_.close(ignored);
        for (auto& [id, done] : std::map(std::move(pending_))) done({}, "the VM has ended");
        pending_.clear();
        if (!initramfs_.empty()) ::unlink(initramfs_.c_str());
        initramfs_.clear();
        maybe_end();
      });
}

void GuestVm::maybe_end() {
  if (ended_ || !exited_ || open_streams_ > 0) return;
  ended_ = true;
  // What the status stream still holds is read first: an `exit` the init
  // sent just before it powered off.
  if (status_.is_open()) {
    const int fd = status_.native_handle();
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    char buffer[4096];
    long n;
    while ((n = ::read(fd, buffer, sizeof buffer)) > 0) {
      status_buffer_.append(buffer, static_cast<size_t>(n));
      size_t nl;
      while ((nl = status_buffer_.find('\n')) != std::string::npos) {
        const std::string line = status_buffer_.substr(0, nl);
        status_buffer_.erase(0, nl + 1);
        on_status_line(line);
      }
    }
    boost::system::error_code ignored;
    status_.close(ignored);
  }
  if (events_.ended) events_.ended(vmm_status_, last_err_line_);
}

void GuestVm::watch_channel() {
  std::weak_ptr<bool> alive = alive_;
  channel_.async_wait(
      asio::posix::descriptor_base::wait_read, [this, alive](const boost::system::error_code& ec) {
        if (ec || alive.expired() || !*alive.lock()) return;
        vm::host_channel::Datagram datagram = vm::host_channel::receive(channel_.native_handle());
        if (datagram.closed) return;  // the VMM is gone: its exit says the rest
        std::string why;
        if (!datagram.problem.empty()) {
          log::error("the VMM's channel: " + datagram.problem);
        } else if (!datagram.text.empty()) {
          auto message = vm::host_channel::parse(datagram, &why);
          if (message)
            on_channel(*message, std::move(datagram.fd));
          else
            log::error("the VMM's channel: " + why);
        }
        watch_channel();
      });
}

void GuestVm::on_channel(const vm::host_channel::Message& message, UniqueFd fd) {
  namespace hc = vm::host_channel;
  if (const auto* accepted = std::get_if<hc::Accepted>(&message)) {
    // Only the guest's init binds a reserved port (guest_relay.h): a
    // connection from any other is a sandbox process's, which may not speak
    // for the init nor name its own binary to the proxy.
    if (accepted->guest_port >= 1024) {
      log_refusal(accepted->host_port, accepted->guest_port);
      return;
    }
    if (accepted->host_port == vm::layout::kHostStatusPort && !status_.is_open()) {
      status_.assign(fd.release());
      watch_status();
      if (pending_stop_) send_stop(*std::exchange(pending_stop_, std::nullopt));
    } else if (events_.accepted) {
      events_.accepted(accepted->host_port, std::move(fd));
    }
    return;
  }
  const auto* connected = std::get_if<hc::Connected>(&message);
  const auto* refused = std::get_if<hc::Refused>(&message);
  if (!connected && !refused) {
    log::error("the VMM's channel: a message for the VMM came back");
    return;
  }
  auto it = pending_.find(connected ? connected->id : refused->id);
  if (it == pending_.end()) return;
  OnConnect done = std::move(it->second);
  pending_.erase(it);
  if (connected && fd)
    done(std::move(fd), "");
  else
    done({}, refused && !refused->reason.empty() ? refused->reason
                                                 : "the guest refused the connection");
}

void GuestVm::log_refusal(uint32_t host_port, uint32_t guest_port) {
  const std::string line = "openshell: refused a guest connection to host port " +
                           std::to_string(host_port) + " from guest port " +
                           std::to_string(guest_port) +
                           " (not a reserved port: not the guest's init)\n";
  log::error(line.substr(11, line.size() - 12));
  if (events_.output) events_.output("stderr", line);
}

void GuestVm::watch_status() {
  auto buffer = std::make_shared<std::array<char, 4096>>();
  std::weak_ptr<bool> alive = alive_;
  status_.async_read_some(asio::buffer(*buffer),
                          [this, alive, buffer](const boost::system::error_code& ec, size_t n) {
                            if (alive.expired() || !*alive.lock()) return;
                            if (ec) {
                              if (ec != asio::error::operation_aborted) {
                                boost::system::error_code ignored;
                                status_.close(ignored);
                              }
                              return;
                            }
                            status_buffer_.append(buffer->data(), n);
                            size_t nl;
                            while ((nl = status_buffer_.find('\n')) != std::string::npos) {
                              const std::string line = status_buffer_.substr(0, nl);
                              status_buffer_.erase(0, nl + 1);
                              on_status_line(line);
                            }
                            if (status_buffer_.size() > 4096) {
                              log::error("the guest's status stream: a line over 4096 bytes");
                              boost::system::error_code ignored;
                              status_.close(ignored);
                              return;
                            }
                            watch_status();
                          });
}

void GuestVm::on_status_line(const std::string& line) {
  const size_t space = line.find(' ');
  const std::string verb = line.substr(0, space);
  const std::string rest = space == std::string::npos ? "" : line.substr(space + 1);
  char* end = nullptr;
  const long value = std::strtol(rest.c_str(), &end, 10);
  const bool number = !rest.empty() && end != rest.c_str() && value >= 0 && value <= 0x7fffffff;
  if (verb == "ready" && number) {
    if (events_.ready) events_.ready(static_cast<pid_t>(value));
  } else if (verb == "exit" && number && *end == '\0') {
    if (events_.main_exited) events_.main_exited(static_cast<int>(value));
  } else if (verb == "failed" && number && *end == ' ') {
    if (events_.failed) events_.failed(static_cast<int>(value), std::string(end + 1));
  } else {
    log::error("the guest's status stream: an unknown line: " + line.substr(0, 200));
  }
}

void GuestVm::stop(int grace_ms) {
  if (!running()) return;
  if (status_.is_open()) {
    send_stop(grace_ms);
  } else {
    // Still booting: the init is asked once it connects, and the VM is
    // killed if it has not by then.
    pending_stop_ = grace_ms;
    arm_kill(kPowerOffMs);
  }
}

void GuestVm::send_stop(int grace_ms) {
  const std::string line = "stop " + std::to_string(grace_ms) + "\n";
  // One short line on a stream that is read at once: a full buffer here
  // means a guest that does not read, whom the timer ends.
  if (::send(status_.native_handle(), line.data(), line.size(), MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
    log::debug("the guest's status stream refused the stop");
  arm_kill(grace_ms + kPowerOffMs);
}

void GuestVm::arm_kill(int ms) {
  kill_timer_.expires_after(std::chrono::milliseconds(ms));
  std::weak_ptr<bool> alive = alive_;
  kill_timer_.async_wait([this, alive](const boost::system::error_code& ec) {
    if (ec || alive.expired() || !*alive.lock()) return;
    kill();
  });
}

void GuestVm::kill() {
  if (running()) ::kill(pid_, SIGKILL);
}

void GuestVm::connect(uint32_t guest_port, OnConnect done) {
  if (!running() || !channel_.is_open()) return done({}, "the VM is not running");
  const uint64_t id = next_connect_++;
  const std::string why =
      vm::host_channel::send(channel_.native_handle(),
                             vm::host_channel::encode(vm::host_channel::Connect{id, guest_port}));
  if (!why.empty()) return done({}, "the VMM's channel: " + why);
  pending_[id] = std::move(done);
}

}  // namespace openshell::supervisor
