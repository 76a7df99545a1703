#include "vm/runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <vector>

#include "base/error.h"
#include "vm/boot.h"
#include "vm/confine.h"
#include "vm/guest_memory.h"
#include "vm/kvm.h"
#include "vm/layout.h"

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

}  // namespace

VmEnd run_confined(const RunSpec& spec) {
  if (spec.kernel.empty() == spec.flat.empty())
    throw Error("give a kernel or a flat guest, not both or neither");
  if (spec.memory_mib < 2 || spec.memory_mib % 2 != 0)
    throw Error("guest memory of " + std::to_string(spec.memory_mib) +
                " MiB: it must be even, at least 2");
  // Everything that needs a path comes first.
  const std::vector<uint8_t> image = read_whole(spec.kernel.empty() ? spec.flat : spec.kernel,
                                                spec.kernel.empty() ? "guest" : "kernel");
  const std::vector<uint8_t> initramfs =
      spec.initramfs.empty() ? std::vector<uint8_t>{} : read_whole(spec.initramfs, "initramfs");
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
    entry = boot::load_linux(memory, image, spec.cmdline, initramfs);
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

  confine::confine_process();
  vm->start();
  if (const std::string why = confine::install_filter(confine::Thread::kMain); !why.empty()) {
    vm->stop();
    return {EndReason::kError, "the main thread's filter: " + why};
  }
  for (;;) {
    VmEnd end = vm->wait(20);
    if (end.reason != EndReason::kRunning) return end;
    if (spec.stop && spec.stop->load()) {
      vm->stop();
      return vm->end();
    }
  }
}

}  // namespace openshell::vm
