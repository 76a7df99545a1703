#include "runtime/caps.h"

#include <linux/capability.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"

namespace openshell::runtime::caps {

int last_cap() {
  static int cached = [] {
    auto text = files::try_read("/proc/sys/kernel/cap_last_cap");
    if (text)
      if (auto n = text::parse_uint(text::trim(*text), 63)) return static_cast<int>(*n);
    return static_cast<int>(CAP_LAST_CAP);
  }();
  return cached;
}

Set parse(const std::vector<std::string>& names) {
  Set set = 0;
  for (const auto& raw : names) {
    std::string name(text::trim(raw));
    std::string upper = text::upper(name);
    if (upper == "ALL") {
      for (int i = 0; i <= last_cap(); ++i) set |= Set{1} << i;
      continue;
    }
    if (upper.rfind("CAP_", 0) != 0) upper = "CAP_" + upper;
    const std::string lower = text::lower(upper);
    cap_value_t value;
    bool known = lower.find_first_not_of("abcdefghijklmnopqrstuvwxyz_") == std::string::npos &&
                 cap_from_name(lower.c_str(), &value) == 0 && value >= 0 && value <= last_cap();
    if (known) {
      // libcap matches a prefix ("net_admin2" reads as net_admin): insist on the whole name.
      char* canonical = cap_to_name(value);
      known = canonical && lower == canonical;
      cap_free(canonical);
    }
    if (!known) throw Error("--cap-add " + name + ": unknown capability");
    set |= Set{1} << value;
  }
  return set;
}

std::string describe(Set set) {
  std::vector<std::string> names;
  for (int i = 0; i < 64; ++i) {
    if (!(set & (Set{1} << i))) continue;
    char* name = cap_to_name(static_cast<cap_value_t>(i));
    names.push_back(text::upper(name ? name : std::to_string(i)));
    cap_free(name);
  }
  return names.empty() ? "none" : text::join(names, ",");
}

bool drop_bounding(Set keep, int last, ChildFailure* f) noexcept {
  for (int cap = 0; cap <= last; ++cap) {
    if (keep & (Set{1} << cap)) continue;
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 && errno != EINVAL)
      return child::fail(f, errno, "drop capability from the bounding set");
  }
  if (::prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0) return child::fail(f, errno, "PR_SET_KEEPCAPS");
  return true;
}

bool add_inheritable(Set set, ChildFailure* f) noexcept {
  if (!set) return true;
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return child::fail(f, errno, "capget");
  for (int i = 0; i < 2; ++i) data[i].inheritable |= static_cast<uint32_t>(set >> (32 * i));
  if (::syscall(SYS_capset, &header, data) != 0) return child::fail(f, errno, "capset");
  return true;
}

bool set_final(Set keep, int last, ChildFailure* f) noexcept {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  for (int i = 0; i < 2; ++i) {
    auto word = static_cast<uint32_t>(keep >> (32 * i));
    data[i].permitted = data[i].effective = data[i].inheritable = word;
  }
  if (::syscall(SYS_capset, &header, data) != 0) return child::fail(f, errno, "capset");
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
    return child::fail(f, errno, "clear ambient capabilities");
  for (int cap = 0; cap <= last; ++cap)
    if ((keep & (Set{1} << cap)) && ::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0)
      return child::fail(f, errno, "raise ambient capability");
  if (::prctl(PR_SET_KEEPCAPS, 0, 0, 0, 0) != 0) return child::fail(f, errno, "PR_SET_KEEPCAPS");
  return true;
}

}  // namespace openshell::runtime::caps
