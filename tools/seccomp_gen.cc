// Build-time generator: compiles the default seccomp profile
// (src/runtime/seccomp_profile.cc) with libseccomp and writes the resulting
// BPF program as a C++ header, so that the runtime loads a ready program.
//
// In front of libseccomp's program it puts a short guard: on the native
// architecture, a system call number above every number the profile knows
// returns ENOSYS (not EPERM), so that programs fall back to older calls on
// kernels newer than the profile, as Docker's profile does.
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/seccomp_profile.h"

namespace profile = openshell::runtime::seccomp_profile;

namespace {

[[noreturn]] void die(const std::string& what, int rc) {
  std::fprintf(stderr, "seccomp_gen: %s: %s\n", what.c_str(), std::strerror(-rc));
  std::exit(1);
}

int resolve(const profile::Syscall& s) {
  if (s.number >= 0) return s.number;
  return seccomp_syscall_resolve_name(s.name);  // negative: not on this architecture
}

void add(scmp_filter_ctx ctx, uint32_t action, int nr, std::vector<scmp_arg_cmp> args,
         const char* name) {
  int rc = seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(args.size()),
                                  args.empty() ? nullptr : args.data());
  if (rc != 0) die(std::string("rule for ") + name, rc);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: seccomp_gen OUTPUT.h\n");
    return 2;
  }
  scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(EPERM));
  if (!ctx) die("seccomp_init", -ENOMEM);
  seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS);
  seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);      // the runtime sets no_new_privs itself
  seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2);  // a binary tree, not a linear scan

  int max_known = 0;
  auto note = [&](int nr) { max_known = nr > max_known ? nr : max_known; };

  for (int i = 0; i < profile::kAllowedCount; ++i) {
    int nr = resolve(profile::kAllowed[i]);
    if (nr < 0) continue;
    note(nr);
    add(ctx, SCMP_ACT_ALLOW, nr, {}, profile::kAllowed[i].name);
  }
  for (int i = 0; i < profile::kRefusedCount; ++i) {
    int nr = resolve(profile::kRefused[i]);
    if (nr >= 0) note(nr);
  }
  for (int i = 0; i < profile::kUnavailableCount; ++i) {
    int nr = resolve(profile::kUnavailable[i]);
    if (nr < 0) continue;
    note(nr);
    add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, {}, profile::kUnavailable[i].name);
  }

  // clone and unshare: never with namespace flags.
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(clone),
      {SCMP_A0(SCMP_CMP_MASKED_EQ, profile::kNamespaceFlags, 0)}, "clone");
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(unshare),
      {SCMP_A0(SCMP_CMP_MASKED_EQ, profile::kNamespaceFlags, 0)}, "unshare");

  // socket: netlink of any type; otherwise stream, datagram and seqpacket
  // only (no raw sockets), and never AF_PACKET.
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), {SCMP_A0(SCMP_CMP_EQ, AF_NETLINK)}, "socket");
  for (scmp_datum_t type : {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET})
    add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket),
        {SCMP_A0(SCMP_CMP_NE, AF_PACKET), SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, type)}, "socket");

  // ioctl: anything but pushing input into a terminal (TIOCSTI, TIOCLINUX).
  // The command is 32 bits wide in the kernel; compare only those bits.
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), {}, "ioctl");
  for (unsigned long cmd : {static_cast<unsigned long>(TIOCSTI), 0x541CUL /* TIOCLINUX */})
    add(ctx, SCMP_ACT_ERRNO(EACCES), SCMP_SYS(ioctl),
        {SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffUL, cmd)}, "ioctl");

  // personality: only the harmless personas.
  for (uint64_t persona : {0x0ULL, 0x8ULL, 0x20000ULL, 0x20008ULL, 0xffffffffULL})
    add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(personality), {SCMP_A0(SCMP_CMP_EQ, persona)},
        "personality");

  // Export libseccomp's program.
  int memfd = memfd_create("seccomp", 0);
  if (memfd < 0) die("memfd_create", -errno);
  if (int rc = seccomp_export_bpf(ctx, memfd); rc != 0) die("seccomp_export_bpf", rc);
  off_t size = lseek(memfd, 0, SEEK_END);
  std::vector<sock_filter> program(static_cast<size_t>(size) / sizeof(sock_filter));
  if (pread(memfd, program.data(), static_cast<size_t>(size), 0) != size) die("read bpf", -EIO);
  seccomp_release(ctx);

  uint32_t native = seccomp_arch_native();
  // The guard; L = index of libseccomp's first instruction (6).
  std::vector<sock_filter> guard = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),                     // 0: A = arch
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, native, 0, 4),         // 1: other arch -> L
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),                     // 2: A = nr
      BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, 2, 0),     // 3: x32 -> L
      BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, static_cast<uint32_t>(max_known), 0, 1),  // 4
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),     // 5: unknown -> ENOSYS
  };
  guard.insert(guard.end(), program.begin(), program.end());
  if (guard.size() > BPF_MAXINSNS) die("program too long", -E2BIG);

  FILE* out = std::fopen(argv[1], "w");
  if (!out) die(argv[1], -errno);
  std::fprintf(out,
               "// Generated by tools/seccomp_gen from src/runtime/seccomp_profile.cc.\n"
               "// Do not edit.\n#pragma once\n\n#include <linux/filter.h>\n\n"
               "namespace openshell::runtime::generated {\n\n"
               "inline constexpr unsigned kDefaultFilterMaxSyscall = %d;\n"
               "inline constexpr unsigned kDefaultFilterArch = 0x%08x;\n"
               "inline const sock_filter kDefaultFilter[] = {\n",
               max_known, native);
  for (const auto& insn : guard)
    std::fprintf(out, "    {0x%04x, %u, %u, 0x%08x},\n", insn.code, insn.jt, insn.jf, insn.k);
  std::fprintf(out, "};\n\n}  // namespace openshell::runtime::generated\n");
  return std::fclose(out) == 0 ? 0 : 1;
}
