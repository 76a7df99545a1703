#include "vm/runner.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <deque>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "vm/boot.h"
#include "vm/confine.h"
#include "vm/guest_memory.h"
#include "vm/host_channel.h"
#include "vm/kvm.h"
#include "vm/layout.h"
#include "vm/virtio_blk.h"
#include "vm/virtio_mmio.h"
#include "vm/virtio_vsock.h"

namespace openshell::vm {

namespace {

constexpr uint64_t kMaxFileBytes = 1ull << 30;

std::vector<uint8_t> read_whole(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(std::string(what) + " " + path + ": cannot be read");
  const auto size = static_cast<uint64_t>(in.tellg());
  if (size > kMaxFileBytes) throw Error(std::string(what) + " " + path + ": larger than 1 GiB");
  std::vector<uint8_t> bytes(size);
  in.seekg(0);
  if (!in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(size)))
    throw Error(std::string(what) + " " + path + ": cannot be read");
  return bytes;
}

// Linux's name for the i-th virtio disk, "vda" to "vdz", then "vdaa": the
// disk's GET_ID answer.
std::string disk_name(size_t index) {
  std::string letters;
  for (size_t i = index + 1; i > 0; i = (i - 1) / 26)
    letters.insert(letters.begin(), static_cast<char>('a' + (i - 1) % 26));
  return "vd" + letters;
}

UniqueFd open_disk(const RunSpec::Disk& disk) {
  const int fd = ::open(disk.path.c_str(), (disk.read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC);
  if (fd < 0) throw_errno("disk " + disk.path);
  return UniqueFd(fd);
}

void check_channel(int fd) {
  int type = 0;
  socklen_t length = sizeof type;
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0)
    throw_errno("channel fd " + std::to_string(fd));
  if (type != SOCK_SEQPACKET)
    throw Error("channel fd " + std::to_string(fd) + ": not a SOCK_SEQPACKET socket");
  if (::fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) throw_errno("channel fd " + std::to_string(fd));
}

// What goes up the channel. Devices add to it on their own threads with
// the device locked (the vsock device's Accept and Connected callbacks),
// so adding only queues and wakes the main thread, which sends.
class Outbox {
 public:
  Outbox() : wake_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!wake_) throw_errno("eventfd for the channel");
  }
  int wake_fd() const { return wake_.get(); }

  void push(std::string text, UniqueFd fd = UniqueFd()) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back({std::move(text), std::move(fd)});
    }
    const uint64_t one = 1;
    ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
    (void)ignored;
  }
  // Sends what is queued until the channel is full (pending() then says
  // so); returns "" or why the channel failed.
  std::string flush(int channel) {
    uint64_t count = 0;
    ssize_t ignored = ::read(wake_.get(), &count, sizeof count);
    (void)ignored;
    std::lock_guard lock(mutex_);
    while (!queue_.empty()) {
      // A supervisor that does not read must not wedge the main thread (a
      // stop must still be seen): the send does not wait.
      bool full = false;
      const Item& item = queue_.front();
      if (std::string why = host_channel::send(channel, item.text, item.fd.get(), &full);
          !why.empty())
        return why;
      if (full) return "";
      queue_.pop_front();  // the fd passed is the supervisor's now; this copy closes
    }
    return "";
  }
  bool pending() const {
    std::lock_guard lock(mutex_);
    return !queue_.empty();
  }

 private:
  struct Item {
    std::string text;
    UniqueFd fd;
  };
  UniqueFd wake_;
  mutable std::mutex mutex_;
  std::deque<Item> queue_;
};

// One message from the supervisor. A bad one is said and dropped.
void serve(host_channel::Datagram datagram, VirtioVsock& vsock, Outbox& outbox) {
  std::string why = datagram.problem;
  std::optional<host_channel::Message> message;
  if (why.empty()) message = host_channel::parse(datagram, &why);
  const auto* connect = message ? std::get_if<host_channel::Connect>(&*message) : nullptr;
  if (connect == nullptr) {
    log::warn("the VMM's channel: dropped " + (why.empty() ? "a message for the supervisor" : why));
    return;
  }
  const uint64_t id = connect->id;
  const std::string refused = vsock.connect_later(
      connect->guest_port, [id, &outbox](UniqueFd fd, const std::string& error) {
        if (fd)
          outbox.push(host_channel::encode(host_channel::Connected{id}), std::move(fd));
        else
          outbox.push(host_channel::encode(host_channel::Refused{id, error}));
      });
  if (!refused.empty()) outbox.push(host_channel::encode(host_channel::Refused{id, refused}));
}

// Stops the VM before the devices it uses are destroyed, on every way out.
struct StopFirst {
  Vm* vm;
  ~StopFirst() { vm->stop(); }
};

}  // namespace

VmEnd run_confined(const RunSpec& spec) {
  if (spec.kernel.empty() == spec.flat.empty())
    throw Error("give a kernel or a flat guest, not both or neither");
  if (spec.memory_mib < 2 || spec.memory_mib % 2 != 0)
    throw Error("guest memory of " + std::to_string(spec.memory_mib) +
                " MiB: it must be even, at least 2");
  if (!spec.host_ports.empty() && spec.channel_fd < 0)
    throw Error("a host port without a channel to the supervisor");
  if (spec.disks.size() + (spec.channel_fd >= 0 ? 1 : 0) > layout::kMaxMmioDevices)
    throw Error(std::to_string(spec.disks.size()) + " disks: more than the " +
                std::to_string(layout::kMaxMmioDevices) + " device windows hold");
  if (std::set<uint32_t>(spec.host_ports.begin(), spec.host_ports.end()).size() !=
      spec.host_ports.size())
    throw Error("a host port given twice");
  if (spec.channel_fd >= 0) check_channel(spec.channel_fd);
  // Everything that needs a path comes first.
  std::vector<UniqueFd> disk_fds;
  for (const RunSpec::Disk& disk : spec.disks) disk_fds.push_back(open_disk(disk));
  const std::vector<uint8_t> image = read_whole(spec.kernel.empty() ? spec.flat : spec.kernel,
                                                spec.kernel.empty() ? "guest" : "kernel");
  std::vector<uint8_t> initramfs;
  for (const std::string& part : spec.initramfs) {
    const std::vector<uint8_t> bytes = read_whole(part, "initramfs");
    initramfs.insert(initramfs.end(), bytes.begin(), bytes.end());
    initramfs.resize((initramfs.size() + 3) & ~size_t{3}, 0);
  }
  // A kernel that cannot be loaded is bad input: said before /dev/kvm is asked.
  if (!spec.kernel.empty()) {
    switch (boot::detect(image)) {
      case boot::KernelFormat::kBzImage:
        boot::parse_bzimage(image);
        break;
      case boot::KernelFormat::kElf:
        boot::parse_pvh_elf(image);
        break;
      case boot::KernelFormat::kUnknown:
        throw Error("the kernel is neither a bzImage nor an ELF vmlinux");
    }
  }
  const Kvm kvm = Kvm::open();

  GuestMemory memory = GuestMemory::create(spec.memory_mib << 20);
  CpuEntry entry;
  if (!spec.kernel.empty()) {
    // The devices' windows in the order they are added below: the disks, then vsock.
    std::string cmdline = spec.cmdline;
    const size_t devices = spec.disks.size() + (spec.channel_fd >= 0 ? 1 : 0);
    for (uint32_t i = 0; i < devices; ++i) {
      cmdline += ' ';
      cmdline += virtio_mmio_cmdline(i);
    }
    entry = boot::load_linux(memory, image, cmdline, initramfs);
  } else {
    const bool real = spec.flat_mode == CpuEntry::Mode::kReal;
    const uint64_t load = real ? kFlatRealModeLoad : layout::kKernelStart;
    if (!memory.write(load, image.data(), image.size()))
      throw Error("guest " + spec.flat + ": " + std::to_string(image.size()) +
                  " bytes do not fit at " + std::to_string(load));
    entry.mode = spec.flat_mode;
    entry.rip = real ? 0 : layout::kKernelStart;
    entry.real_cs = real ? static_cast<uint16_t>(kFlatRealModeLoad >> 4) : 0;
    entry.rsp = real ? 0xfff0 : layout::kBootStack;
  }

  const int serial_fd = spec.serial_fd;
  VmOptions options;
  options.vcpus = spec.vcpus;
  options.serial_sink = [serial_fd](const char* data, size_t length) {
    while (length > 0) {
      const ssize_t n = ::write(serial_fd, data, length);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;  // the log is gone: the guest's output with it
      data += n;
      length -= static_cast<size_t>(n);
    }
  };
  options.on_vcpu_thread = confine::vcpu_thread_hook();
  std::unique_ptr<Vm> vm = Vm::create(kvm, std::move(memory), std::move(options));
  vm->set_entry(0, entry);

  // The outbox before the devices, so that it outlives their threads.
  std::unique_ptr<Outbox> outbox;
  std::vector<std::unique_ptr<VirtioMmio>> devices;
  for (size_t i = 0; i < disk_fds.size(); ++i)
    devices.push_back(std::make_unique<VirtioBlk>(vm->memory(), std::move(disk_fds[i]),
                                                  spec.disks[i].read_only, disk_name(i)));
  VirtioVsock* vsock = nullptr;
  if (spec.channel_fd >= 0) {
    outbox = std::make_unique<Outbox>();
    auto device = std::make_unique<VirtioVsock>(vm->memory());
    for (uint32_t port : spec.host_ports) {
      device->listen(port, [port, box = outbox.get()](UniqueFd fd, uint32_t guest_port) {
        box->push(host_channel::encode(host_channel::Accepted{port, guest_port}), std::move(fd));
      });
    }
    vsock = device.get();
    devices.push_back(std::move(device));
  }
  for (auto& device : devices) vm->add_device(*device);
  StopFirst stop_first{vm.get()};

  confine::confine_process();
  for (auto& device : devices)
    device->start([] { return confine::install_filter(confine::Thread::kDevice); });
  vm->start();
  if (const std::string why = confine::install_filter(confine::Thread::kMain); !why.empty()) {
    vm->stop();
    return {EndReason::kError, "the main thread's filter: " + why};
  }
  // The main thread waits for the end and serves the channel: it only
  // polls, reads, sends and receives on descriptors it holds (the device
  // thread makes the sockets a connect needs).
  for (;;) {
    if (vsock == nullptr) {
      VmEnd end = vm->wait(20);
      if (end.reason != EndReason::kRunning) return end;
    } else {
      const bool pending = outbox->pending();
      pollfd fds[2] = {{spec.channel_fd, static_cast<short>(POLLIN | (pending ? POLLOUT : 0)), 0},
                       {outbox->wake_fd(), POLLIN, 0}};
      if (::poll(fds, 2, 20) < 0 && errno != EINTR) {
        log::warn(errno_message("the VMM's channel: poll", errno));
        vm->stop();
        return vm->end();
      }
      if ((fds[1].revents & POLLIN) || (fds[0].revents & POLLOUT)) {
        if (const std::string why = outbox->flush(spec.channel_fd); !why.empty()) {
          // The supervisor is gone: no VMM is left running without it.
          vm->stop();
          return vm->end();
        }
      }
      if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
        host_channel::Datagram datagram = host_channel::receive(spec.channel_fd);
        if (datagram.closed) {
          if (!datagram.problem.empty()) log::warn("the VMM's channel: " + datagram.problem);
          vm->stop();
          return vm->end();
        }
        if (!datagram.text.empty() || datagram.fd || !datagram.problem.empty())
          serve(std::move(datagram), *vsock, *outbox);
      }
      VmEnd end = vm->wait(0);
      if (end.reason != EndReason::kRunning) return end;
    }
    if (spec.stop && spec.stop->load()) {
      vm->stop();
      return vm->end();
    }
  }
}

}  // namespace openshell::vm
