// vm_bench: the VMM's start-up and its memory beyond the guest's.
//
//   vm_bench --guest FIRST_OUT.bin --spin SPIN.bin [--runs N] [--warmup N] [--memory MiB] [--json]
//
// Each run creates guest memory, then times from just before Vm::create
// (whose first call is KVM_CREATE_VM) to the guest's first exit (its first
// instruction writes port 0x80) and to its first serial byte (its third),
// as the vCPU thread sees them (CLOCK_MONOTONIC); the guest then asks for a
// reset and the VM is torn down. Reports min, median and p90 of each.
//
// Memory: one VM of --memory MiB runs the spin guest (a serial byte, then a
// loop); while it runs, VmRSS of this process minus the resident part of
// the guest-memory mapping (/proc/self/smaps, the memfd
// "openshell-guest-ram") is what the VMM costs beyond the guest.
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "vm/guest_memory.h"
#include "vm/kvm.h"
#include "vm/layout.h"
#include "vm/vm.h"

namespace vm = openshell::vm;

namespace {

uint64_t now_ns() {
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000ull + static_cast<uint64_t>(now.tv_nsec);
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw openshell::Error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::unique_ptr<vm::Vm> boot(const vm::Kvm& kvm, const std::vector<uint8_t>& guest,
                             uint64_t memory_bytes, uint64_t* create_ns,
                             uint64_t* created_ns = nullptr) {
  vm::GuestMemory memory = vm::GuestMemory::create(memory_bytes);
  if (!memory.write(vm::layout::kKernelStart, guest.data(), guest.size()))
    throw openshell::Error("the guest does not fit");
  *create_ns = now_ns();
  auto machine = vm::Vm::create(kvm, std::move(memory), {});
  if (created_ns) *created_ns = now_ns();
  machine->set_entry(
      0, {vm::CpuEntry::Mode::kLong, vm::layout::kKernelStart, vm::layout::kBootStack, 0, 0, 0});
  machine->start();
  return machine;
}

struct Stats {
  double min, median, p90;
};
Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 9 / 10)]};
}

// kB of a "Name:   123 kB" line.
long status_kb(const std::string& name) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(name + ":", 0) == 0)
      return std::strtol(line.c_str() + name.size() + 1, nullptr, 10);
  return -1;
}

long guest_mapping_rss_kb() {
  std::ifstream in("/proc/self/smaps");
  bool in_guest = false;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty() && std::isxdigit(static_cast<unsigned char>(line[0])) &&
        line.find('-') != std::string::npos && line.find(' ') != std::string::npos &&
        line.find(':') == std::string::npos) {
      in_guest = false;
    }
    if (line.find("openshell-guest-ram") != std::string::npos) in_guest = true;
    if (in_guest && line.rfind("Rss:", 0) == 0) return std::strtol(line.c_str() + 4, nullptr, 10);
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string guest_path, spin_path;
  int runs = 200, warmup = 20;
  uint64_t memory_mib = 64;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "vm_bench: %s needs a value\n", arg.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (arg == "--guest")
      guest_path = value();
    else if (arg == "--spin")
      spin_path = value();
    else if (arg == "--runs")
      runs = std::atoi(value().c_str());
    else if (arg == "--warmup")
      warmup = std::atoi(value().c_str());
    else if (arg == "--memory")
      memory_mib = std::strtoull(value().c_str(), nullptr, 10);
    else if (arg == "--json")
      json = true;
    else {
      std::fprintf(stderr, "vm_bench: unexpected argument '%s'\n", arg.c_str());
      return 2;
    }
  }
  if (guest_path.empty() || spin_path.empty() || runs < 1 || memory_mib < 2 || memory_mib % 2) {
    std::fprintf(stderr,
                 "usage: vm_bench --guest FIRST_OUT.bin --spin SPIN.bin [--runs N] [--warmup N] "
                 "[--memory MiB (even)] [--json]\n");
    return 2;
  }
  try {
    const vm::Kvm kvm = vm::Kvm::open();
    const std::vector<uint8_t> guest = read_file(guest_path);
    const std::vector<uint8_t> spin = read_file(spin_path);
    std::vector<double> to_exit, to_serial, in_create;
    for (int i = 0; i < warmup + runs; ++i) {
      uint64_t created = 0, returned = 0;
      auto machine = boot(kvm, guest, memory_mib << 20, &created, &returned);
      const vm::VmEnd end = machine->wait(5000);
      if (end.reason != vm::EndReason::kGuestReset)
        throw openshell::Error(std::string("the guest ended: ") + vm::end_reason_name(end.reason) +
                               ": " + end.detail);
      if (i < warmup) continue;
      to_exit.push_back((machine->first_exit_ns() - created) / 1e6);
      in_create.push_back((returned - created) / 1e6);
      to_serial.push_back((machine->first_serial_ns() - created) / 1e6);
    }

    const long before_kb = status_kb("VmRSS");
    uint64_t created = 0;
    auto machine = boot(kvm, spin, memory_mib << 20, &created);
    while (machine->first_serial_ns() == 0)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const long rss_kb = status_kb("VmRSS");
    const long guest_kb = guest_mapping_rss_kb();
    machine->stop();

    const Stats e = stats(to_exit), s = stats(to_serial), c = stats(in_create);
    const long overhead_kb = rss_kb - std::max(guest_kb, 0L);
    if (json) {
      std::printf(
          "{\"runs\": %d, \"memory_mib\": %llu, \"create_to_first_exit_ms\": {\"min\": %.3f, "
          "\"median\": %.3f, "
          "\"p90\": %.3f}, \"create_to_first_serial_ms\": {\"min\": %.3f, \"median\": %.3f, "
          "\"p90\": %.3f}, "
          "\"in_vm_create_ms\": {\"min\": %.3f, \"median\": %.3f, \"p90\": %.3f}, \"vmm_rss_kb\": "
          "%ld, \"guest_rss_kb\": %ld, \"rss_beyond_guest_kb\": %ld, "
          "\"rss_before_vm_kb\": %ld}\n",
          runs, static_cast<unsigned long long>(memory_mib), e.min, e.median, e.p90, s.min,
          s.median, s.p90, c.min, c.median, c.p90, rss_kb, guest_kb, overhead_kb, before_kb);
    } else {
      std::printf("runs: %d (after %d warm-up), guest memory %llu MiB\n", runs, warmup,
                  static_cast<unsigned long long>(memory_mib));
      std::printf(
          "KVM_CREATE_VM -> first guest instruction (first exit): min %.3f  median %.3f  p90 %.3f "
          "ms\n",
          e.min, e.median, e.p90);
      std::printf(
          "KVM_CREATE_VM -> first serial byte:                   min %.3f  median %.3f  p90 %.3f "
          "ms\n",
          s.min, s.median, s.p90);
      std::printf(
          "  of which in Vm::create (irqchip, PIT, slots, vCPU): min %.3f  median %.3f  p90 %.3f "
          "ms\n",
          c.min, c.median, c.p90);
      std::printf(
          "VMM RSS with one VM running: %ld kB, of which guest memory %ld kB: %ld kB beyond the "
          "guest "
          "(%ld kB before the VM)\n",
          rss_kb, guest_kb, overhead_kb, before_kb);
    }
  } catch (const openshell::Error& e) {
    std::fprintf(stderr, "vm_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
