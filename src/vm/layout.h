// The guest's physical address map: every constant the VMM, the boot code
// and the devices agree on, in one place. Addresses are guest-physical.
//
//   0x0000_0000  RAM: real-mode area, zero page, page tables, command line
//   0x0010_0000  the kernel (1 MiB, the boot protocol's default)
//   ...          the initramfs, placed high in RAM below the MMIO hole
//   0xd000_0000  the MMIO hole: virtio-mmio devices, one 4 KiB window each
//   0xfec0_0000  IOAPIC, 0xfee0_0000 LAPIC (KVM's in-kernel irqchip)
//   4 GiB ...    RAM above the hole, when the guest has more than fits below
#pragma once

#include <cstdint>

namespace openshell::vm::layout {

inline constexpr uint64_t kPageSize = 4096;

// Low memory, as the x86 boot protocol and the tests' guests use it.
inline constexpr uint64_t kBootGdt = 0x0500;             // the GDT for long mode
inline constexpr uint64_t kBootIdt = 0x0520;             // an empty IDT
inline constexpr uint64_t kZeroPage = 0x7000;            // struct boot_params
inline constexpr uint64_t kPml4 = 0x9000;                // page tables: PML4,
inline constexpr uint64_t kPdpt = 0xa000;                //   PDPT,
inline constexpr uint64_t kPd = 0xb000;                  //   and 4 PDs of 2 MiB pages
inline constexpr uint64_t kIdentityMapped = 4ull << 30;  // what those tables map
inline constexpr uint64_t kBootStack = 0x8ff0;           // rsp at entry
inline constexpr uint64_t kPvhStartInfo = 0x6000;        // struct hvm_start_info (PVH)
inline constexpr uint64_t kCmdline = 0x20000;            // the kernel command line
inline constexpr uint64_t kCmdlineMax = 0x10000;         // its size, NUL included
inline constexpr uint64_t kKernelStart =
    0x100000;  // bzImage's protected-mode part, vmlinux's load address
inline constexpr uint64_t kEbdaStart = 0x9fc00;  // e820: RAM below this, reserved to 1 MiB

// The MMIO hole below 4 GiB.
inline constexpr uint64_t kMmioStart = 0xd0000000;
inline constexpr uint64_t kMmioEnd = 0x100000000;  // exclusive
inline constexpr uint64_t kMmioWindow = 0x1000;    // one virtio-mmio device
inline constexpr uint32_t kMaxMmioDevices = 32;
inline constexpr uint64_t kIoapicStart = 0xfec00000;
inline constexpr uint64_t kLapicStart = 0xfee00000;
// What KVM needs for the real-mode TSS and the identity map of unrestricted
// guests without EPT: three pages and one, at the top of the hole.
inline constexpr uint64_t kTssAddress = 0xfffbd000;
inline constexpr uint64_t kIdentityMapAddress = 0xfffbc000;

// Boot GDT selectors (Linux's __BOOT_CS and __BOOT_DS, and a 32-bit code
// segment for the PVH entry).
inline constexpr uint16_t kBootCode32 = 0x08;
inline constexpr uint16_t kBootCode64 = 0x10;
inline constexpr uint16_t kBootData = 0x18;

// Legacy interrupt lines (GSIs) of the in-kernel IOAPIC: the serial port's,
// then one a virtio device, in order.
inline constexpr uint32_t kSerialIrq = 4;
inline constexpr uint32_t kFirstDeviceIrq = 5;
inline constexpr uint16_t kSerialPort = 0x3f8;  // COM1

// The vsock port the guest init serves (runtime/guest_init.h; the guest's
// configuration names it), on the guest's CID (virtio_vsock::kGuestCid).
inline constexpr uint32_t kGuestInitPort = 1024;
// The host's ports (CID 2) a --vm sandbox's guest connects to, each given to
// `__vmm --host-port` and named in the guest's configuration: the init's
// status stream, the egress proxy (each connection led by the caller's
// identity line), and the DNS stub (DNS-over-TCP framing).
inline constexpr uint32_t kHostStatusPort = 1025;
inline constexpr uint32_t kHostEgressPort = 3128;
inline constexpr uint32_t kHostDnsPort = 53;

inline constexpr uint64_t mmio_window(uint32_t index) { return kMmioStart + index * kMmioWindow; }
inline constexpr uint32_t device_irq(uint32_t index) { return kFirstDeviceIrq + index; }

}  // namespace openshell::vm::layout
