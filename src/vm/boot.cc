#include "vm/boot.h"

#include <asm/bootparam.h>
#include <elf.h>

#include <cstring>

#include "base/error.h"
#include "vm/layout.h"

namespace openshell::vm::boot {

namespace {

constexpr uint16_t kBootFlag = 0xaa55;
constexpr uint32_t kHeaderMagic = 0x53726448;  // "HdrS"
constexpr uint16_t kMinVersion = 0x020c;       // 2.12: xloadflags
constexpr uint64_t kSetupHeaderOffset = 0x1f1;
constexpr uint64_t k64BitEntryOffset = 0x200;
constexpr uint8_t kLoaderUndefined = 0xff;
constexpr uint32_t kE820Ram = 1;
constexpr uint32_t kE820Reserved = 2;

// The PVH ABI (Xen's public/arch-x86/hvm/start_info.h, version 1).
constexpr uint32_t kXenNotePhys32Entry = 18;
constexpr uint32_t kHvmStartMagic = 0x336ec578;
struct HvmStartInfo {
  uint32_t magic;
  uint32_t version;
  uint32_t flags;
  uint32_t nr_modules;
  uint64_t modlist_paddr;
  uint64_t cmdline_paddr;
  uint64_t rsdp_paddr;
  uint64_t memmap_paddr;
  uint32_t memmap_entries;
  uint32_t reserved;
};
struct HvmModlistEntry {
  uint64_t paddr;
  uint64_t size;
  uint64_t cmdline_paddr;
  uint64_t reserved;
};
struct HvmMemmapEntry {
  uint64_t addr;
  uint64_t size;
  uint32_t type;
  uint32_t reserved;
};
static_assert(sizeof(HvmStartInfo) == 56 && sizeof(HvmModlistEntry) == 32 &&
              sizeof(HvmMemmapEntry) == 24);
constexpr uint64_t kPvhModlist = layout::kPvhStartInfo + 0x40;
constexpr uint64_t kPvhMemmap = layout::kPvhStartInfo + 0x80;
constexpr uint64_t kPvhMemmapMax = (layout::kZeroPage - kPvhMemmap) / sizeof(HvmMemmapEntry);

template <typename T>
T read_at(std::span<const uint8_t> file, uint64_t offset) {
  T value{};
  std::memcpy(&value, file.data() + offset, sizeof value);
  return value;
}

bool fits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

void put(GuestMemory& memory, uint64_t address, const void* data, uint64_t length,
         const std::string& what) {
  if (!memory.write(address, data, length))
    throw Error(what + " (" + std::to_string(length) + " bytes at " + std::to_string(address) +
                ") does not fit in the guest's RAM");
}

uint64_t low_ram_end(const GuestMemory& memory) { return memory.slots()[0].size; }

// The command line, checked; where it goes.
void put_cmdline(GuestMemory& memory, const std::string& cmdline, uint64_t max_without_nul) {
  if (cmdline.find('\0') != std::string::npos)
    throw Error("the kernel command line holds a NUL byte");
  const uint64_t limit = std::min<uint64_t>(max_without_nul, layout::kCmdlineMax - 1);
  if (cmdline.size() > limit)
    throw Error("the kernel command line is " + std::to_string(cmdline.size()) +
                " bytes; this kernel takes " + std::to_string(limit));
  put(memory, layout::kCmdline, cmdline.c_str(), cmdline.size() + 1, "the kernel command line");
}

// The initramfs's address: as high as `ceiling` and the low slot allow,
// page-aligned, above `floor`. 0 for an empty one.
uint64_t place_initramfs(GuestMemory& memory, std::span<const uint8_t> initramfs, uint64_t floor,
                         uint64_t ceiling) {
  if (initramfs.empty()) return 0;
  const uint64_t top = std::min(ceiling, low_ram_end(memory));
  if (initramfs.size() > top || top - initramfs.size() < floor)
    throw Error("the initramfs (" + std::to_string(initramfs.size()) +
                " bytes) does not fit in the guest's RAM " + "between the kernel and " +
                std::to_string(top));
  const uint64_t address = (top - initramfs.size()) & ~(layout::kPageSize - 1);
  if (address < floor) throw Error("the initramfs does not fit above the kernel");
  put(memory, address, initramfs.data(), initramfs.size(), "the initramfs");
  return address;
}

CpuEntry load_bzimage(GuestMemory& memory, std::span<const uint8_t> file,
                      const std::string& cmdline, std::span<const uint8_t> initramfs) {
  const BzImage image = parse_bzimage(file);
  const std::span<const uint8_t> kernel = file.subspan(image.setup_bytes);
  if (!memory.span(image.load_address, std::max<uint64_t>(image.init_size, kernel.size())))
    throw Error("bzImage: the kernel needs " +
                std::to_string(std::max<uint64_t>(image.init_size, kernel.size())) +
                " bytes from " + std::to_string(image.load_address) +
                ", more than the guest's RAM");
  put(memory, image.load_address, kernel.data(), kernel.size(), "the kernel");

  boot_params params{};
  // The setup header as the file has it: from 0x1f1 to the end its jump
  // (at 0x201) says, bounded by boot_params.
  const uint64_t header_end = 0x202 + file[0x201];
  if (header_end > sizeof params || header_end > file.size())
    throw Error("bzImage: the setup header's length is out of range");
  std::memcpy(reinterpret_cast<uint8_t*>(&params) + kSetupHeaderOffset,
              file.data() + kSetupHeaderOffset, header_end - kSetupHeaderOffset);
  params.hdr.type_of_loader = kLoaderUndefined;
  params.hdr.loadflags |= CAN_USE_HEAP;
  params.hdr.heap_end_ptr = 0xfe00;
  params.hdr.code32_start = static_cast<uint32_t>(image.load_address);
  put_cmdline(memory, cmdline, image.cmdline_max);
  params.hdr.cmd_line_ptr = static_cast<uint32_t>(layout::kCmdline);
  params.ext_cmd_line_ptr = 0;
  const uint64_t kernel_end =
      image.load_address + std::max<uint64_t>(image.init_size, kernel.size());
  const uint64_t initrd =
      place_initramfs(memory, initramfs, kernel_end, uint64_t{image.initrd_max} + 1);
  params.hdr.ramdisk_image = static_cast<uint32_t>(initrd);
  params.hdr.ramdisk_size = static_cast<uint32_t>(initramfs.size());
  const std::vector<E820Entry> map = memory_map(memory);
  params.e820_entries = static_cast<uint8_t>(map.size());
  for (size_t i = 0; i < map.size(); ++i)
    params.e820_table[i] = {map[i].address, map[i].size, map[i].type};
  put(memory, layout::kZeroPage, &params, sizeof params, "boot_params");

  CpuEntry entry;
  entry.mode = CpuEntry::Mode::kLong;
  entry.rip = image.load_address + k64BitEntryOffset;
  entry.rsi = layout::kZeroPage;
  entry.rsp = layout::kBootStack;
  return entry;
}

CpuEntry load_pvh(GuestMemory& memory, std::span<const uint8_t> file, const std::string& cmdline,
                  std::span<const uint8_t> initramfs) {
  const PvhKernel kernel = parse_pvh_elf(file);
  for (const ElfSegment& segment : kernel.segments) {
    uint8_t* to = memory.span(segment.address, segment.memory_size);
    if (!to)
      throw Error("vmlinux: a segment of " + std::to_string(segment.memory_size) + " bytes at " +
                  std::to_string(segment.address) + " does not fit in the guest's RAM");
    std::memcpy(to, file.data() + segment.file_offset, segment.file_size);
    std::memset(to + segment.file_size, 0, segment.memory_size - segment.file_size);
  }
  put_cmdline(memory, cmdline, layout::kCmdlineMax - 1);

  HvmStartInfo info{};
  info.magic = kHvmStartMagic;
  info.version = 1;
  info.cmdline_paddr = layout::kCmdline;
  const uint64_t initrd = place_initramfs(memory, initramfs, kernel.end, layout::kMmioStart);
  if (!initramfs.empty()) {
    const HvmModlistEntry module{initrd, initramfs.size(), 0, 0};
    put(memory, kPvhModlist, &module, sizeof module, "the PVH module list");
    info.nr_modules = 1;
    info.modlist_paddr = kPvhModlist;
  }
  const std::vector<E820Entry> map = memory_map(memory);
  if (map.size() > kPvhMemmapMax) throw Error("the PVH memory map has too many entries");
  for (size_t i = 0; i < map.size(); ++i) {
    const HvmMemmapEntry e{map[i].address, map[i].size, map[i].type, 0};
    put(memory, kPvhMemmap + i * sizeof e, &e, sizeof e, "the PVH memory map");
  }
  info.memmap_paddr = kPvhMemmap;
  info.memmap_entries = static_cast<uint32_t>(map.size());
  put(memory, layout::kPvhStartInfo, &info, sizeof info, "hvm_start_info");

  CpuEntry entry;
  entry.mode = CpuEntry::Mode::kProtected;
  entry.rip = kernel.entry;
  entry.rbx = layout::kPvhStartInfo;
  return entry;
}

}  // namespace

void write_gdt(GuestMemory& memory) {
  const uint64_t gdt[kGdtEntries] = {
      0,
      0x00cf9b000000ffffull,  // 32-bit code, flat
      0x00af9b000000ffffull,  // 64-bit code
      0x00cf93000000ffffull,  // data, flat
  };
  put(memory, layout::kBootGdt, gdt, sizeof gdt, "the boot GDT");
  const uint64_t idt = 0;
  put(memory, layout::kBootIdt, &idt, sizeof idt, "the boot IDT");
}

void write_identity_page_tables(GuestMemory& memory) {
  constexpr uint64_t kPresentWritable = 0x3;
  constexpr uint64_t kLargePage = 0x80;
  constexpr uint64_t kPds = layout::kIdentityMapped >> 30;
  const uint64_t pml4 = layout::kPdpt | kPresentWritable;
  put(memory, layout::kPml4, &pml4, sizeof pml4, "the PML4");
  for (uint64_t i = 0; i < kPds; ++i) {
    const uint64_t pdpte = (layout::kPd + i * layout::kPageSize) | kPresentWritable;
    put(memory, layout::kPdpt + i * 8, &pdpte, 8, "the PDPT");
    uint64_t pd[512];
    for (uint64_t j = 0; j < 512; ++j)
      pd[j] = ((i * 512 + j) << 21) | kPresentWritable | kLargePage;
    put(memory, layout::kPd + i * layout::kPageSize, pd, sizeof pd, "a page directory");
  }
}

std::vector<E820Entry> memory_map(const GuestMemory& memory) {
  std::vector<E820Entry> map;
  map.push_back({0, layout::kEbdaStart, kE820Ram});
  map.push_back({layout::kEbdaStart, layout::kKernelStart - layout::kEbdaStart, kE820Reserved});
  map.push_back({layout::kKernelStart, low_ram_end(memory) - layout::kKernelStart, kE820Ram});
  for (const MemorySlot& slot : memory.slots())
    if (slot.guest_address >= layout::kMmioEnd)
      map.push_back({slot.guest_address, slot.size, kE820Ram});
  return map;
}

KernelFormat detect(std::span<const uint8_t> file) {
  if (file.size() >= SELFMAG && std::memcmp(file.data(), ELFMAG, SELFMAG) == 0)
    return KernelFormat::kElf;
  if (file.size() >= 0x206 && read_at<uint32_t>(file, 0x202) == kHeaderMagic)
    return KernelFormat::kBzImage;
  return KernelFormat::kUnknown;
}

BzImage parse_bzimage(std::span<const uint8_t> file) {
  constexpr uint64_t kHeaderNeeded = 0x268;  // through init_size (2.10+)
  if (file.size() < kHeaderNeeded)
    throw Error("bzImage: " + std::to_string(file.size()) +
                " bytes, too short for the setup header");
  if (read_at<uint16_t>(file, 0x1fe) != kBootFlag)
    throw Error("bzImage: no boot flag 0xaa55 at 0x1fe");
  if (read_at<uint32_t>(file, 0x202) != kHeaderMagic)
    throw Error("bzImage: no \"HdrS\" magic at 0x202");
  BzImage image;
  image.version = read_at<uint16_t>(file, 0x206);
  if (image.version < kMinVersion) {
    char text[64];
    std::snprintf(text, sizeof text,
                  "bzImage: boot protocol %u.%02u, this loader needs 2.12 or later",
                  image.version >> 8, image.version & 0xff);
    throw Error(text);
  }
  if (!(file[0x211] & LOADED_HIGH)) throw Error("bzImage: not loaded high (a zImage?)");
  if (!(read_at<uint16_t>(file, 0x236) & XLF_KERNEL_64))
    throw Error("bzImage: no 64-bit entry (XLF_KERNEL_64 unset)");
  const uint32_t setup_sects = file[0x1f1] == 0 ? 4 : file[0x1f1];
  image.setup_bytes = (setup_sects + 1) * 512;
  if (image.setup_bytes >= file.size())
    throw Error("bzImage: setup_sects (" + std::to_string(setup_sects) +
                ") reaches past the file's end");
  image.relocatable = file[0x234] != 0;
  image.initrd_max = read_at<uint32_t>(file, 0x22c);
  image.cmdline_max = read_at<uint32_t>(file, 0x238);
  image.init_size = read_at<uint32_t>(file, 0x260);
  const uint64_t preferred = read_at<uint64_t>(file, 0x258);
  const uint32_t alignment = read_at<uint32_t>(file, 0x230);
  if (image.relocatable) {
    if (alignment == 0 || (alignment & (alignment - 1)) != 0)
      throw Error("bzImage: kernel_alignment " + std::to_string(alignment) +
                  " is not a power of two");
    image.load_address = layout::kKernelStart;
  } else {
    if (preferred < layout::kKernelStart || preferred >= layout::kMmioStart)
      throw Error(
          "bzImage: not relocatable, and its preferred address is outside the guest's low RAM");
    image.load_address = preferred;
  }
  if (image.init_size == 0) throw Error("bzImage: init_size is 0");
  return image;
}

PvhKernel parse_pvh_elf(std::span<const uint8_t> file) {
  if (file.size() < sizeof(Elf64_Ehdr)) throw Error("vmlinux: too short for an ELF header");
  const auto header = read_at<Elf64_Ehdr>(file, 0);
  if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0) throw Error("vmlinux: not an ELF file");
  if (header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_ident[EI_DATA] != ELFDATA2LSB)
    throw Error("vmlinux: not a little-endian 64-bit ELF file");
  if (header.e_machine != EM_X86_64) throw Error("vmlinux: not an x86-64 ELF file");
  if (header.e_type != ET_EXEC) throw Error("vmlinux: not an executable ELF file");
  if (header.e_phentsize != sizeof(Elf64_Phdr))
    throw Error("vmlinux: e_phentsize is not the size of a program header");
  if (header.e_phnum == 0 ||
      !fits(header.e_phoff, uint64_t{header.e_phnum} * sizeof(Elf64_Phdr), file.size()))
    throw Error("vmlinux: the program headers lie outside the file");

  PvhKernel kernel;
  bool found_entry = false;
  for (uint16_t i = 0; i < header.e_phnum; ++i) {
    const auto ph = read_at<Elf64_Phdr>(file, header.e_phoff + i * sizeof(Elf64_Phdr));
    if (ph.p_type != PT_LOAD && ph.p_type != PT_NOTE) continue;
    if (!fits(ph.p_offset, ph.p_filesz, file.size()))
      throw Error("vmlinux: program header " + std::to_string(i) + " lies outside the file");
    if (ph.p_type == PT_LOAD) {
      if (ph.p_filesz > ph.p_memsz)
        throw Error("vmlinux: segment " + std::to_string(i) + " has p_filesz > p_memsz");
      if (ph.p_paddr < layout::kKernelStart || ph.p_memsz > layout::kMmioStart ||
          ph.p_paddr > layout::kMmioStart - ph.p_memsz)
        throw Error("vmlinux: segment " + std::to_string(i) + " is outside [1 MiB, the MMIO hole)");
      kernel.segments.push_back({ph.p_offset, ph.p_filesz, ph.p_paddr, ph.p_memsz});
      kernel.end = std::max(kernel.end, ph.p_paddr + ph.p_memsz);
      continue;
    }
    // Notes: namesz, descsz, type, then the name and the description,
    // each padded to 4 bytes.
    uint64_t at = ph.p_offset;
    const uint64_t end = ph.p_offset + ph.p_filesz;
    while (end - at >= sizeof(Elf64_Nhdr)) {
      const auto note = read_at<Elf64_Nhdr>(file, at);
      const uint64_t name_at = at + sizeof note;
      const uint64_t name_len = (uint64_t{note.n_namesz} + 3) & ~uint64_t{3};
      const uint64_t desc_len = (uint64_t{note.n_descsz} + 3) & ~uint64_t{3};
      if (!fits(name_at, name_len, end) || !fits(name_at + name_len, desc_len, end))
        throw Error("vmlinux: a note in program header " + std::to_string(i) +
                    " runs past its segment");
      const uint64_t desc_at = name_at + name_len;
      if (note.n_namesz == 4 && std::memcmp(file.data() + name_at, "Xen", 4) == 0 &&
          note.n_type == kXenNotePhys32Entry) {
        if (note.n_descsz != 4 && note.n_descsz != 8)
          throw Error("vmlinux: the PVH entry note is not 4 or 8 bytes");
        kernel.entry = read_at<uint32_t>(file, desc_at);
        found_entry = true;
      }
      at = desc_at + desc_len;
    }
  }
  if (!found_entry)
    throw Error("vmlinux: no PVH entry (XEN_ELFNOTE_PHYS32_ENTRY); the kernel needs CONFIG_PVH");
  if (kernel.segments.empty()) throw Error("vmlinux: no loadable segment");
  bool entry_inside = false;
  for (const ElfSegment& s : kernel.segments)
    if (kernel.entry >= s.address && kernel.entry < s.address + s.file_size) entry_inside = true;
  if (!entry_inside) throw Error("vmlinux: the PVH entry point lies outside every loaded segment");
  return kernel;
}

CpuEntry load_linux(GuestMemory& memory, std::span<const uint8_t> kernel,
                    const std::string& cmdline, std::span<const uint8_t> initramfs) {
  switch (detect(kernel)) {
    case KernelFormat::kBzImage:
      return load_bzimage(memory, kernel, cmdline, initramfs);
    case KernelFormat::kElf:
      return load_pvh(memory, kernel, cmdline, initramfs);
    case KernelFormat::kUnknown:
      break;
  }
  throw Error("the kernel is neither a bzImage nor an ELF vmlinux");
}

}  // namespace openshell::vm::boot
