#include "cli/doctor.h"

#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/files.h"
#include "base/paths.h"
#include "base/text.h"
#include "cli/base_image.h"
#include "cli/gateway_client.h"
#include "cli/gateway_registry.h"
#include "cli/images.h"
#include "image/store.h"
#include "namespaces/userns.h"
#include "runtime/host_ids.h"
#include "runtime/landlock.h"

namespace openshell::cli::doctor {

namespace fs = std::filesystem;

namespace {

Check make(std::string name, bool required) {
  Check c;
  c.name = std::move(name);
  c.required = required;
  return c;
}

std::string first_line(std::optional<std::string> text) {
  if (!text) return "";
  return std::string(text::trim(text->substr(0, text->find('\n'))));
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

bool writable(const std::string& dir) { return ::access(dir.c_str(), W_OK) == 0; }

// Whether uid may make cgroups in dir: root where the file system lets it,
// anyone else where the directory is delegated to them (theirs, or open).
bool may_write(const std::string& dir, uid_t uid) {
  if (uid == 0 || uid == ::geteuid()) return writable(dir);
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) return false;
  return (st.st_uid == uid && (st.st_mode & S_IWUSR)) || (st.st_mode & S_IWOTH);
}

}  // namespace

Roots Roots::from_environment() {
  Roots r;
  r.proc = env_or("OPENSHELL_DOCTOR_PROC", "/proc");
  r.sys = env_or("OPENSHELL_DOCTOR_SYS", "/sys");
  r.etc = env_or("OPENSHELL_DOCTOR_ETC", "/etc");
  r.dev = env_or("OPENSHELL_DOCTOR_DEV", "/dev");
  r.path = env_or("PATH", "");
  r.uid = ::geteuid();
  r.user = namespaces::current_identity().user_name;
  return r;
}

Check kernel_check(std::string_view release) {
  Check c = make("kernel", true);
  unsigned major = 0, minor = 0;
  std::sscanf(std::string(release).c_str(), "%u.%u", &major, &minor);
  c.detail = "Linux " + std::string(release);
  // 5.11: overlayfs in a user namespace; 5.13: Landlock.
  c.ok = major > 5 || (major == 5 && minor >= 11);
  if (!c.ok) c.fix = "openshell needs Linux 5.11 or later (5.13 for Landlock): upgrade the kernel";
  return c;
}

Check userns_check(std::optional<std::string> max_user_namespaces,
                   std::optional<std::string> unprivileged_clone,
                   std::optional<std::string> apparmor_restrict, uid_t uid) {
  Check c = make("user namespaces", true);
  const std::string max = first_line(max_user_namespaces);
  if (max.empty() || max == "0") {
    c.detail = max.empty() ? "the kernel has no user namespaces (no user/max_user_namespaces)"
                           : "user.max_user_namespaces is 0";
    c.fix = "sysctl -w user.max_user_namespaces=15000 (a kernel with CONFIG_USER_NS)";
    return c;
  }
  if (uid != 0 && first_line(unprivileged_clone) == "0") {
    c.detail = "kernel.unprivileged_userns_clone is 0: ordinary users may not make them";
    c.fix = "sysctl -w kernel.unprivileged_userns_clone=1, or run the gateway as root";
    return c;
  }
  if (uid != 0 && first_line(apparmor_restrict) == "1") {
    c.detail =
        "kernel.apparmor_restrict_unprivileged_userns is 1: AppArmor denies them to ordinary users";
    c.fix =
        "sysctl -w kernel.apparmor_restrict_unprivileged_userns=0, or an AppArmor profile for "
        "openshell with 'userns,'";
    return c;
  }
  c.ok = true;
  c.detail = "available (at most " + max + ")";
  return c;
}

Check subid_check(std::string_view file, std::optional<std::string> text, const std::string& user,
                  uid_t uid) {
  const std::string base = fs::path(std::string(file)).filename();
  Check c = make(base + " range", false);
  if (uid == 0) {
    c.ok = true;
    c.detail = "root: each sandbox gets a range of its own";
    return c;
  }
  auto range = text ? namespaces::find_subordinate(*text, user, uid) : std::nullopt;
  if (range && range->count >= namespaces::kRangeSize) {
    c.ok = true;
    c.detail =
        user + ": " + std::to_string(range->start) + ", " + std::to_string(range->count) + " ids";
    return c;
  }
  c.detail = !text   ? std::string(file) + " cannot be read"
             : range ? user + " has only " + std::to_string(range->count) + " ids in " +
                           std::string(file) + " (65536 needed)"
                     : "no entry for " + user + " in " + std::string(file);
  c.fix = std::string("usermod --add-") + (base == "subgid" ? "subgids" : "subuids") +
          " 100000-165535 " + user + " (without it a sandbox holds your id alone)";
  return c;
}

Check idmap_helper_check(const std::string& program, const std::string& found,
                         std::optional<unsigned> mode, bool has_caps, uid_t uid) {
  Check c = make(program, false);
  if (uid == 0) {
    c.ok = true;
    c.detail = "root writes the id maps itself";
    return c;
  }
  if (found.empty() || !mode) {
    c.detail = "not on PATH";
    c.fix = "apt-get install uidmap (without it a sandbox holds your id alone)";
    return c;
  }
  if (!(*mode & S_ISUID) && !has_caps) {
    c.detail = found + " is neither setuid nor has file capabilities";
    c.fix = "chmod u+s " + found + " (as root), or reinstall uidmap";
    return c;
  }
  c.ok = true;
  c.detail = found + ((*mode & S_ISUID) ? " (setuid)" : " (file capabilities)");
  return c;
}

Check cgroup_check(const std::string& root, std::string_view proc_self_cgroup, uid_t uid) {
  Check c = make("cgroups", false);
  std::string layout, unified;
  if (files::exists(root + "/cgroup.controllers")) {
    layout = "v2";
    unified = root;
  } else if (files::exists(root + "/unified/cgroup.controllers")) {
    layout = "hybrid";
    unified = root + "/unified";
  } else if (files::is_directory(root + "/memory") || files::is_directory(root + "/pids")) {
    layout = "v1";
  } else {
    c.detail = "no cgroup file system at " + root;
    c.fix = "mount cgroup2 on " + root + " (limits --memory, --cpus, --pids are not enforced)";
    return c;
  }
  std::string v2_path;
  std::map<std::string, std::string> v1;  // controller -> its hierarchy's folder + path
  for (const auto& line : text::split(proc_self_cgroup, '\n')) {
    auto fields = text::split(line, ':');
    if (fields.size() < 3) continue;
    std::string path = line.substr(fields[0].size() + fields[1].size() + 2);
    if (fields[1].empty()) {
      v2_path = path;
      continue;
    }
    for (const auto& ctrl : text::split(fields[1], ','))
      if (!ctrl.starts_with("name=")) v1[ctrl] = root + "/" + fields[1] + path;
  }
  std::vector<std::string> usable, missing;
  const std::string v2_dir = unified.empty() ? "" : unified + v2_path;
  const auto v2_controllers =
      v2_dir.empty()
          ? std::vector<std::string>{}
          : text::split(first_line(files::try_read(v2_dir + "/cgroup.controllers")), ' ');
  for (const std::string ctrl : {"memory", "pids", "cpu"}) {
    bool in_v2 = false;
    for (const auto& have : v2_controllers) in_v2 = in_v2 || have == ctrl;
    if (in_v2 && may_write(v2_dir, uid)) {
      usable.push_back(ctrl + " (v2)");
    } else if (auto it = v1.find(ctrl);
               it != v1.end() && files::is_directory(it->second) && may_write(it->second, uid)) {
      usable.push_back(ctrl + " (v1)");
    } else {
      missing.push_back(ctrl);
    }
  }
  c.detail = layout + "; usable: " + (usable.empty() ? "none" : text::join(usable, ", "));
  c.ok = missing.empty();
  if (!c.ok) {
    c.detail += "; not delegated to you: " + text::join(missing, ", ");
    c.fix = uid == 0 ? "mount the missing controllers' hierarchies (their limits are not enforced)"
                     : "run under a delegated cgroup (systemd-run --user --scope -p Delegate=yes "
                       "openshell ...), or a root gateway; without it those limits are not "
                       "enforced";
  }
  return c;
}

Check landlock_check(int abi) {
  Check c = make("landlock", false);
  c.ok = abi > 0;
  c.detail = c.ok ? "ABI " + std::to_string(abi) : "unavailable";
  if (!c.ok)
    c.fix =
        "a kernel with CONFIG_SECURITY_LANDLOCK and landlock in its lsm= list (file rules "
        "then rest on mounts alone)";
  return c;
}

Check seccomp_check(std::optional<std::string> status) {
  Check c = make("seccomp", true);
  c.ok = status && status->find("\nSeccomp:") != std::string::npos;
  c.detail = c.ok ? "filters available" : "the kernel has no seccomp (no Seccomp: in status)";
  if (!c.ok) c.fix = "a kernel with CONFIG_SECCOMP_FILTER";
  return c;
}

Check overlay_check(const std::string& problem) {
  Check c = make("overlayfs", false);
  c.ok = problem.empty();
  c.detail = c.ok ? "stacks a sandbox's root here" : problem;
  if (!c.ok) c.fix = "Linux 5.11 or later, with overlay loaded (sandboxes then copy their image)";
  return c;
}

Check micro_vm_check(const std::string& kvm_problem, const vm_host::KernelChoice& kernel,
                     const std::string& kernel_problem, std::optional<std::string> cpuinfo) {
  Check c = make("micro-VMs", false);
  std::vector<std::string> problems, found;
  if (!kvm_problem.empty()) {
    problems.push_back(kvm_problem);
    c.fix = kvm_problem.find("No such file") != std::string::npos
                ? "enable virtualization, modprobe kvm"
                : "usermod -aG kvm $USER (or run the gateway as root)";
  } else {
    found.push_back("/dev/kvm read and write");
  }
  if (!kernel_problem.empty()) {
    problems.push_back("no guest kernel at " + kernel.path + " (" + kernel.source + ": " +
                       kernel_problem + ")");
    if (c.fix.empty())
      c.fix = "rootfs-tools/build-guest-kernel, then --vm-kernel PATH or OPENSHELL_VM_KERNEL";
  } else {
    found.push_back("guest kernel " + kernel.path + " (" + kernel.source + ")");
  }
  // KVM without the hardware's virtualisation is PVM's: it runs its own
  // guests, not a stock Linux one (docs/vm.md).
  bool hardware = false;
  for (const auto& line : text::split(cpuinfo.value_or(""), '\n')) {
    if (!line.starts_with("flags")) continue;
    for (const auto& flag : text::split(line, ' '))
      hardware = hardware || flag == "vmx" || flag == "svm";
  }
  if (cpuinfo && !hardware) {
    problems.push_back(
        "no vmx or svm in /proc/cpuinfo: KVM here is paravirtualised (PVM), and Linux guests "
        "do not boot on paravirtualised KVM");
    if (c.fix.empty()) c.fix = "run --vm sandboxes on hardware with VT-x or AMD-V";
  }
  c.ok = problems.empty();
  c.detail = text::join(c.ok ? found : problems, "; ");
  if (!c.ok) c.fix = "only --vm sandboxes need it: " + c.fix;
  return c;
}

Check directory_check(const std::string& what, const std::string& dir) {
  Check c = make(what, true);
  std::string existing = dir;
  while (!existing.empty() && !files::exists(existing))
    existing = fs::path(existing).parent_path().string();
  if (existing.empty()) existing = "/";
  c.ok = files::is_directory(existing) && writable(existing);
  c.detail = existing == dir ? dir : dir + " (made on first use, in " + existing + ")";
  if (!c.ok) {
    c.detail = existing + " is not a directory you may write (" + dir + ")";
    c.fix = "give yourself " + dir + ", or set OPENSHELL_HOME to a directory of yours";
  }
  return c;
}

namespace {

Check helper_on_path(const Roots& r, const std::string& program) {
  const std::string found = base_image::find_on_path(r.path, program);
  std::optional<unsigned> mode;
  bool caps = false;
  struct stat st {};
  if (!found.empty() && ::stat(found.c_str(), &st) == 0) {
    mode = st.st_mode;
    caps = ::getxattr(found.c_str(), "security.capability", nullptr, 0) > 0;
  }
  return idmap_helper_check(program, found, mode, caps, r.uid);
}

Check overlay_here(const Paths& paths) {
  std::string base = files::is_directory(paths.state_dir) ? paths.state_dir : "/tmp";
  std::string dir = base + "/doctor.XXXXXX";
  if (!::mkdtemp(dir.data())) return overlay_check("cannot make a scratch directory in " + base);
  std::string problem;
  try {
    fs::create_directories(dir + "/lower");
    fs::create_directories(dir + "/scratch");
    files::write_atomically(dir + "/lower/file", "x", 0644);
    problem = runtime::overlay_problem({dir + "/lower"}, dir + "/scratch");
  } catch (const std::exception& e) {
    problem = e.what();
  }
  std::error_code ec;
  fs::remove_all(dir, ec);
  return overlay_check(problem);
}

Check gateway_here() {
  Check c = make("gateway", true);
  GatewayChoice choice = chosen_gateway();
  try {
    GatewayClient client(choice, false);
    GatewayProbe probe = probe_gateway(client);
    c.ok = true;
    c.detail = choice.describe() + " answers (openshell " + probe.version + ")";
  } catch (const Error& e) {
    if (choice.local_default()) {
      c.ok = true;
      c.detail = choice.describe() + " is not running: the first command starts it";
    } else {
      c.detail = choice.describe() + ": " + e.what();
      c.fix =
          "start it ('openshell gateway run'), give its credentials ('openshell gateway add'), "
          "or choose another with -g";
    }
  }
  return c;
}

Check image_here() {
  Check c = make("default image", true);
  if (GatewayChoice choice = chosen_gateway(); choice.remote()) {
    c.ok = true;
    c.detail = choice.describe() + " is remote: its host keeps the images (run doctor there)";
    return c;
  }
  try {
    const std::string dir = chosen_images_dir();
    if (image::Store(dir).find("base")) {
      c.ok = true;
      c.detail = "base is in the store";
      return c;
    }
    base_image::Plan plan = base_image::plan(base_image::this_host(""));
    c.ok = plan.ok();
    c.detail = c.ok ? "base is missing; the first sandbox create builds it (" + plan.tool +
                          " from " + plan.mirror + ")"
                    : plan.problem;
  } catch (const Error& e) {
    c.detail = e.what();
    c.ok = false;
  }
  return c;
}

}  // namespace

std::vector<Check> run_all(const Roots& r) {
  std::vector<Check> checks;
  struct utsname u {};
  ::uname(&u);
  checks.push_back(
      kernel_check(first_line(files::try_read(r.proc + "/sys/kernel/osrelease")).empty()
                       ? std::string(u.release)
                       : first_line(files::try_read(r.proc + "/sys/kernel/osrelease"))));
  checks.push_back(userns_check(
      files::try_read(r.proc + "/sys/user/max_user_namespaces"),
      files::try_read(r.proc + "/sys/kernel/unprivileged_userns_clone"),
      files::try_read(r.proc + "/sys/kernel/apparmor_restrict_unprivileged_userns"), r.uid));
  checks.push_back(
      subid_check(r.etc + "/subuid", files::try_read(r.etc + "/subuid"), r.user, r.uid));
  checks.push_back(
      subid_check(r.etc + "/subgid", files::try_read(r.etc + "/subgid"), r.user, r.uid));
  checks.push_back(helper_on_path(r, "newuidmap"));
  checks.push_back(helper_on_path(r, "newgidmap"));
  checks.push_back(cgroup_check(r.sys + "/fs/cgroup",
                                files::try_read(r.proc + "/self/cgroup").value_or(""), r.uid));
  checks.push_back(landlock_check(runtime::landlock::abi_version()));
  checks.push_back(seccomp_check(files::try_read(r.proc + "/self/status")));
  Paths paths = Paths::resolve();
  checks.push_back(overlay_here(paths));
  // The kernel `sandbox create --vm` would pick without --vm-kernel.
  const auto kernel = vm_host::choose_kernel("", std::getenv(vm_host::kKernelVariable));
  checks.push_back(micro_vm_check(vm_host::kvm_problem(r.dev + "/kvm"), kernel,
                                  vm_host::kernel_problem(kernel.path),
                                  files::try_read(r.proc + "/cpuinfo")));
  checks.push_back(directory_check("state directory", paths.state_dir));
  checks.push_back(directory_check("runtime directory", paths.run_dir));
  checks.push_back(gateway_here());
  checks.push_back(image_here());
  return checks;
}

std::string format_line(const Check& c) {
  std::string line = std::string(c.ok ? "✓ " : "✗ ") + c.name + ": " + c.detail;
  if (!c.ok && !c.fix.empty()) line += "; fix: " + c.fix;
  if (!c.ok && !c.required) line += " (optional)";
  return line;
}

std::string to_json(const std::vector<Check>& checks) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& c : checks)
    out.push_back({{"name", c.name},
                   {"ok", c.ok},
                   {"required", c.required},
                   {"detail", c.detail},
                   {"fix", c.fix}});
  return nlohmann::json{{"ok", all_required_ok(checks)}, {"checks", out}}.dump(2);
}

bool all_required_ok(const std::vector<Check>& checks) {
  for (const auto& c : checks)
    if (c.required && !c.ok) return false;
  return true;
}

}  // namespace openshell::cli::doctor
