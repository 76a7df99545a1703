// Booting the tests' small guests (tests/vm/guests/*.S, built into flat
// binaries): one call loads a guest, adds the given devices, runs it and
// returns what it wrote to the serial port and how the VM ended.
#pragma once

#include <chrono>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "base/error.h"
#include "vm/device.h"
#include "vm/guest_memory.h"
#include "vm/kvm.h"
#include "vm/layout.h"
#include "vm/vm.h"

#ifndef OSH_VM_GUESTS
#error "OSH_VM_GUESTS must name the folder of the built guests"
#endif

namespace openshell::vm::testing {

// Real-mode guests go to 0x10000 and start at CS = 0x1000, IP = 0;
// long-mode ones to layout::kKernelStart, entered by the boot code.
enum class GuestStart { kReal, kLong };
inline constexpr uint64_t kRealModeLoad = 0x10000;

struct GuestOptions {
  uint32_t vcpus = 1;
  uint64_t memory = 16ull << 20;
  std::vector<MmioDevice*> devices;
  int timeout_ms = 5000;
  // When set: once the serial output holds this, the test stops the VM.
  std::string stop_after;
  // Changes guest memory after the load (e.g. a patched operand).
  std::function<void(GuestMemory&)> patch;
};

struct GuestResult {
  std::string serial;
  VmEnd end;
  double stop_ms = 0;  // how long stop() took, when the test stopped it
};

inline std::vector<uint8_t> read_guest(const std::string& name) {
  const std::string path = std::string(OSH_VM_GUESTS) + "/" + name + ".bin";
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read guest " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// /dev/kvm, or nullopt with the reason in *why (root-only here).
inline std::optional<Kvm> open_kvm(std::string* why) {
  try {
    return Kvm::open();
  } catch (const Error& e) {
    *why = e.what();
    return std::nullopt;
  }
}

#define OSH_REQUIRE_KVM(kvm)                                                                \
  std::string kvm##_why;                                                                    \
  std::optional<::openshell::vm::Kvm> kvm = ::openshell::vm::testing::open_kvm(&kvm##_why); \
  if (!kvm) GTEST_SKIP() << "no usable KVM: " << kvm##_why

// Runs a guest already in `memory` from `entry` (every vCPU), with the
// options' devices, until it ends or the options stop it.
inline GuestResult run_prepared(const Kvm& kvm, GuestMemory memory, const CpuEntry& entry,
                                const GuestOptions& options, const std::string& name) {
  if (options.patch) options.patch(memory);
  auto output = std::make_shared<std::pair<std::mutex, std::string>>();
  VmOptions vm_options;
  vm_options.vcpus = options.vcpus;
  vm_options.serial_sink = [output](const char* data, size_t length) {
    std::lock_guard lock(output->first);
    output->second.append(data, length);
  };
  std::unique_ptr<Vm> vm = Vm::create(kvm, std::move(memory), vm_options);
  for (MmioDevice* device : options.devices) vm->add_device(*device);
  for (uint32_t i = 0; i < options.vcpus; ++i) vm->set_entry(i, entry);
  vm->start();

  GuestResult result;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(options.timeout_ms);
  if (!options.stop_after.empty()) {
    while (std::chrono::steady_clock::now() < deadline && vm->end().reason == EndReason::kRunning) {
      {
        std::lock_guard lock(output->first);
        if (output->second.find(options.stop_after) != std::string::npos) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    const auto before = std::chrono::steady_clock::now();
    vm->stop();
    result.stop_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - before)
            .count();
  }
  result.end = vm->wait(options.timeout_ms);
  if (result.end.reason == EndReason::kRunning) {
    ADD_FAILURE() << "guest " << name << " still running after " << options.timeout_ms << " ms";
    vm->stop();
    result.end = vm->end();
  }
  std::lock_guard lock(output->first);
  result.serial = output->second;
  return result;
}

inline GuestResult run_flat_guest(const Kvm& kvm, const std::string& name, GuestStart start,
                                  const GuestOptions& options = {}) {
  const std::vector<uint8_t> binary = read_guest(name);
  GuestMemory memory = GuestMemory::create(options.memory);
  const uint64_t load = start == GuestStart::kReal ? kRealModeLoad : layout::kKernelStart;
  if (!memory.write(load, binary.data(), binary.size()))
    throw Error("guest " + name + " does not fit");
  CpuEntry entry;
  if (start == GuestStart::kReal) {
    entry.mode = CpuEntry::Mode::kReal;
    entry.real_cs = static_cast<uint16_t>(kRealModeLoad >> 4);
    entry.rsp = 0xfff0;
  } else {
    entry.mode = CpuEntry::Mode::kLong;
    entry.rip = layout::kKernelStart;
    entry.rsp = layout::kBootStack;
  }
  return run_prepared(kvm, std::move(memory), entry, options, name);
}

}  // namespace openshell::vm::testing
