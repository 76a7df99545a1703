#include "vm/kvm.h"

#include <fcntl.h>
#include <sys/ioctl.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "base/error.h"

namespace openshell::vm {

namespace {

constexpr int kApiVersion = 12;
constexpr uint32_t kMaxCpuidEntries = 256;

// CPUID leaf 1 bits.
constexpr uint32_t kEcxMonitor = 1u << 3;
constexpr uint32_t kEcxPdcm = 1u << 15;  // perfmon and debug capability MSR
constexpr uint32_t kEcxHypervisor = 1u << 31;
constexpr uint32_t kEbxApicIdShift = 24;

}  // namespace

const std::vector<Kvm::Capability>& Kvm::required_capabilities() {
  static const std::vector<Capability> caps = {
      {KVM_CAP_USER_MEMORY, "KVM_CAP_USER_MEMORY", "guest memory from the VMM's own mapping"},
      {KVM_CAP_IRQCHIP, "KVM_CAP_IRQCHIP", "the in-kernel interrupt controllers"},
      {KVM_CAP_PIT2, "KVM_CAP_PIT2", "the in-kernel timer"},
      {KVM_CAP_IOEVENTFD, "KVM_CAP_IOEVENTFD", "devices' doorbells as eventfds"},
      {KVM_CAP_IRQFD, "KVM_CAP_IRQFD", "interrupts from devices' eventfds"},
      {KVM_CAP_EXT_CPUID, "KVM_CAP_EXT_CPUID", "the CPUID the guest sees"},
      {KVM_CAP_MP_STATE, "KVM_CAP_MP_STATE", "starting more than one vCPU"},
      {KVM_CAP_IMMEDIATE_EXIT, "KVM_CAP_IMMEDIATE_EXIT", "stopping a running vCPU without a race"},
  };
  return caps;
}

Kvm Kvm::open(const std::string& path) {
  Kvm kvm;
  kvm.fd_ = UniqueFd(::open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!kvm.fd_) throw_errno(path);
  const int api = ::ioctl(kvm.fd(), KVM_GET_API_VERSION, 0);
  if (api != kApiVersion)
    throw Error(path + ": KVM API version " + std::to_string(api) + ", this VMM needs " +
                std::to_string(kApiVersion));
  for (const Capability& cap : required_capabilities())
    if (::ioctl(kvm.fd(), KVM_CHECK_EXTENSION, cap.number) <= 0)
      throw Error(path + " lacks " + cap.name + " (" + cap.why + ")");
  const int mmap_size = ::ioctl(kvm.fd(), KVM_GET_VCPU_MMAP_SIZE, 0);
  if (mmap_size < static_cast<int>(sizeof(kvm_run))) throw_errno(path + ": KVM_GET_VCPU_MMAP_SIZE");
  kvm.vcpu_mmap_size_ = static_cast<size_t>(mmap_size);
  const int nr = ::ioctl(kvm.fd(), KVM_CHECK_EXTENSION, KVM_CAP_NR_VCPUS);
  kvm.max_vcpus_ = nr > 0 ? static_cast<uint32_t>(nr) : 1;

  std::vector<uint8_t> buffer(sizeof(KvmListHeader) + kMaxCpuidEntries * sizeof(kvm_cpuid_entry2));
  const KvmListHeader header{kMaxCpuidEntries, 0};
  std::memcpy(buffer.data(), &header, sizeof header);
  if (::ioctl(kvm.fd(), kKvmGetSupportedCpuid, buffer.data()) != 0)
    throw_errno(path + ": KVM_GET_SUPPORTED_CPUID");
  KvmListHeader got{};
  std::memcpy(&got, buffer.data(), sizeof got);
  kvm.cpuid_.resize(std::min(got.count, kMaxCpuidEntries));
  std::memcpy(kvm.cpuid_.data(), buffer.data() + sizeof got,
              kvm.cpuid_.size() * sizeof(kvm_cpuid_entry2));
  return kvm;
}

std::vector<kvm_cpuid_entry2> filter_cpuid(const std::vector<kvm_cpuid_entry2>& supported,
                                           uint32_t apic_id, uint32_t vcpu_count) {
  std::vector<kvm_cpuid_entry2> out;
  out.reserve(supported.size());
  for (kvm_cpuid_entry2 entry : supported) {
    switch (entry.function) {
      case 1:
        entry.ecx |= kEcxHypervisor;
        // No MONITOR/MWAIT (KVM does not back them for a guest's idle
        // loop), no perfmon capability MSR.
        entry.ecx &= ~(kEcxMonitor | kEcxPdcm);
        entry.ebx =
            (entry.ebx & 0x0000ffffu) | (apic_id << kEbxApicIdShift) | ((vcpu_count & 0xffu) << 16);
        break;
      case 5:  // MONITOR/MWAIT leaf: nothing to describe.
        entry.eax = entry.ebx = entry.ecx = entry.edx = 0;
        break;
      case 0xa:  // architectural performance monitoring: none.
        entry.eax = entry.ebx = entry.ecx = entry.edx = 0;
        break;
      case 0xb:  // x2APIC topology: this vCPU's id.
      case 0x1f:
        entry.edx = apic_id;
        break;
      default:
        break;
    }
    out.push_back(entry);
  }
  return out;
}

}  // namespace openshell::vm
