// The micro-VM behind a --vm sandbox (docs/vm.md): the supervisor's child
// `openshell __vmm`, confined, with the sandbox's two disks, an initramfs
// whose /init is this same binary, and one channel (vm/host_channel.h) over
// which every vsock connection between the guest and the host reaches the
// supervisor as a descriptor. The guest's init reports on one of them, the
// status stream: `ready PID`, `exit STATUS`, `failed CODE REASON`; a stop
// goes back on it.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/asio.hpp>

#include "base/unique_fd.h"
#include "egress/proxy.h"
#include "egress/rules.h"
#include "runtime/guest_init.h"
#include "runtime/spec.h"
#include "spec/sandbox_spec.h"
#include "vm/host_channel.h"

namespace openshell::supervisor {

namespace asio = boost::asio;

// What one start of the VM needs, made by prepare_guest_vm.
struct GuestVmPlan {
  std::string kernel;
  // The archives of the initramfs, in order: this binary as /init (kept in
  // the image store's vm-disks/), and SANDBOX_DIR/vm-config.cpio, written
  // for this start.
  std::vector<std::string> initramfs;
  std::string image_disk;  // the image's ext4 (or the --from directory's), read-only (/dev/vda)
  std::string layer;       // the sandbox's writable ext4 (/dev/vdb)
  uint32_t vcpus = 1;
  uint64_t memory_mib = 512;
  std::string cmdline;
};

// The guest's configuration from the container spec the supervisor built:
// argv, env, workdir, user, hostname, the ports, the Landlock policy.
runtime::guest::Config guest_config(const runtime::ContainerSpec& container);

// The disks (the image's, cached in the store; the sandbox's layer, kept),
// the guest's configuration (guest_config), and the initramfs. Throws Error naming what
// failed.
GuestVmPlan prepare_guest_vm(const SandboxSpec& spec, const runtime::ContainerSpec& container,
                             const std::string& sandbox_dir, const std::string& images_dir);

// The network policy's binary paths as the guest will see them: resolved
// in the image's layers (image/resolve.h), or in the --from directory as it
// is now, so that a rule naming a symlink (/bin/wget -> busybox) matches the
// executable the guest's init reports. What the sandbox wrote itself is not
// seen: its layer is an ext4 that only the guest mounts.
egress::NetworkRules::PathResolver guest_path_resolver(const SandboxSpec& spec,
                                                       const std::string& images_dir);

// `openshell __vmm ...` for a plan, its channel on fd 3.
std::vector<std::string> vmm_argv(const GuestVmPlan& plan);
inline constexpr int kVmmChannelFd = 3;

// A guest's connection to one of the host's ports the proxy serves: the
// egress port's to the proxy (identity line first), the DNS port's to its
// stub; any other is closed.
void serve_guest_port(egress::Proxy& proxy, uint32_t host_port, UniqueFd fd);

class GuestVm {
 public:
  struct Events {
    std::function<void(pid_t guest_pid)> ready;             // the main process runs (0: none)
    std::function<void(int status)> main_exited;            // 128+N for signal N
    std::function<void(int code, std::string why)> failed;  // it could not start
    // A guest connection to a host port other than the status stream's.
    std::function<void(uint32_t host_port, UniqueFd fd)> accepted;
    // The VMM's serial port ("stdout") and its own stderr ("stderr").
    std::function<void(const std::string& stream, std::string_view bytes)> output;
    // The VMM is gone and its output read: its exit status (128+N for a
    // signal) and the last line it wrote on stderr. Called once.
    std::function<void(int vmm_status, std::string last_line)> ended;
  };

  GuestVm(asio::io_context& io, Events events);
  ~GuestVm();
  GuestVm(const GuestVm&) = delete;
  GuestVm& operator=(const GuestVm&) = delete;

  // Starts the VMM. Throws Error when it cannot be started.
  void start(const GuestVmPlan& plan);
  // Asks the guest's init to stop the main process (SIGTERM, then SIGKILL
  // after grace_ms); the VMM is killed when the guest has not powered off
  // a moment after that.
  void stop(int grace_ms);
  void kill();
  // A connection to a guest port; done(fd, "") or done({}, why).
  using OnConnect = std::function<void(UniqueFd fd, const std::string& error)>;
  void connect(uint32_t guest_port, OnConnect done);
  pid_t pid() const { return pid_; }
  bool running() const { return pid_ > 0 && !exited_; }

 private:
  void watch_channel();
  void on_channel(const vm::host_channel::Message& message, UniqueFd fd);
  void log_refusal(uint32_t host_port, uint32_t guest_port);
  void send_stop(int grace_ms);
  void arm_kill(int ms);
  void watch_status();
  void on_status_line(const std::string& line);
  void read_stream(asio::posix::stream_descriptor& stream, const std::string& name);
  void watch_exit();
  void maybe_end();

  asio::io_context& io_;
  Events events_;
  pid_t pid_ = 0;
  asio::posix::stream_descriptor pidfd_, channel_, status_, out_, err_;
  asio::steady_timer kill_timer_;
  std::string status_buffer_;
  std::string last_err_line_, err_partial_;
  std::map<uint64_t, OnConnect> pending_;
  uint64_t next_connect_ = 1;
  int open_streams_ = 0;
  bool exited_ = false;
  bool ended_ = false;
  int vmm_status_ = 0;
  std::optional<int> pending_stop_;  // a stop's grace, until the status stream opens
  std::string initramfs_;
  // Each callback checks this: the object may be gone by the time an
  // operation it started completes.
  std::shared_ptr<bool> alive_ = std::make_shared<bool>(true);
};

}  // namespace openshell::supervisor
