// Loading Linux into guest memory, entering it in long mode (bzImage) or in
// 32-bit protected mode (PVH), and the tables both need.
//
// bzImage: the x86 boot protocol 2.12 or later with a 64-bit entry
// (XLF_KERNEL_64). Its protected-mode part goes to layout::kKernelStart
// (or its preferred address when it is not relocatable), boot_params to
// layout::kZeroPage with the e820 map, the command line to
// layout::kCmdline, the initramfs as high as the header allows; the vCPU
// starts in long mode at load + 0x200 with RSI = boot_params.
//
// vmlinux: an ELF64 x86-64 executable with a XEN_ELFNOTE_PHYS32_ENTRY note
// (CONFIG_PVH). Its PT_LOAD segments go to their physical addresses, an
// hvm_start_info (memory map, command line, the initramfs as module 0) to
// layout::kPvhStartInfo; the vCPU starts as the PVH ABI says: 32-bit
// protected mode, paging off, EBX = the start info.
//
// Every field read from the file is checked against the file's size and
// the guest's RAM before use; a bad file is an Error naming the field.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "vm/guest_memory.h"
#include "vm/vm.h"

namespace openshell::vm::boot {

// The boot GDT: null, 32-bit code, 64-bit code, data (layout.h's selectors).
inline constexpr uint32_t kGdtEntries = 4;
void write_gdt(GuestMemory& memory);
// PML4 -> PDPT -> 4 PDs of 2 MiB pages: the first 4 GiB, identity-mapped.
void write_identity_page_tables(GuestMemory& memory);

struct E820Entry {
  uint64_t address;
  uint64_t size;
  uint32_t type;  // 1 RAM, 2 reserved
};
// RAM below the EBDA, the reserved legacy area to 1 MiB, RAM to the end of
// the low slot, and RAM above 4 GiB when the guest has it.
std::vector<E820Entry> memory_map(const GuestMemory& memory);

enum class KernelFormat { kBzImage, kElf, kUnknown };
KernelFormat detect(std::span<const uint8_t> file);

struct BzImage {
  uint16_t version = 0;       // 0x020f for 2.15
  uint32_t setup_bytes = 0;   // (setup_sects + 1) * 512
  uint64_t load_address = 0;  // where the protected-mode part goes
  uint64_t init_size = 0;     // what it needs from there while it runs
  uint32_t initrd_max = 0;    // the highest address the initramfs may end at
  uint32_t cmdline_max = 0;   // bytes, without the NUL
  bool relocatable = false;
};
// Throws Error("bzImage: ...").
BzImage parse_bzimage(std::span<const uint8_t> file);

struct ElfSegment {
  uint64_t file_offset = 0;
  uint64_t file_size = 0;
  uint64_t address = 0;  // physical
  uint64_t memory_size = 0;
};
struct PvhKernel {
  uint32_t entry = 0;  // XEN_ELFNOTE_PHYS32_ENTRY
  std::vector<ElfSegment> segments;
  uint64_t end = 0;  // the highest segment's end
};
// Throws Error("vmlinux: ...").
PvhKernel parse_pvh_elf(std::span<const uint8_t> file);

// Loads a bzImage or a PVH vmlinux with its command line and initramfs
// (may be empty) and returns vCPU 0's entry. Throws Error.
CpuEntry load_linux(GuestMemory& memory, std::span<const uint8_t> kernel,
                    const std::string& cmdline, std::span<const uint8_t> initramfs);

}  // namespace openshell::vm::boot
