#include "oci/seccomp_json.h"

#include <linux/seccomp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include <seccomp.h>

#include "base/error.h"
#include "base/unique_fd.h"

namespace openshell::oci {

namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw Error("config.json: linux.seccomp" + field + ": " + why);
}

struct ContextFree {
  void operator()(void* ctx) const { seccomp_release(ctx); }
};
using Context = std::unique_ptr<void, ContextFree>;

const json* member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

uint64_t unsigned_field(const json& value, const std::string& field) {
  if (!value.is_number_unsigned() && !(value.is_number_integer() && value.get<int64_t>() >= 0))
    refuse(field, "must be a non-negative integer, not " + value.dump());
  return value.get<uint64_t>();
}

// The errno of an ERRNO action, the value of a TRACE one.
uint32_t action_of(const json& value, const std::string& field, const json* errno_ret,
                   const std::string& errno_field) {
  if (!value.is_string()) refuse(field, "must be a string, not " + value.dump());
  const std::string name = value.get<std::string>();
  auto ret = [&](uint32_t fallback) {
    if (!errno_ret) return fallback;
    uint64_t n = unsigned_field(*errno_ret, errno_field);
    if (n > 0xffff) refuse(errno_field, std::to_string(n) + " is out of range");
    return static_cast<uint32_t>(n);
  };
  if (name == "SCMP_ACT_ALLOW") return SCMP_ACT_ALLOW;
  if (name == "SCMP_ACT_KILL" || name == "SCMP_ACT_KILL_THREAD") return SCMP_ACT_KILL_THREAD;
  if (name == "SCMP_ACT_KILL_PROCESS") return SCMP_ACT_KILL_PROCESS;
  if (name == "SCMP_ACT_TRAP") return SCMP_ACT_TRAP;
  if (name == "SCMP_ACT_LOG") return SCMP_ACT_LOG;
  if (name == "SCMP_ACT_ERRNO") return SCMP_ACT_ERRNO(ret(EPERM));
  if (name == "SCMP_ACT_TRACE") return SCMP_ACT_TRACE(ret(EPERM));
  if (name == "SCMP_ACT_NOTIFY")
    refuse(field, "SCMP_ACT_NOTIFY is not supported (no seccomp agent can be handed a listener)");
  refuse(field, "\"" + name + "\" is not a seccomp action");
}

scmp_compare op_of(const json& value, const std::string& field) {
  if (!value.is_string()) refuse(field, "must be a string, not " + value.dump());
  const std::string name = value.get<std::string>();
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

uint32_t arch_of(const json& value, const std::string& field) {
  if (!value.is_string()) refuse(field, "must be a string, not " + value.dump());
  const std::string name = value.get<std::string>();
  // libseccomp's own names are the spec's less the prefix, lower case.
  if (name.rfind("SCMP_ARCH_", 0) == 0) {
    std::string token = name.substr(10);
    for (char& c : token) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (uint32_t arch = seccomp_arch_resolve_name(token.c_str()); arch != 0) return arch;
  }
  refuse(field, "\"" + name + "\" is not an architecture libseccomp knows");
}

void add_rule(void* ctx, uint32_t action, int nr, const std::vector<scmp_arg_cmp>& args,
              const std::string& field) {
  int rc = seccomp_rule_add_array(ctx, action, nr, static_cast<unsigned>(args.size()),
                                  args.empty() ? nullptr : args.data());
  if (rc != 0) refuse(field, errno_message("libseccomp refused the rule", -rc));
}

}  // namespace

SeccompFilter compile_seccomp(const json& profile) {
  if (!profile.is_object()) refuse("", "must be an object, not " + profile.dump());
  const json* default_action = member(profile, "defaultAction");
  if (!default_action) refuse(".defaultAction", "is required");
  const uint32_t fallback = action_of(*default_action, ".defaultAction",
                                      member(profile, "defaultErrnoRet"), ".defaultErrnoRet");
  for (const char* key : {"listenerPath", "listenerMetadata"})
    if (member(profile, key))
      refuse(std::string(".") + key,
             "is not supported (no seccomp agent can be handed a listener)");
  Context ctx(seccomp_init(fallback));
  if (!ctx) refuse(".defaultAction", "libseccomp could not make a filter with it");
  // The child sets no_new_privs itself, before the filter goes in.
  seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_NNP, 0);

  SeccompFilter out;
  if (const json* flags = member(profile, "flags")) {
    if (!flags->is_array()) refuse(".flags", "must be an array, not " + flags->dump());
    for (size_t i = 0; i < flags->size(); ++i) {
      const std::string field = ".flags[" + std::to_string(i) + "]";
      const json& flag = (*flags)[i];
      if (!flag.is_string()) refuse(field, "must be a string, not " + flag.dump());
      const std::string name = flag.get<std::string>();
      if (name == "SECCOMP_FILTER_FLAG_TSYNC") continue;  // the child has one thread
      if (name == "SECCOMP_FILTER_FLAG_LOG")
        seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_LOG, 1);
      else if (name == "SECCOMP_FILTER_FLAG_SPEC_ALLOW")
        seccomp_attr_set(ctx.get(), SCMP_FLTATR_CTL_SSB, 1);
      else
        refuse(field, "\"" + name + "\" is not a seccomp flag openshell can set");
    }
  }

  if (const json* arches = member(profile, "architectures")) {
    if (!arches->is_array()) refuse(".architectures", "must be an array, not " + arches->dump());
    for (size_t i = 0; i < arches->size(); ++i) {
      const std::string field = ".architectures[" + std::to_string(i) + "]";
      uint32_t arch = arch_of((*arches)[i], field);
      int rc = seccomp_arch_add(ctx.get(), arch);
      if (rc != 0 && rc != -EEXIST)
        refuse(field, errno_message("libseccomp cannot add the architecture", -rc));
    }
  }

  if (const json* syscalls = member(profile, "syscalls")) {
    if (!syscalls->is_array()) refuse(".syscalls", "must be an array, not " + syscalls->dump());
    for (size_t i = 0; i < syscalls->size(); ++i) {
      const std::string at = ".syscalls[" + std::to_string(i) + "]";
      const json& rule = (*syscalls)[i];
      if (!rule.is_object()) refuse(at, "must be an object, not " + rule.dump());
      const json* names = member(rule, "names");
      if (!names || !names->is_array())
        refuse(at + ".names", names ? "must be an array, not " + names->dump() : "is required");
      const json* action_json = member(rule, "action");
      if (!action_json) refuse(at + ".action", "is required");
      const uint32_t action =
          action_of(*action_json, at + ".action", member(rule, "errnoRet"), at + ".errnoRet");

      // Conditions: all on one argument are alternatives (one rule each),
      // on several they must all hold (one rule), as runc reads them.
      std::vector<scmp_arg_cmp> conditions;
      bool one_index = true;
      if (const json* args = member(rule, "args")) {
        if (!args->is_array()) refuse(at + ".args", "must be an array, not " + args->dump());
        for (size_t k = 0; k < args->size(); ++k) {
          const std::string field = at + ".args[" + std::to_string(k) + "]";
          const json& arg = (*args)[k];
          if (!arg.is_object()) refuse(field, "must be an object, not " + arg.dump());
          const json* index = member(arg, "index");
          const json* value = member(arg, "value");
          const json* op = member(arg, "op");
          if (!index) refuse(field + ".index", "is required");
          if (!value) refuse(field + ".value", "is required");
          if (!op) refuse(field + ".op", "is required");
          uint64_t n = unsigned_field(*index, field + ".index");
          if (n > 5) refuse(field + ".index", std::to_string(n) + " is not an argument (0 to 5)");
          const json* two = member(arg, "valueTwo");
          scmp_arg_cmp cmp{};
          cmp.arg = static_cast<unsigned>(n);
          cmp.op = op_of(*op, field + ".op");
          cmp.datum_a = unsigned_field(*value, field + ".value");
          cmp.datum_b = two ? unsigned_field(*two, field + ".valueTwo") : 0;
          if (!conditions.empty() && conditions.front().arg != cmp.arg) one_index = false;
          conditions.push_back(cmp);
        }
      }
      // libseccomp refuses a rule that repeats the default.
      if (action == fallback) continue;
      for (size_t k = 0; k < names->size(); ++k) {
        const json& name = (*names)[k];
        const std::string field = at + ".names[" + std::to_string(k) + "]";
        if (!name.is_string()) refuse(field, "must be a string, not " + name.dump());
        // A name this libseccomp does not know is not on this kernel's
        // table either: skipped, as runc does.
        int nr = seccomp_syscall_resolve_name(name.get<std::string>().c_str());
        if (nr == __NR_SCMP_ERROR) continue;
        if (conditions.size() > 1 && one_index) {
          for (const scmp_arg_cmp& cmp : conditions) add_rule(ctx.get(), action, nr, {cmp}, field);
        } else {
          add_rule(ctx.get(), action, nr, conditions, field);
        }
      }
    }
  }

  // libseccomp 2.5 exports to a file descriptor only.
  UniqueFd memfd(static_cast<int>(::memfd_create("seccomp-bpf", MFD_CLOEXEC)));
  if (!memfd) throw_errno("memfd_create for the seccomp filter");
  if (int rc = seccomp_export_bpf(ctx.get(), memfd.get()); rc != 0)
    refuse("", errno_message("libseccomp could not export the filter", -rc));
  off_t size = ::lseek(memfd.get(), 0, SEEK_END);
  if (size <= 0 || size % static_cast<off_t>(sizeof(sock_filter)) != 0 ||
      size / static_cast<off_t>(sizeof(sock_filter)) > BPF_MAXINSNS)
    refuse("", "the filter is " + std::to_string(size / sizeof(sock_filter)) +
                   " instructions, more than the kernel's " + std::to_string(BPF_MAXINSNS));
  out.code.resize(static_cast<size_t>(size) / sizeof(sock_filter));
  if (::pread(memfd.get(), out.code.data(), static_cast<size_t>(size), 0) != size)
    throw_errno("read the seccomp filter back");
  return out;
}

}  // namespace openshell::oci
