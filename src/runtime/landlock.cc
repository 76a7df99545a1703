#include "runtime/landlock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.h"
#include "base/log.h"
#include "base/unique_fd.h"

// The kernel's uapi, defined here so that older headers still build.
#ifndef SYS_landlock_create_ruleset
#define SYS_landlock_create_ruleset 444
#define SYS_landlock_add_rule 445
#define SYS_landlock_restrict_self 446
#endif

namespace openshell::runtime::landlock {

namespace {

constexpr uint64_t kExecute = 1ULL << 0;
constexpr uint64_t kWriteFile = 1ULL << 1;
constexpr uint64_t kReadFile = 1ULL << 2;
constexpr uint64_t kReadDir = 1ULL << 3;
constexpr uint64_t kRemoveDir = 1ULL << 4;
constexpr uint64_t kRemoveFile = 1ULL << 5;
constexpr uint64_t kMakeChar = 1ULL << 6;
constexpr uint64_t kMakeDir = 1ULL << 7;
constexpr uint64_t kMakeReg = 1ULL << 8;
constexpr uint64_t kMakeSock = 1ULL << 9;
constexpr uint64_t kMakeFifo = 1ULL << 10;
constexpr uint64_t kMakeBlock = 1ULL << 11;
constexpr uint64_t kMakeSym = 1ULL << 12;
constexpr uint64_t kRefer = 1ULL << 13;     // ABI 2
constexpr uint64_t kTruncate = 1ULL << 14;  // ABI 3
constexpr uint64_t kIoctlDev = 1ULL << 15;  // ABI 5

constexpr uint64_t kScopeAbstractUnix = 1ULL << 0;  // ABI 6
constexpr uint64_t kScopeSignal = 1ULL << 1;        // ABI 6

constexpr uint32_t kCreateRulesetVersion = 1U << 0;
constexpr int kRulePathBeneath = 1;

struct RulesetAttr {
  uint64_t handled_access_fs;
  uint64_t handled_access_net;
  uint64_t scoped;
};

struct __attribute__((packed)) PathBeneathAttr {
  uint64_t allowed_access;
  int32_t parent_fd;
};

}  // namespace

int abi_version() {
  long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kCreateRulesetVersion);
  return abi < 0 ? 0 : static_cast<int>(abi);
}

uint64_t fs_rights_for_abi(int abi) {
  if (abi < 1) return 0;
  uint64_t rights = kExecute | kWriteFile | kReadFile | kReadDir | kRemoveDir | kRemoveFile |
                    kMakeChar | kMakeDir | kMakeReg | kMakeSock | kMakeFifo | kMakeBlock | kMakeSym;
  if (abi >= 2) rights |= kRefer;
  if (abi >= 3) rights |= kTruncate;
  if (abi >= 5) rights |= kIoctlDev;
  return rights;
}

uint64_t read_only_rights() { return kExecute | kReadFile | kReadDir; }
uint64_t file_rights() { return kExecute | kWriteFile | kReadFile | kTruncate | kIoctlDev; }

Plan plan(const policy::Policy& policy, const std::string& workdir, int abi) {
  Plan plan;
  if (!policy.has_filesystem_policy) return plan;
  plan.hard = policy.landlock == policy::LandlockCompatibility::kHardRequirement;
  if (abi < 1) {
    if (plan.hard)
      throw Error(
          "landlock: the kernel has no Landlock, and the policy's compatibility is "
          "hard_requirement");
    log::warn("Landlock is not available on this kernel: the filesystem policy is NOT enforced");
    return plan;
  }
  plan.enabled = true;
  plan.abi = abi;
  plan.handled_fs = fs_rights_for_abi(abi);
  if (abi >= 6) plan.scoped = kScopeAbstractUnix | kScopeSignal;
  if (abi < 3) {
    std::string missing = abi < 2 ? "cross-directory links and renames, truncation" : "truncation";
    if (plan.hard)
      throw Error("landlock: kernel ABI " + std::to_string(abi) + " cannot restrict " + missing +
                  ", and the policy's compatibility is hard_requirement");
    log::warn("Landlock ABI " + std::to_string(abi) + ": " + missing + " not restricted");
  }
  for (const auto& path : policy.filesystem.read_only)
    plan.rules.push_back({path, read_only_rights() & plan.handled_fs});
  for (const auto& path : policy.filesystem.read_write)
    plan.rules.push_back({path, plan.handled_fs});
  // The working directory, unless it is / (which would undo the policy).
  if (policy.filesystem.include_workdir && !workdir.empty() && workdir != "/")
    plan.rules.push_back({workdir, plan.handled_fs});
  return plan;
}

bool apply(const Plan& plan, int extra_exec_fd, char* skipped, size_t skipped_size,
           ChildFailure* f) noexcept {
  if (!plan.enabled) return true;
  RulesetAttr attr{plan.handled_fs, 0, plan.scoped};
  size_t attr_size = plan.abi >= 6 ? sizeof attr : 2 * sizeof(uint64_t);
  if (plan.abi < 4) attr_size = sizeof(uint64_t);
  // UniqueFd: its destructor is a close(2), fit for the child before exec.
  UniqueFd ruleset(static_cast<int>(::syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0)));
  if (!ruleset) return child::fail(f, errno, "landlock_create_ruleset");

  auto add = [&](int fd, uint64_t access) -> int {
    struct stat st;
    if (::fstat(fd, &st) != 0) return errno;
    if (!S_ISDIR(st.st_mode)) access &= file_rights();
    access &= plan.handled_fs;
    if (access == 0) return 0;
    PathBeneathAttr rule{access, fd};
    if (::syscall(SYS_landlock_add_rule, ruleset.get(), kRulePathBeneath, &rule, 0) != 0)
      return errno;
    return 0;
  };

  for (const Rule& rule : plan.rules) {
    UniqueFd path(::open(rule.path.c_str(), O_PATH | O_CLOEXEC));
    if (!path) {
      if (errno == ENOENT && !plan.hard) {
        if (skipped[0]) child::append(skipped, skipped_size, ", ");
        child::append(skipped, skipped_size, rule.path.c_str());
        continue;
      }
      return child::fail(f, errno, "landlock: policy path", rule.path.c_str());
    }
    if (int err = add(path.get(), rule.access))
      return child::fail(f, err, "landlock_add_rule", rule.path.c_str());
  }
  if (extra_exec_fd >= 0) {
    // The sealed init image; a memfd cannot carry a rule and needs none.
    int err = add(extra_exec_fd, kExecute | kReadFile);
    if (err && err != EBADF && err != EBADFD && err != EINVAL)
      return child::fail(f, err, "landlock_add_rule", "(init image)");
  }
  if (::syscall(SYS_landlock_restrict_self, ruleset.get(), 0) != 0)
    return child::fail(f, errno, "landlock_restrict_self");
  return true;
}

}  // namespace openshell::runtime::landlock
