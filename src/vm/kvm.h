// /dev/kvm itself: the API version and the capabilities the VMM needs,
// checked once with one line naming what is missing, and what the host
// offers every guest (CPUID, the size of a vCPU's shared kvm_run page).
#pragma once

#include <linux/kvm.h>

#include <cstdint>
#include <string>
#include <vector>

#include "base/unique_fd.h"

namespace openshell::vm {

// linux/kvm.h declares kvm_cpuid2 and kvm_msrs with __DECLARE_FLEX_ARRAY,
// which in C++ puts a one-byte empty struct before the array: their
// entries sit 4 bytes late and the ioctl numbers made from them name the
// wrong size (the kernel answers EINVAL). These are the C layouts: an
// 8-byte header (the count and padding), then the entries.
struct KvmListHeader {
  uint32_t count;
  uint32_t padding;
};
static_assert(sizeof(KvmListHeader) == 8);
inline constexpr unsigned long kKvmGetSupportedCpuid = _IOWR(KVMIO, 0x05, KvmListHeader);
inline constexpr unsigned long kKvmSetCpuid2 = _IOW(KVMIO, 0x90, KvmListHeader);
inline constexpr unsigned long kKvmSetMsrs = _IOW(KVMIO, 0x89, KvmListHeader);

class Kvm {
 public:
  // Opens /dev/kvm (or `path`) and checks API 12 and every capability in
  // required_capabilities(). Throws Error: "/dev/kvm: Permission denied",
  // "/dev/kvm lacks KVM_CAP_IRQFD (interrupts from devices' eventfds)".
  static Kvm open(const std::string& path = "/dev/kvm");

  int fd() const { return fd_.get(); }
  // KVM_GET_VCPU_MMAP_SIZE.
  size_t vcpu_mmap_size() const { return vcpu_mmap_size_; }
  // KVM_CAP_NR_VCPUS: the vCPUs this host recommends for one VM.
  uint32_t max_vcpus() const { return max_vcpus_; }
  // KVM_GET_SUPPORTED_CPUID, filtered for a guest of this VMM (see
  // filter_cpuid), without the per-vCPU APIC id.
  const std::vector<kvm_cpuid_entry2>& cpuid() const { return cpuid_; }

  struct Capability {
    int number;
    const char* name;
    const char* why;
  };
  static const std::vector<Capability>& required_capabilities();

 private:
  UniqueFd fd_;
  size_t vcpu_mmap_size_ = 0;
  uint32_t max_vcpus_ = 1;
  std::vector<kvm_cpuid_entry2> cpuid_;
};

// What the guest is told about the CPU: the host's supported set, with the
// hypervisor bit set, KVM's paravirtual leaves named, and the features this
// VMM cannot back removed (the monitor/mwait pair, performance monitoring,
// the TSC deadline timer's absence is KVM's to report). `apic_id` goes into
// leaf 1 and the x2APIC leaves. Pure: unit-tested on crafted tables.
std::vector<kvm_cpuid_entry2> filter_cpuid(const std::vector<kvm_cpuid_entry2>& supported,
                                           uint32_t apic_id, uint32_t vcpu_count);

}  // namespace openshell::vm
