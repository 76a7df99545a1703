// Loading Linux: the bzImage setup header and the PVH ELF note, on crafted
// and hostile files, and what lands in guest memory.
#include <asm/bootparam.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "../fuzz/kernel_loader_input.h"
#include "test_util.h"
#include "vm/boot.h"
#include "vm/guest_memory.h"
#include "vm/layout.h"
#include "vm/runner.h"
#include "vm_guest.h"

namespace openshell::vm::boot {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
using Bytes = std::vector<uint8_t>;
using ::openshell::testing::error_of;

template <typename T>
void put(Bytes& file, size_t offset, T value) {
  std::memcpy(file.data() + offset, &value, sizeof value);
}
template <typename T>
T get(const GuestMemory& memory, uint64_t address) {
  T value{};
  EXPECT_TRUE(memory.read(address, &value, sizeof value));
  return value;
}

// A bzImage with a 2.15 header, one setup sector and 1 KiB of "kernel".
Bytes crafted_bzimage() {
  Bytes file(2048, 0);
  file[0x1f1] = 1;  // setup_sects: 1024 bytes of setup
  put<uint16_t>(file, 0x1fe, 0xaa55);
  file[0x201] = 0x66;  // the header runs to 0x268
  put<uint32_t>(file, 0x202, 0x53726448);
  put<uint16_t>(file, 0x206, 0x020f);
  file[0x211] = LOADED_HIGH;
  put<uint32_t>(file, 0x22c, 0x7fffffff);  // initrd_addr_max
  put<uint32_t>(file, 0x230, 0x200000);    // kernel_alignment
  file[0x234] = 1;                         // relocatable
  put<uint16_t>(file, 0x236, XLF_KERNEL_64);
  put<uint32_t>(file, 0x238, 2047);  // cmdline_size
  put<uint32_t>(file, 0x260, 0x40000);
  for (size_t i = 1024; i < file.size(); ++i) file[i] = 'K';
  return file;
}

TEST(VmBoot, ParsesACraftedBzImageHeader) {
  const BzImage image = parse_bzimage(crafted_bzimage());
  EXPECT_EQ(image.version, 0x020f);
  EXPECT_EQ(image.setup_bytes, 1024u);
  EXPECT_EQ(image.load_address, layout::kKernelStart);
  EXPECT_EQ(image.init_size, 0x40000u);
  EXPECT_EQ(image.cmdline_max, 2047u);
  EXPECT_TRUE(image.relocatable);
  EXPECT_EQ(detect(crafted_bzimage()), KernelFormat::kBzImage);
}

TEST(VmBoot, LoadsABzImageWithBootParamsE820CmdlineAndInitramfs) {
  GuestMemory memory = GuestMemory::create(16 * kMiB);
  const Bytes initramfs(8192 + 5, 'I');
  const CpuEntry entry = load_linux(memory, crafted_bzimage(), "console=ttyS0 quiet", initramfs);
  EXPECT_EQ(entry.mode, CpuEntry::Mode::kLong);
  EXPECT_EQ(entry.rip, layout::kKernelStart + 0x200);
  EXPECT_EQ(entry.rsi, layout::kZeroPage);

  EXPECT_EQ(get<uint8_t>(memory, layout::kKernelStart), 'K');
  EXPECT_EQ(get<uint8_t>(memory, layout::kKernelStart + 1023), 'K');
  boot_params params{};
  ASSERT_TRUE(memory.read(layout::kZeroPage, &params, sizeof params));
  EXPECT_EQ(params.hdr.header, 0x53726448u);
  EXPECT_EQ(params.hdr.type_of_loader, 0xff);
  EXPECT_EQ(params.hdr.cmd_line_ptr, layout::kCmdline);
  char cmdline[32] = {};
  ASSERT_TRUE(memory.read(layout::kCmdline, cmdline, sizeof cmdline));
  EXPECT_STREQ(cmdline, "console=ttyS0 quiet");

  ASSERT_EQ(params.e820_entries, 3);
  EXPECT_EQ(params.e820_table[0].addr, 0u);
  EXPECT_EQ(params.e820_table[0].type, 1u);
  EXPECT_EQ(params.e820_table[1].addr, layout::kEbdaStart);
  EXPECT_EQ(params.e820_table[1].type, 2u);
  EXPECT_EQ(params.e820_table[2].addr, layout::kKernelStart);
  EXPECT_EQ(params.e820_table[2].addr + params.e820_table[2].size, 16 * kMiB);

  EXPECT_EQ(params.hdr.ramdisk_size, initramfs.size());
  EXPECT_EQ(params.hdr.ramdisk_image % layout::kPageSize, 0u);
  EXPECT_GE(params.hdr.ramdisk_image, layout::kKernelStart + 0x40000);  // above init_size
  EXPECT_LE(params.hdr.ramdisk_image + initramfs.size(), 16 * kMiB);
  EXPECT_EQ(get<uint8_t>(memory, params.hdr.ramdisk_image), 'I');
  EXPECT_EQ(get<uint8_t>(memory, params.hdr.ramdisk_image + initramfs.size() - 1), 'I');
}

TEST(VmBoot, RefusesHostileBzImageHeaders) {
  auto refused = [](Bytes file) { return error_of([&] { parse_bzimage(file); }); };
  Bytes file = crafted_bzimage();
  EXPECT_EQ(refused(Bytes(file.begin(), file.begin() + 0x250)),
            "bzImage: 592 bytes, too short for the setup header");
  file = crafted_bzimage();
  put<uint16_t>(file, 0x1fe, 0);
  EXPECT_EQ(refused(file), "bzImage: no boot flag 0xaa55 at 0x1fe");
  file = crafted_bzimage();
  put<uint32_t>(file, 0x202, 0x12345678);
  EXPECT_EQ(refused(file), "bzImage: no \"HdrS\" magic at 0x202");
  file = crafted_bzimage();
  put<uint16_t>(file, 0x206, 0x0205);
  EXPECT_EQ(refused(file), "bzImage: boot protocol 2.05, this loader needs 2.12 or later");
  file = crafted_bzimage();
  put<uint16_t>(file, 0x236, 0);
  EXPECT_EQ(refused(file), "bzImage: no 64-bit entry (XLF_KERNEL_64 unset)");
  file = crafted_bzimage();
  file[0x211] = 0;
  EXPECT_EQ(refused(file), "bzImage: not loaded high (a zImage?)");
  file = crafted_bzimage();
  file[0x1f1] = 200;  // 100 KiB of setup in a 2 KiB file
  EXPECT_EQ(refused(file), "bzImage: setup_sects (200) reaches past the file's end");
  file = crafted_bzimage();
  put<uint32_t>(file, 0x230, 3);
  EXPECT_EQ(refused(file), "bzImage: kernel_alignment 3 is not a power of two");
  file = crafted_bzimage();
  file[0x234] = 0;
  put<uint64_t>(file, 0x258, 0xffffffff00000000ull);
  EXPECT_EQ(refused(file),
            "bzImage: not relocatable, and its preferred address is outside the guest's low RAM");
  file = crafted_bzimage();
  put<uint32_t>(file, 0x260, 0);
  EXPECT_EQ(refused(file), "bzImage: init_size is 0");
}

TEST(VmBoot, RefusesWhatDoesNotFitTheGuest) {
  GuestMemory memory = GuestMemory::create(4 * kMiB);
  Bytes file = crafted_bzimage();
  put<uint32_t>(file, 0x260, 0x10000000);  // 256 MiB to decompress in a 4 MiB guest
  EXPECT_NE(error_of([&] { load_linux(memory, file, "", {}); }).find("more than the guest's RAM"),
            std::string::npos);
  file = crafted_bzimage();
  put<uint32_t>(file, 0x238, 8);
  EXPECT_EQ(error_of([&] { load_linux(memory, file, "console=ttyS0", {}); }),
            "the kernel command line is 13 bytes; this kernel takes 8");
  EXPECT_EQ(error_of([&] { load_linux(memory, crafted_bzimage(), std::string("a\0b", 3), {}); }),
            "the kernel command line holds a NUL byte");
  const Bytes huge(8 * kMiB, 0);
  EXPECT_NE(
      error_of([&] { load_linux(memory, crafted_bzimage(), "", huge); }).find("the initramfs"),
      std::string::npos);
  EXPECT_EQ(error_of([&] { load_linux(memory, Bytes(4096, 0), "", {}); }),
            "the kernel is neither a bzImage nor an ELF vmlinux");
}

// An ELF64 vmlinux: one PT_LOAD of 16 bytes (64 in memory) at `address`,
// one PT_NOTE with the PVH entry.
struct CraftedElf {
  Bytes file;
  size_t load_phdr = 0, note_phdr = 0, note = 0;
};
CraftedElf crafted_vmlinux(uint64_t address = 16 * kMiB, const Bytes& code = Bytes(16, 'V'),
                           uint64_t entry_offset = 4) {
  CraftedElf elf;
  elf.file.assign(4096, 0);
  Elf64_Ehdr header{};
  std::memcpy(header.e_ident, ELFMAG, SELFMAG);
  header.e_ident[EI_CLASS] = ELFCLASS64;
  header.e_ident[EI_DATA] = ELFDATA2LSB;
  header.e_type = ET_EXEC;
  header.e_machine = EM_X86_64;
  header.e_phoff = sizeof header;
  header.e_phentsize = sizeof(Elf64_Phdr);
  header.e_phnum = 2;
  put(elf.file, 0, header);
  elf.load_phdr = sizeof header;
  elf.note_phdr = elf.load_phdr + sizeof(Elf64_Phdr);
  Elf64_Phdr load{};
  load.p_type = PT_LOAD;
  load.p_offset = 0x800;
  load.p_paddr = address;
  load.p_filesz = code.size();
  load.p_memsz = code.size() + 48;
  put(elf.file, elf.load_phdr, load);
  elf.file.resize(std::max<size_t>(elf.file.size(), 0x800 + code.size()));
  std::copy(code.begin(), code.end(), elf.file.begin() + 0x800);
  elf.note = 0x400;
  Elf64_Phdr note{};
  note.p_type = PT_NOTE;
  note.p_offset = elf.note;
  note.p_filesz = sizeof(Elf64_Nhdr) + 4 + 4;
  put(elf.file, elf.note_phdr, note);
  put(elf.file, elf.note, Elf64_Nhdr{4, 4, 18});
  std::memcpy(elf.file.data() + elf.note + sizeof(Elf64_Nhdr), "Xen", 4);
  put<uint32_t>(elf.file, elf.note + sizeof(Elf64_Nhdr) + 4,
                static_cast<uint32_t>(address + entry_offset));
  return elf;
}

TEST(VmBoot, LoadsAPvhVmlinuxWithStartInfoMemmapAndModule) {
  GuestMemory memory = GuestMemory::create(32 * kMiB);
  const Bytes initramfs(4096, 'I');
  const CpuEntry entry = load_linux(memory, crafted_vmlinux().file, "console=hvc0", initramfs);
  EXPECT_EQ(entry.mode, CpuEntry::Mode::kProtected);
  EXPECT_EQ(entry.rip, 16 * kMiB + 4);
  EXPECT_EQ(entry.rbx, layout::kPvhStartInfo);
  EXPECT_EQ(get<uint8_t>(memory, 16 * kMiB), 'V');
  EXPECT_EQ(get<uint8_t>(memory, 16 * kMiB + 16), 0);  // the rest of p_memsz is zeroed

  EXPECT_EQ(get<uint32_t>(memory, layout::kPvhStartInfo), 0x336ec578u);  // magic
  EXPECT_EQ(get<uint32_t>(memory, layout::kPvhStartInfo + 4), 1u);       // version
  EXPECT_EQ(get<uint32_t>(memory, layout::kPvhStartInfo + 12), 1u);      // one module
  const uint64_t modlist = get<uint64_t>(memory, layout::kPvhStartInfo + 16);
  EXPECT_EQ(get<uint64_t>(memory, layout::kPvhStartInfo + 24), layout::kCmdline);
  const uint64_t memmap = get<uint64_t>(memory, layout::kPvhStartInfo + 40);
  EXPECT_EQ(get<uint32_t>(memory, layout::kPvhStartInfo + 48), 3u);
  const uint64_t module = get<uint64_t>(memory, modlist);
  EXPECT_EQ(get<uint64_t>(memory, modlist + 8), initramfs.size());
  EXPECT_GE(module, 16 * kMiB + 64);
  EXPECT_EQ(get<uint8_t>(memory, module), 'I');
  EXPECT_EQ(get<uint64_t>(memory, memmap + 2 * 24), layout::kKernelStart);
  EXPECT_EQ(get<uint64_t>(memory, memmap + 2 * 24 + 8), 32 * kMiB - layout::kKernelStart);
}

TEST(VmBoot, RefusesHostileVmlinuxFiles) {
  auto refused = [](const Bytes& file) { return error_of([&] { parse_pvh_elf(file); }); };
  CraftedElf elf = crafted_vmlinux();
  EXPECT_EQ(refused(Bytes(elf.file.begin(), elf.file.begin() + 32)),
            "vmlinux: too short for an ELF header");

  elf = crafted_vmlinux();
  elf.file[EI_CLASS] = ELFCLASS32;
  EXPECT_EQ(refused(elf.file), "vmlinux: not a little-endian 64-bit ELF file");

  elf = crafted_vmlinux();
  put<uint16_t>(elf.file, offsetof(Elf64_Ehdr, e_machine), EM_386);
  EXPECT_EQ(refused(elf.file), "vmlinux: not an x86-64 ELF file");

  elf = crafted_vmlinux();
  put<uint16_t>(elf.file, offsetof(Elf64_Ehdr, e_phnum), 0xffff);
  EXPECT_EQ(refused(elf.file), "vmlinux: the program headers lie outside the file");

  elf = crafted_vmlinux();
  put<uint64_t>(elf.file, offsetof(Elf64_Ehdr, e_phoff), 0xfffffffffffffff0ull);
  EXPECT_EQ(refused(elf.file), "vmlinux: the program headers lie outside the file");

  elf = crafted_vmlinux();
  put<uint64_t>(elf.file, elf.load_phdr + offsetof(Elf64_Phdr, p_filesz), 0xffffffffffffff00ull);
  EXPECT_EQ(refused(elf.file), "vmlinux: program header 0 lies outside the file");

  elf = crafted_vmlinux();
  put<uint64_t>(elf.file, elf.load_phdr + offsetof(Elf64_Phdr, p_memsz), 8);
  EXPECT_EQ(refused(elf.file), "vmlinux: segment 0 has p_filesz > p_memsz");

  elf = crafted_vmlinux(0x1000);  // over the boot structures
  EXPECT_EQ(refused(elf.file), "vmlinux: segment 0 is outside [1 MiB, the MMIO hole)");

  elf = crafted_vmlinux(layout::kMmioStart - 32);  // across the hole's edge
  EXPECT_EQ(refused(elf.file), "vmlinux: segment 0 is outside [1 MiB, the MMIO hole)");

  elf = crafted_vmlinux();
  put(elf.file, elf.note, Elf64_Nhdr{0x7fffffff, 4, 18});  // a name past the segment
  EXPECT_EQ(refused(elf.file), "vmlinux: a note in program header 1 runs past its segment");

  elf = crafted_vmlinux();
  put(elf.file, elf.note, Elf64_Nhdr{4, 4, 17});  // another Xen note, no entry
  EXPECT_EQ(refused(elf.file),
            "vmlinux: no PVH entry (XEN_ELFNOTE_PHYS32_ENTRY); the kernel needs CONFIG_PVH");

  elf = crafted_vmlinux();
  put<uint32_t>(elf.file, elf.note + sizeof(Elf64_Nhdr) + 4, 0x200000);
  EXPECT_EQ(refused(elf.file), "vmlinux: the PVH entry point lies outside every loaded segment");
}

TEST(VmBoot, AVmlinuxTooLargeForTheGuestIsRefused) {
  GuestMemory memory = GuestMemory::create(8 * kMiB);  // the segment is at 16 MiB
  EXPECT_EQ(error_of([&] { load_linux(memory, crafted_vmlinux().file, "", {}); }),
            "vmlinux: a segment of 64 bytes at 16777216 does not fit in the guest's RAM");
}

TEST(VmBoot, IdentityPageTablesMapTheFirstFourGiB) {
  GuestMemory memory = GuestMemory::create(2 * kMiB);
  write_identity_page_tables(memory);
  write_gdt(memory);
  EXPECT_EQ(get<uint64_t>(memory, layout::kPml4), layout::kPdpt | 3);
  EXPECT_EQ(get<uint64_t>(memory, layout::kPdpt + 3 * 8),
            (layout::kPd + 3 * layout::kPageSize) | 3);
  // The last 2 MiB page below 4 GiB maps to itself.
  EXPECT_EQ(get<uint64_t>(memory, layout::kPd + 3 * layout::kPageSize + 511 * 8),
            (4ull << 30) - (2 * kMiB) + 0x83);
  EXPECT_EQ(get<uint64_t>(memory, layout::kBootGdt + layout::kBootCode64), 0x00af9b000000ffffull);
}

// The loaders on KVM: a crafted bzImage whose 64-bit entry and a crafted
// PVH vmlinux whose 32-bit entry print the command line they were given,
// reading it where boot_params and hvm_start_info say it is.
TEST(VmBoot, ACraftedBzImageRunsFromItsLongModeEntryWithBootParams) {
  OSH_REQUIRE_KVM(kvm);
  const Bytes code = testing::read_guest("bzimage_entry");
  Bytes file = crafted_bzimage();
  file.resize(1024);  // the setup sectors
  file.insert(file.end(), code.begin(), code.end());
  GuestMemory memory = GuestMemory::create(16 * kMiB);
  const CpuEntry entry = load_linux(memory, file, "console=ttyS0 loader=bzimage", {});
  const auto result = testing::run_prepared(*kvm, std::move(memory), entry, {}, "bzimage_entry");
  EXPECT_EQ(result.serial, "console=ttyS0 loader=bzimage\n");
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
}

TEST(VmBoot, ACraftedPvhVmlinuxRunsFromItsProtectedModeEntryWithStartInfo) {
  OSH_REQUIRE_KVM(kvm);
  const Bytes code = testing::read_guest("pvh_entry");
  GuestMemory memory = GuestMemory::create(16 * kMiB);
  const CpuEntry entry = load_linux(memory, crafted_vmlinux(layout::kKernelStart, code, 0).file,
                                    "console=hvc0 loader=pvh", {});
  const auto result = testing::run_prepared(*kvm, std::move(memory), entry, {}, "pvh_entry");
  EXPECT_EQ(result.serial, "console=hvc0 loader=pvh\n");
  EXPECT_EQ(result.end.reason, EndReason::kGuestReset) << result.end.detail;
}

// run_confined (in a child: it confines itself) gives a Linux guest each
// device's window on its command line: the disks in order, then vsock.
TEST(VmBoot, TheRunnerPutsEveryDevicesWindowOnTheKernelsCommandLine) {
  OSH_REQUIRE_KVM(kvm);
  const Bytes code = testing::read_guest("bzimage_entry");
  Bytes file = crafted_bzimage();
  file.resize(1024);
  file.insert(file.end(), code.begin(), code.end());
  ::openshell::testing::TempDir dir;
  auto write = [](const std::string& path, const Bytes& bytes) {
    std::ofstream(path, std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()),
               static_cast<std::streamsize>(bytes.size()));
  };
  write(dir / "bzImage", file);
  write(dir / "a.img", Bytes(4096));
  write(dir / "b.img", Bytes(4096));
  int channel[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, channel), 0);
  int serial[2];
  ASSERT_EQ(::pipe2(serial, O_CLOEXEC), 0);
  auto report = ::openshell::testing::run_in_child([&](::openshell::testing::ChildWriter& out) {
    RunSpec spec;
    spec.kernel = dir / "bzImage";
    spec.cmdline = "console=ttyS0";
    spec.memory_mib = 16;
    spec.disks = {{dir / "a.img", false}, {dir / "b.img", true}};
    spec.channel_fd = channel[1];
    spec.serial_fd = serial[1];
    try {
      out.say(std::string("end ") + end_reason_name(run_confined(spec).reason));
    } catch (const Error& e) {
      out.say(std::string("error ") + e.what());
    }
  });
  ::close(serial[1]);
  ::close(channel[1]);
  std::string printed;
  char buffer[512];
  for (ssize_t n; (n = ::read(serial[0], buffer, sizeof buffer)) > 0;) printed.append(buffer, n);
  ::close(serial[0]);
  ::close(channel[0]);
  EXPECT_EQ(report.text, "end guest reset\n");
  EXPECT_EQ(printed,
            "console=ttyS0 virtio_mmio.device=4K@0xd0000000:5 virtio_mmio.device=4K@0xd0001000:6 "
            "virtio_mmio.device=4K@0xd0002000:7\n");
}

// The fuzzer's corpus, replayed on every build: its two seeds load, and
// nothing in it breaks the loaders (a crash fails the whole run).
TEST(VmBoot, FuzzCorpusReplays) {
  GuestMemory memory = GuestMemory::create(8 * kMiB);
  int inputs = 0;
  for (const auto& entry : std::filesystem::directory_iterator(OSH_KERNEL_LOADER_CORPUS)) {
    std::ifstream in(entry.path(), std::ios::binary);
    const Bytes input{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const std::string said =
        ::openshell::fuzz::load_kernel_input(memory, input.data(), input.size());
    const std::string name = entry.path().filename().string();
    if (name == "bzimage" || name == "pvh") EXPECT_EQ(said, "") << name;
    ++inputs;
  }
  EXPECT_GE(inputs, 2);
}

// Debian's own kernels, where the machine has them: their headers parse.
TEST(VmBoot, ParsesTheHostsKernelHeaders) {
  int parsed = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/boot", ec)) {
    if (entry.path().filename().string().rfind("vmlinuz-", 0) != 0) continue;
    std::ifstream in(entry.path(), std::ios::binary);
    const Bytes file{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    const BzImage image = parse_bzimage(file);
    EXPECT_GE(image.version, 0x020c) << entry.path();
    EXPECT_TRUE(image.relocatable) << entry.path();
    ++parsed;
  }
  if (parsed == 0) GTEST_SKIP() << "no /boot/vmlinuz-* on this machine";
}

}  // namespace
}  // namespace openshell::vm::boot
