#include "oci/seccomp_json.h"

#include <linux/seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <seccomp.h>

#include "base/error.h"
#include "base/unique_fd.h"

namespace openshell::oci {

namespace {

using nlohmann::json;

// field is the path below linux.seccomp, e.g. ".syscalls[3].action".
[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw Error("config.json: linux.seccomp" + field + ": " + why);
}

std::string item(const std::string& field, size_t index) {
  return field + "[" + std::to_string(index) + "]";
}

struct ContextRelease {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};
using Context = std::unique_ptr<void, ContextRelease>;

// A member that is absent or null is not there: Go's encoders write null
// for an empty slice.
const json* member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const json& array_at(const json& value, const std::string& field) {
  if (!value.is_array()) refuse(field, "must be an array, not " + value.dump());
  return value;
}

std::string string_at(const json& value, const std::string& field) {
  if (!value.is_string()) refuse(field, "must be a string, not " + value.dump());
  return value.get<std::string>();
}

uint64_t unsigned_at(const json& value, const std::string& field) {
  // nlohmann keeps a positive integer as unsigned, a negative one as signed.
  if (!value.is_number_unsigned())
    refuse(field, "must be a non-negative integer, not " + value.dump());
  return value.get<uint64_t>();
}

// libseccomp takes errno values below the kernel's MAX_ERRNO (4095) only.
constexpr uint64_t kLargestErrno = 4094;
// A trace value is the 16 data bits of the kernel's return value.
constexpr uint64_t kLargestTraceValue = 0xffff;

// An action, with its errno (ERRNO) or its value for the tracer (TRACE);
// both default to EPERM, as in runc.
uint32_t action_at(const json& value, const std::string& field, const json* ret,
                   const std::string& ret_field) {
  const std::string name = string_at(value, field);
  const uint64_t data = ret ? unsigned_at(*ret, ret_field) : EPERM;
  if (name == "SCMP_ACT_ALLOW") return SCMP_ACT_ALLOW;
  // The spec's KILL is the kernel's SECCOMP_RET_KILL, which kills the thread.
  if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD") return SCMP_ACT_KILL_THREAD;
  if (name == "SCMP_ACT_KILL_PROCESS") return SCMP_ACT_KILL_PROCESS;
  if (name == "SCMP_ACT_TRAP") return SCMP_ACT_TRAP;
  if (name == "SCMP_ACT_LOG") return SCMP_ACT_LOG;
  if (name == "SCMP_ACT_ERRNO") {
    if (data > kLargestErrno)
      refuse(ret_field, std::to_string(data) + " is not an errno (0 to " +
                            std::to_string(kLargestErrno) + ")");
    return SCMP_ACT_ERRNO(static_cast<uint32_t>(data));
  }
  if (name == "SCMP_ACT_TRACE") {
    if (data > kLargestTraceValue)
      refuse(ret_field, std::to_string(data) + " does not fit a trace value (0 to " +
                            std::to_string(kLargestTraceValue) + ")");
    return SCMP_ACT_TRACE(static_cast<uint32_t>(data));
  }
  if (name == "SCMP_ACT_NOTIFY")
    refuse(field,
           "\"SCMP_ACT_NOTIFY\" is not supported: openshell cannot hand the listener to "
           "a seccomp agent yet");
  refuse(field, "\"" + name + "\" is not a seccomp action");
}

scmp_compare op_at(const json& value, const std::string& field) {
  const std::string name = string_at(value, field);
  static const std::pair<const char*, scmp_compare> kOps[] = {
      {"SCMP_CMP_NE", SCMP_CMP_NE},
      {"SCMP_CMP_LT", SCMP_CMP_LT},
      {"SCMP_CMP_LE", SCMP_CMP_LE},
      {"SCMP_CMP_EQ", SCMP_CMP_EQ},
      {"SCMP_CMP_GE", SCMP_CMP_GE},
      {"SCMP_CMP_GT", SCMP_CMP_GT},
      {"SCMP_CMP_MASKED_EQ", SCMP_CMP_MASKED_EQ}};
  for (const auto& [text, op] : kOps)
    if (name == text) return op;
  refuse(field, "\"" + name + "\" is not a seccomp comparison");
}

// The spec's names are libseccomp's own ("x86_64", "aarch64", ...) in upper
// case after SCMP_ARCH_, so libseccomp's table is the list: every
// architecture this libseccomp knows, and no other.
uint32_t arch_at(const json& value, const std::string& field) {
  const std::string name = string_at(value, field);
  const std::string prefix = "SCMP_ARCH_";
  if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) {
    std::string token = name.substr(prefix.size());
    bool upper = true;
    for (char& c : token) {
      if (c >= 'a' && c <= 'z') upper = false;
      if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
    }
    if (upper)
      if (uint32_t arch = seccomp_arch_resolve_name(token.c_str()); arch != 0) return arch;
  }
  refuse(field, "\"" + name + "\" is not an architecture libseccomp knows");
}

void add_architectures(void* ctx, const json& arches) {
  array_at(arches, ".architectures");
  for (size_t i = 0; i < arches.size(); ++i) {
    const std::string field = item(".architectures", i);
    const uint32_t arch = arch_at(arches[i], field);
    const int rc = seccomp_arch_add(ctx, arch);
    // The native architecture is in every filter already.
    if (rc == 0 || rc == -EEXIST) continue;
    if (rc == -EDOM)
      refuse(field, "\"" + arches[i].get<std::string>() +
                        "\" has the other byte order: libseccomp cannot filter it together with "
                        "this machine's architecture");
    refuse(field, errno_message("libseccomp cannot add the architecture", -rc));
  }
}

// SECCOMP_FILTER_FLAG_* are flags of seccomp(2) at install, not part of the
// program: they go back in SeccompFilter::flags. The context gets them too,
// so that it describes the same filter.
unsigned apply_flags(void* ctx, const json& flags) {
  array_at(flags, ".flags");
  unsigned kernel_flags = 0;
  for (size_t i = 0; i < flags.size(); ++i) {
    const std::string field = item(".flags", i);
    const std::string name = string_at(flags[i], field);
    // Only the parent has threads; the child that installs the filter has
    // one, so there is nothing to synchronise.
    if (name == "SECCOMP_FILTER_FLAG_TSYNC") continue;
    scmp_filter_attr attr;
    if (name == "SECCOMP_FILTER_FLAG_LOG") {
      attr = SCMP_FLTATR_CTL_LOG;
      kernel_flags |= SECCOMP_FILTER_FLAG_LOG;
    } else if (name == "SECCOMP_FILTER_FLAG_SPEC_ALLOW") {
      attr = SCMP_FLTATR_CTL_SSB;
      kernel_flags |= SECCOMP_FILTER_FLAG_SPEC_ALLOW;
    } else {
      refuse(field, "\"" + name + "\" is not a seccomp flag openshell can set");
    }
    if (int rc = seccomp_attr_set(ctx, attr, 1); rc != 0)
      refuse(field, errno_message("libseccomp cannot set " + name, -rc));
  }
  return kernel_flags;
}

// A rule's conditions. All on one argument are alternatives, each a rule of
// its own; on several arguments they must all hold, in one rule. That is
// runc's reading, which profiles are written for (Docker's personality and
// clone rules).
struct Conditions {
  std::vector<scmp_arg_cmp> all;
  bool alternatives = false;
};

Conditions conditions_at(const json& args, const std::string& at) {
  array_at(args, at);
  Conditions out;
  for (size_t k = 0; k < args.size(); ++k) {
    const std::string field = item(at, k);
    const json& arg = args[k];
    if (!arg.is_object()) refuse(field, "must be an object, not " + arg.dump());
    const json* index = member(arg, "index");
    const json* value = member(arg, "value");
    const json* op = member(arg, "op");
    if (!index) refuse(field + ".index", "is required");
    if (!value) refuse(field + ".value", "is required");
    if (!op) refuse(field + ".op", "is required");
    const uint64_t n = unsigned_at(*index, field + ".index");
    if (n > 5) refuse(field + ".index", std::to_string(n) + " is not an argument (0 to 5)");
    scmp_arg_cmp cmp{};
    cmp.arg = static_cast<unsigned>(n);
    cmp.op = op_at(*op, field + ".op");
    // For MASKED_EQ, value is the mask and valueTwo what the masked
    // argument must equal, libseccomp's datum_a and datum_b.
    cmp.datum_a = unsigned_at(*value, field + ".value");
    const json* two = member(arg, "valueTwo");
    cmp.datum_b = two ? unsigned_at(*two, field + ".valueTwo") : 0;
    out.all.push_back(cmp);
  }
  bool one_index = true;
  for (const scmp_arg_cmp& cmp : out.all) one_index = one_index && cmp.arg == out.all[0].arg;
  out.alternatives = one_index && out.all.size() > 1;
  if (!out.alternatives) {
    // Two tests of one argument in one rule: libseccomp refuses the rule
    // (EINVAL); say which.
    for (size_t k = 1; k < out.all.size(); ++k)
      for (size_t j = 0; j < k; ++j)
        if (out.all[j].arg == out.all[k].arg)
          refuse(item(at, k) + ".index",
                 "argument " + std::to_string(out.all[k].arg) + " is tested by args[" +
                     std::to_string(j) +
                     "] too, in a rule that tests several arguments: libseccomp cannot combine "
                     "them");
  }
  return out;
}

void add_rule(void* ctx, uint32_t action, int nr, const std::string& name,
              const std::vector<scmp_arg_cmp>& conditions, const std::string& field) {
  const int rc = seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(conditions.size()),
                                        conditions.empty() ? nullptr : conditions.data());
  if (rc != 0) refuse(field, errno_message("libseccomp refused the rule for " + name, -rc));
}

void add_syscalls(void* ctx, const json& syscalls, uint32_t default_action) {
  array_at(syscalls, ".syscalls");
  for (size_t i = 0; i < syscalls.size(); ++i) {
    const std::string at = item(".syscalls", i);
    const json& rule = syscalls[i];
    if (!rule.is_object()) refuse(at, "must be an object, not " + rule.dump());
    const json* names = member(rule, "names");
    if (!names) refuse(at + ".names", "is required");
    array_at(*names, at + ".names");
    const json* action_value = member(rule, "action");
    if (!action_value) refuse(at + ".action", "is required");
    const uint32_t action =
        action_at(*action_value, at + ".action", member(rule, "errnoRet"), at + ".errnoRet");
    Conditions conditions;
    if (const json* args = member(rule, "args")) conditions = conditions_at(*args, at + ".args");

    for (size_t k = 0; k < names->size(); ++k) {
      const std::string field = item(at + ".names", k);
      const std::string name = string_at((*names)[k], field);
      if (name.empty()) refuse(field, "\"\" is not a system call name");
      // libseccomp refuses a rule that only repeats the default action.
      if (action == default_action) continue;
      // A name this libseccomp does not know (a newer call, a typing
      // mistake) is skipped, as runc does: profiles list calls of kernels
      // newer than the one they run on.
      const int nr = seccomp_syscall_resolve_name(name.c_str());
      if (nr == __NR_SCMP_ERROR) continue;
      if (conditions.alternatives) {
        for (const scmp_arg_cmp& cmp : conditions.all)
          add_rule(ctx, action, nr, name, {cmp}, field);
      } else {
        add_rule(ctx, action, nr, name, conditions.all, field);
      }
    }
  }
}

// libseccomp 2.5 has no seccomp_export_bpf_mem (2.6 has): it writes the
// program to a file descriptor, here a memfd read back.
std::vector<sock_filter> export_program(void* ctx) {
  UniqueFd memfd(::memfd_create("openshell-seccomp-bpf", MFD_CLOEXEC));
  if (!memfd) throw_errno("memfd_create for the seccomp filter");
  if (int rc = seccomp_export_bpf(ctx, memfd.get()); rc != 0)
    refuse("", errno_message("libseccomp could not export the filter", -rc));
  const off_t size = ::lseek(memfd.get(), 0, SEEK_END);
  if (size < 0) throw_errno("lseek on the exported seccomp filter");
  const size_t bytes = static_cast<size_t>(size);
  if (bytes == 0 || bytes % sizeof(sock_filter) != 0)
    refuse("", "libseccomp exported " + std::to_string(bytes) + " bytes, not a BPF program");
  const size_t length = bytes / sizeof(sock_filter);
  if (length > BPF_MAXINSNS)
    refuse("", "the filter is " + std::to_string(length) + " instructions, more than the " +
                   std::to_string(BPF_MAXINSNS) + " the kernel takes");
  std::vector<sock_filter> code(length);
  if (::pread(memfd.get(), code.data(), bytes, 0) != size)
    throw_errno("read back the exported seccomp filter");
  return code;
}

}  // namespace

SeccompFilter compile_seccomp(const json& profile) {
  if (!profile.is_object()) refuse("", "must be an object, not " + profile.dump());
  const json* default_value = member(profile, "defaultAction");
  if (!default_value) refuse(".defaultAction", "is required");
  const uint32_t default_action = action_at(*default_value, ".defaultAction",
                                            member(profile, "defaultErrnoRet"), ".defaultErrnoRet");
  // An empty path or metadata asks for no agent (runc reads them so too).
  for (const char* key : {"listenerPath", "listenerMetadata"})
    if (const json* value = member(profile, key);
        value && !(value->is_string() && value->get<std::string>().empty()))
      refuse(std::string(".") + key,
             "is not supported: openshell cannot hand the listener to a seccomp agent yet");

  Context ctx(seccomp_init(default_action));
  if (!ctx) refuse(".defaultAction", "libseccomp cannot make a filter with this action");
  // The child sets no_new_privs itself before it installs the program; the
  // attribute would only matter to seccomp_load, which is never called.
  if (int rc = seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_NNP, 0); rc != 0)
    refuse("", errno_message("libseccomp cannot leave no_new_privs to the caller", -rc));

  SeccompFilter out;
  if (const json* flags = member(profile, "flags")) out.flags = apply_flags(ctx.get(), *flags);
  if (const json* arches = member(profile, "architectures")) add_architectures(ctx.get(), *arches);
  if (const json* syscalls = member(profile, "syscalls"))
    add_syscalls(ctx.get(), *syscalls, default_action);
  out.code = export_program(ctx.get());
  return out;
}

}  // namespace openshell::oci
