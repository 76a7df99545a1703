#include "runtime/gpu.h"

#include <dirent.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"
#include "runtime/cdi.h"

namespace openshell::runtime::gpu {

namespace {

// The names openshell's own /dev holds (namespaces/kernel_paths.cc): a GPU
// node may not take one.
const char* const kOwnDevNames[] = {"null", "zero", "full", "random", "urandom", "tty",   "pts",
                                    "shm",  "ptmx", "fd",   "stdin",  "stdout",  "stderr"};

// The driver's user-space libraries, by the start of their names, as the
// NVIDIA Container Toolkit's list has them (compute and utility).
const char* const kLibraryPrefixes[] = {"libcuda.so",
                                        "libcudadebugger.so",
                                        "libnvidia-ml.so",
                                        "libnvidia-ptxjitcompiler.so",
                                        "libnvidia-nvvm.so",
                                        "libnvidia-gpucomp.so",
                                        "libnvidia-allocator.so",
                                        "libnvidia-cfg.so",
                                        "libnvidia-opencl.so",
                                        "libnvidia-pkcs11.so",
                                        "libnvcuvid.so",
                                        "libnvidia-encode.so",
                                        "libnvidia-opticalflow.so",
                                        "libnvidia-fatbinaryloader.so",
                                        "libnvidia-compiler.so"};

// Where libraries usually are, when ld.so.cache does not say.
const char* const kLibraryDirs[] = {"/usr/lib/x86_64-linux-gnu",
                                    "/usr/lib/aarch64-linux-gnu",
                                    "/usr/lib64",
                                    "/usr/lib",
                                    "/lib64",
                                    "/lib/x86_64-linux-gnu",
                                    "/usr/local/nvidia/lib64",
                                    "/usr/lib/nvidia"};

const char* const kBinaries[] = {"/usr/bin/nvidia-smi", "/usr/bin/nvidia-debugdump"};

// The control nodes every GPU needs, below /dev.
const char* const kControlNodes[] = {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools",
                                     "nvidia-modeset"};

std::string under_root(const std::string& root, const std::string& path) {
  return root == "/" ? path : root + path;
}

bool is_library(const std::string& name) {
  for (const char* prefix : kLibraryPrefixes)
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

// "nvidia12" -> 12; nullopt for any other name.
std::optional<unsigned> gpu_index(const std::string& name) {
  if (name.rfind("nvidia", 0) != 0) return std::nullopt;
  const std::string_view digits = std::string_view(name).substr(6);
  if (digits.empty() || digits.size() > 6 || (digits.size() > 1 && digits[0] == '0'))
    return std::nullopt;
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return std::nullopt;
  return static_cast<unsigned>(std::stoul(std::string(digits)));
}

std::vector<std::string> directory_names(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d))
    if (e->d_name[0] != '.') out.push_back(e->d_name);
  ::closedir(d);
  std::sort(out.begin(), out.end());
  return out;
}

// Gathers the plan, without repeats: a node or a mount at a path already
// given is given once; the groups that may open a node are noted.
class Builder {
 public:
  explicit Builder(Plan* plan) : plan_(plan) {}

  // `shown` names where the node came from, for messages.
  void node(const std::string& host_path, const std::string& path, char want_type,
            std::optional<int64_t> want_major, std::optional<int64_t> want_minor,
            const std::string& access, const std::string& shown) {
    const std::string inside = text::normalize_path(path);
    if (inside.rfind("/dev/", 0) != 0 || inside.size() == 5)
      throw Error(shown + ": " + path + ": only device nodes below /dev are supported");
    const std::string first = inside.substr(5, inside.find('/', 5) - 5);
    for (const char* own : kOwnDevNames)
      if (first == own) throw Error(shown + ": " + path + ": openshell's own /dev has it");
    if (!paths_.insert(inside).second) return;
    struct stat st;
    if (::stat(host_path.c_str(), &st) != 0)
      throw Error(errno_message(shown + ": the device node " + host_path, errno));
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode))
      throw Error(shown + ": " + host_path + ": not a device node");
    Node n;
    n.host_path = files::canonical(host_path, shown);
    n.path = inside;
    n.type = S_ISCHR(st.st_mode) ? 'c' : 'b';
    n.major = major(st.st_rdev);
    n.minor = minor(st.st_rdev);
    if (want_type && want_type != n.type)
      throw Error(shown + ": " + host_path + ": type " + want_type + " given, the node is " +
                  n.type);
    if ((want_major && *want_major != n.major) || (want_minor && *want_minor != n.minor))
      throw Error(shown + ": " + host_path + ": " + std::to_string(want_major.value_or(n.major)) +
                  ":" + std::to_string(want_minor.value_or(n.minor)) + " given, the node is " +
                  std::to_string(n.major) + ":" + std::to_string(n.minor));
    n.access = access.empty() ? "rwm" : access;
    n.gid = st.st_gid;
    n.mode = st.st_mode & 07777;
    // Its group may open it and others may not: the sandbox's user needs
    // the group (root's group is never handed on).
    if (n.gid != 0 && (n.mode & 060) && (n.mode & 06) != 06) group(n.gid);
    plan_->nodes.push_back(std::move(n));
  }

  void mount(const std::string& host_path, const std::string& path, bool read_only,
             const std::string& shown) {
    const std::string inside = text::normalize_path(path);
    if (!mount_paths_.insert(inside).second) return;
    struct stat st;
    if (::stat(host_path.c_str(), &st) != 0)
      throw Error(errno_message(shown + ": " + host_path, errno));
    plan_->mounts.push_back({host_path, inside, read_only});
  }

  void group(uint32_t gid) {
    if (std::find(plan_->groups.begin(), plan_->groups.end(), gid) == plan_->groups.end())
      plan_->groups.push_back(gid);
  }

  void hook(const Hook& h) {
    for (const Hook& have : plan_->hooks)
      if (have.stage == h.stage && have.path == h.path && have.args == h.args) return;
    plan_->hooks.push_back(h);
  }

 private:
  Plan* plan_;
  std::set<std::string> paths_, mount_paths_;
};

void apply_edits(const cdi::Edits& edits, const std::string& shown, Builder* b, Plan* plan) {
  for (const auto& e : edits.env) plan->env.push_back(e);
  for (const auto& n : edits.device_nodes)
    b->node(n.host_path.empty() ? n.path : n.host_path, n.path, n.type == 'p' ? 0 : n.type, n.major,
            n.minor, n.permissions, shown);
  for (const auto& m : edits.mounts) {
    // Read-only unless the spec asks for rw: a sandbox never writes the
    // host's driver files by default.
    const bool rw = std::find(m.options.begin(), m.options.end(), "rw") != m.options.end() &&
                    std::find(m.options.begin(), m.options.end(), "ro") == m.options.end();
    b->mount(m.host_path, m.container_path, !rw, shown);
  }
  for (const auto& h : edits.hooks) b->hook(h);
  for (uint32_t gid : edits.additional_gids) b->group(gid);
}

bool is_index(const std::string& name) {
  return !name.empty() && name.size() < 6 &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         (name.size() == 1 || name[0] != '0');
}

Plan from_cdi(const Request& request, const std::vector<cdi::Spec>& specs) {
  Plan plan;
  Builder b(&plan);
  // Which device of which spec: the highest-priority spec naming it.
  std::vector<std::pair<const cdi::Spec*, const cdi::Device*>> chosen;
  auto find = [&](const std::string& name) -> std::pair<const cdi::Spec*, const cdi::Device*> {
    for (const auto& spec : specs)
      if (const cdi::Device* d = spec.find(name)) return {&spec, d};
    return {nullptr, nullptr};
  };
  std::vector<std::string> files;
  for (const auto& spec : specs) files.push_back(spec.file);
  if (request.all) {
    if (auto all = find("all"); all.first) {
      chosen.push_back(all);
    } else {
      std::set<unsigned> indexes;
      for (const auto& spec : specs)
        for (const auto& d : spec.devices)
          if (is_index(d.name)) indexes.insert(static_cast<unsigned>(std::stoul(d.name)));
      for (unsigned i : indexes) chosen.push_back(find(std::to_string(i)));
    }
    if (chosen.empty())
      throw Error("--gpu all: the CDI specs of " + std::string(kKind) + " (" +
                  text::join(files, ", ") + ") name no device 'all' and no GPU by index");
  } else {
    for (unsigned i = 0; i < request.count; ++i) {
      auto found = find(std::to_string(i));
      if (!found.first) {
        std::vector<std::string> have;
        for (const auto& spec : specs)
          for (const auto& d : spec.devices)
            if (is_index(d.name)) have.push_back(d.name);
        throw Error("--gpu " + request.text() + ": the CDI specs of " + kKind + " (" +
                    text::join(files, ", ") + ") name " +
                    (have.empty() ? std::string("no GPU by index")
                                  : "GPUs " + text::join(have, ", ") + " only"));
      }
      chosen.push_back(found);
    }
  }
  // Each spec's own edits once, before its devices'.
  std::vector<const cdi::Spec*> used;
  for (const auto& [spec, device] : chosen)
    if (std::find(used.begin(), used.end(), spec) == used.end()) {
      used.push_back(spec);
      apply_edits(spec->edits, spec->file + ": containerEdits", &b, &plan);
    }
  for (const auto& [spec, device] : chosen) {
    apply_edits(device->edits, spec->file + ": device " + device->name, &b, &plan);
    plan.devices.push_back(std::string(kKind) + "=" + device->name);
  }
  std::vector<std::string> used_files;
  for (const auto* spec : used) used_files.push_back(spec->file);
  plan.source = "CDI spec " + text::join(used_files, ", ");
  return plan;
}

Plan from_discovery(const Request& request, const Host& host) {
  Plan plan;
  Builder b(&plan);
  const std::string dev = under_root(host.root, "/dev");
  std::map<unsigned, std::string> gpus;
  for (const auto& name : directory_names(dev))
    if (auto index = gpu_index(name)) gpus[*index] = name;
  const std::string shown = "--gpu " + request.text();
  if (gpus.empty())
    throw Error(shown + ": no NVIDIA GPU here: no CDI spec of kind " + kKind + " in " +
                text::join(host.cdi_dirs, ", ") + " and no " + dev + "/nvidia0 (see docs/gpu.md)");
  if (!request.all && request.count > gpus.size())
    throw Error(shown + ": this host has " + std::to_string(gpus.size()) + " NVIDIA GPU" +
                (gpus.size() == 1 ? "" : "s") + " (" + dev + "/nvidia*)");
  unsigned taken = 0;
  for (const auto& [index, name] : gpus) {
    if (!request.all && taken == request.count) break;
    b.node(dev + "/" + name, "/dev/" + name, 'c', std::nullopt, std::nullopt, "rw", shown);
    plan.devices.push_back("/dev/" + name);
    ++taken;
  }
  for (const char* name : kControlNodes)
    if (files::exists(dev + "/" + name))
      b.node(dev + "/" + name, std::string("/dev/") + name, 'c', std::nullopt, std::nullopt, "rw",
             shown);
  for (const auto& name : directory_names(dev + "/nvidia-caps"))
    b.node(dev + "/nvidia-caps/" + name, "/dev/nvidia-caps/" + name, 'c', std::nullopt,
           std::nullopt, "rw", shown);

  // The libraries: where ld.so.cache says, then the usual directories.
  std::vector<std::string> libraries;
  if (auto cache = files::try_read(under_root(host.root, "/etc/ld.so.cache")))
    for (const auto& path : ld_cache_paths(*cache)) {
      const std::string name = path.substr(path.rfind('/') + 1);
      if (is_library(name)) libraries.push_back(path);
    }
  for (const char* dir : kLibraryDirs)
    for (const auto& name : directory_names(under_root(host.root, dir)))
      if (is_library(name)) libraries.push_back(std::string(dir) + "/" + name);
  for (const auto& path : libraries)
    if (files::exists(under_root(host.root, path)))
      b.mount(under_root(host.root, path), path, true, shown);
  for (const char* binary : kBinaries)
    if (files::exists(under_root(host.root, binary)))
      b.mount(under_root(host.root, binary), binary, true, shown);
  plan.source = "discovery under " + host.root;
  return plan;
}

}  // namespace

std::optional<Request> parse_request(const std::string& value) {
  if (value.empty()) return std::nullopt;
  if (value == "all") return Request{};
  auto n = text::parse_uint(value, 1024);
  if (!n || *n == 0)
    throw Error("--gpu " + value + ": expected a number of GPUs (1 to 1024) or 'all'");
  return Request{false, static_cast<unsigned>(*n)};
}

Host Host::from_environment() {
  Host host;
  if (const char* dirs = std::getenv(kCdiDirsVariable)) {
    host.cdi_dirs.clear();
    for (const auto& dir : text::split(dirs, ':'))
      if (!dir.empty()) host.cdi_dirs.push_back(dir);
  }
  if (const char* root = std::getenv(kRootVariable); root && *root) {
    if (root[0] != '/') throw Error(std::string(kRootVariable) + "=" + root + ": not absolute");
    host.root = text::normalize_path(root);
  }
  return host;
}

Plan plan(const Request& request, const Host& host) {
  std::vector<std::string> skipped;
  std::vector<cdi::Spec> specs = cdi::load_kind(host.cdi_dirs, kKind, &skipped);
  for (const auto& why : skipped) log::warn("CDI spec skipped: " + why);
  Plan plan = specs.empty() ? from_discovery(request, host) : from_cdi(request, specs);
  log::debug("--gpu " + request.text() + ": " + plan.source + ": " +
             text::join(plan.devices, ", ") + "; " + std::to_string(plan.nodes.size()) +
             " nodes, " + std::to_string(plan.mounts.size()) + " mounts, " +
             std::to_string(plan.hooks.size()) + " hooks");
  return plan;
}

std::vector<std::string> ld_cache_paths(std::string_view cache) {
  // glibc's new format: "glibc-ld.so.cache1.1", after the old format's
  // entries or at the start. Its string offsets are from its own start.
  static constexpr std::string_view kMagic = "glibc-ld.so.cache1.1";
  std::vector<std::string> out;
  const size_t start = cache.find(kMagic);
  if (start == std::string_view::npos) return out;
  const std::string_view data = cache.substr(start);
  constexpr size_t kHeader = 48, kEntry = 24;
  if (data.size() < kHeader) return out;
  auto u32 = [&](size_t at) {
    uint32_t v;
    std::memcpy(&v, data.data() + at, 4);
    return v;
  };
  const uint32_t count = u32(20);
  if (count > (data.size() - kHeader) / kEntry) return out;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t value = u32(kHeader + i * kEntry + 8);
    if (value >= data.size()) continue;
    const size_t end = data.find('\0', value);
    if (end == std::string_view::npos) continue;
    std::string path(data.substr(value, end - value));
    if (!path.empty() && path[0] == '/' && path.size() < 4096) out.push_back(std::move(path));
  }
  return out;
}

}  // namespace openshell::runtime::gpu
