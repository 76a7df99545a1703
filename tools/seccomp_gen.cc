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
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <seccomp.h>

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
  seccomp_attr_set(ctx, SCMP_FLTATR_CTL_NNP, 0);       // the runtime sets no_new_privs itself
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

  // socket: an allowlist of families. Unix and netlink sockets of any type;
  // IPv4 and IPv6 as stream, datagram or seqpacket only (no raw sockets);
  // nothing else (no AF_PACKET, AF_ALG, AF_VSOCK, ...). Only equality tests:
  // libseccomp 2.5 mis-merges a "not equal" with other tests on an argument.
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), {SCMP_A0(SCMP_CMP_EQ, AF_UNIX)}, "socket");
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket), {SCMP_A0(SCMP_CMP_EQ, AF_NETLINK)}, "socket");
  for (scmp_datum_t family : {AF_INET, AF_INET6})
    for (scmp_datum_t type : {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET})
      add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socket),
          {SCMP_A0(SCMP_CMP_EQ, family), SCMP_A1(SCMP_CMP_MASKED_EQ, 0xf, type)}, "socket");

  // socketpair: Unix sockets only (other families that pair, like TIPC, are
  // no business of a sandbox).
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(socketpair), {SCMP_A0(SCMP_CMP_EQ, AF_UNIX)}, "socketpair");

  // ioctl: allowed here; the guard below refuses TIOCSTI and TIOCLINUX
  // (libseccomp 2.5 drops a refusal for some arguments next to an
  // unconditional allow).
  add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(ioctl), {}, "ioctl");

  // personality: only the harmless personas.
  for (uint64_t persona : {0x0ULL, 0x8ULL, 0x20000ULL, 0x20008ULL, 0xffffffffULL})
    add(ctx, SCMP_ACT_ALLOW, SCMP_SYS(personality), {SCMP_A0(SCMP_CMP_EQ, persona)}, "personality");

  // Export libseccomp's program.
  int memfd = memfd_create("seccomp", 0);
  if (memfd < 0) die("memfd_create", -errno);
  if (int rc = seccomp_export_bpf(ctx, memfd); rc != 0) die("seccomp_export_bpf", rc);
  off_t size = lseek(memfd, 0, SEEK_END);
  std::vector<sock_filter> program(static_cast<size_t>(size) / sizeof(sock_filter));
  if (pread(memfd, program.data(), static_cast<size_t>(size), 0) != size) die("read bpf", -EIO);
  seccomp_release(ctx);

  // The guard, in front of libseccomp's program (L). Jump offsets count from
  // the next instruction.
  const uint32_t native = seccomp_arch_native();
  const int ioctl_nr = seccomp_syscall_resolve_name("ioctl");
  constexpr uint32_t kTiocsti = TIOCSTI, kTioclinux = 0x541C;
  constexpr uint32_t kArg1Low = 16 + 8 * 1;  // seccomp_data.args[1], low half (little-endian)
  enum : uint8_t { kEnosys = 10, kEperm = 11, kLib = 12 };
  auto to = [](int from, int target) { return static_cast<uint8_t>(target - from - 1); };
  std::vector<sock_filter> guard = {
      /* 0 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 4),  // A = arch
      /* 1 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, native, 0, to(1, kLib)),
      /* 2 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, 0),                            // A = nr
      /* 3 */ BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000, to(3, kLib), 0),  // x32: libseccomp's
                                                                                /* 4 */
      BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, static_cast<uint32_t>(max_known), to(4, kEnosys), 0),
      /* 5 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, static_cast<uint32_t>(ioctl_nr), 0, to(5, kLib)),
      /* 6 */ BPF_STMT(BPF_LD | BPF_W | BPF_ABS, kArg1Low),  // A = the ioctl command
      /* 7 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kTiocsti, to(7, kEperm), 0),
      /* 8 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kTioclinux, to(8, kEperm), 0),
      /* 9 */ BPF_JUMP(BPF_JMP | BPF_JA | BPF_K, to(9, kLib), 0, 0),
      /* 10 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
      /* 11 */ BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
  };
  if (guard.size() != kLib) die("guard layout", -EINVAL);
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
