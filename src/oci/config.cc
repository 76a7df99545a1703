#include "oci/config.h"

#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <set>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"
#include "namespaces/userns.h"
#include "runtime/caps.h"
#include "runtime/landlock.h"
#include "spec/container_spec.h"

namespace openshell::oci {

namespace {

using nlohmann::json;

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
  throw Error("config.json: " + field + ": " + why);
}

const json* member(const json& object, const char* key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

const json& object_at(const json& v, const std::string& field) {
  if (!v.is_object()) refuse(field, "must be an object, not " + v.dump());
  return v;
}

const json& array_at(const json& v, const std::string& field) {
  if (!v.is_array()) refuse(field, "must be an array, not " + v.dump());
  return v;
}

std::string string_at(const json& v, const std::string& field) {
  if (!v.is_string()) refuse(field, "must be a string, not " + v.dump());
  return v.get<std::string>();
}

std::vector<std::string> strings_at(const json& v, const std::string& field) {
  std::vector<std::string> out;
  array_at(v, field);
  for (size_t i = 0; i < v.size(); ++i)
    out.push_back(string_at(v[i], field + "[" + std::to_string(i) + "]"));
  return out;
}

uint64_t unsigned_at(const json& v, const std::string& field, uint64_t largest = UINT64_MAX) {
  // A positive number is unsigned when parsed, signed when built in code.
  const bool non_negative =
      v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
  if (!non_negative || v.get<uint64_t>() > largest)
    refuse(field, "must be an integer from 0 to " + std::to_string(largest) + ", not " + v.dump());
  return v.get<uint64_t>();
}

int64_t signed_at(const json& v, const std::string& field) {
  if (!v.is_number_integer()) refuse(field, "must be an integer, not " + v.dump());
  return v.get<int64_t>();
}

bool bool_at(const json& v, const std::string& field) {
  if (!v.is_boolean()) refuse(field, "must be true or false, not " + v.dump());
  return v.get<bool>();
}

std::string item(const std::string& field, size_t i) {
  return field + "[" + std::to_string(i) + "]";
}

bool absolute_clean(const std::string& path) {
  if (path.empty() || path[0] != '/') return false;
  for (const auto& part : text::split(path, '/'))
    if (part == "..") return false;
  return true;
}

std::string in_bundle(const std::string& dir, const std::string& path) {
  return !path.empty() && path[0] == '/' ? path : dir + "/" + path;
}

// --- process ---------------------------------------------------------------

struct RlimitName {
  const char* name;
  int resource;
};
constexpr RlimitName kRlimits[] = {
    {"RLIMIT_AS", RLIMIT_AS},
    {"RLIMIT_CORE", RLIMIT_CORE},
    {"RLIMIT_CPU", RLIMIT_CPU},
    {"RLIMIT_DATA", RLIMIT_DATA},
    {"RLIMIT_FSIZE", RLIMIT_FSIZE},
    {"RLIMIT_LOCKS", RLIMIT_LOCKS},
    {"RLIMIT_MEMLOCK", RLIMIT_MEMLOCK},
    {"RLIMIT_MSGQUEUE", RLIMIT_MSGQUEUE},
    {"RLIMIT_NICE", RLIMIT_NICE},
    {"RLIMIT_NOFILE", RLIMIT_NOFILE},
    {"RLIMIT_NPROC", RLIMIT_NPROC},
    {"RLIMIT_RSS", RLIMIT_RSS},
    {"RLIMIT_RTPRIO", RLIMIT_RTPRIO},
    {"RLIMIT_RTTIME", RLIMIT_RTTIME},
    {"RLIMIT_SIGPENDING", RLIMIT_SIGPENDING},
    {"RLIMIT_STACK", RLIMIT_STACK},
};

runtime::caps::Set cap_set(const json& caps, const char* key, const std::string& field) {
  const json* v = member(caps, key);
  if (!v) return 0;
  auto names = strings_at(*v, field + "." + key);
  // A name this kernel (or openshell) does not know is skipped, as runc does
  // for capabilities newer than the host.
  runtime::caps::Set set = 0;
  for (const auto& name : names) {
    try {
      set |= runtime::caps::parse({name});
    } catch (const Error&) {
      log::debug(field + "." + key + ": " + name + " is unknown here: skipped");
    }
  }
  return set;
}

void read_process(const json& p, Bundle* b) {
  const std::string f = "process";
  object_at(p, f);
  runtime::ContainerSpec& s = b->spec;
  runtime::ExecRequest& r = b->process;
  r.main = true;
  if (const json* v = member(p, "terminal")) b->terminal = bool_at(*v, f + ".terminal");
  r.tty = b->terminal;
  s.tty = b->terminal;
  if (const json* v = member(p, "consoleSize")) {
    object_at(*v, f + ".consoleSize");
    if (const json* h = member(*v, "height"))
      s.tty_rows = static_cast<unsigned short>(unsigned_at(*h, f + ".consoleSize.height", 65535));
    if (const json* w = member(*v, "width"))
      s.tty_cols = static_cast<unsigned short>(unsigned_at(*w, f + ".consoleSize.width", 65535));
    r.rows = s.tty_rows;
    r.cols = s.tty_cols;
  }
  const json* args = member(p, "args");
  if (!args) refuse(f + ".args", "is required (the command to run)");
  r.argv = strings_at(*args, f + ".args");
  if (r.argv.empty() || r.argv[0].empty()) refuse(f + ".args", "must name a command (it is empty)");
  if (member(p, "commandLine")) refuse(f + ".commandLine", "is for Windows");
  if (const json* v = member(p, "env")) r.env = strings_at(*v, f + ".env");
  for (size_t i = 0; i < r.env.size(); ++i)
    if (r.env[i].find('=') == std::string::npos || r.env[i][0] == '=')
      refuse(item(f + ".env", i), "\"" + r.env[i] + "\" is not KEY=VALUE");
  s.env = r.env;
  const json* cwd = member(p, "cwd");
  if (!cwd) refuse(f + ".cwd", "is required");
  r.workdir = string_at(*cwd, f + ".cwd");
  if (!absolute_clean(r.workdir))
    refuse(f + ".cwd", "\"" + r.workdir + "\" must be an absolute path without \"..\"");
  s.fs.workdir = r.workdir;

  uint32_t uid = 0, gid = 0;
  if (const json* u = member(p, "user")) {
    object_at(*u, f + ".user");
    if (const json* v = member(*u, "uid"))
      uid = static_cast<uint32_t>(unsigned_at(*v, f + ".user.uid", 0xFFFFFFFE));
    if (const json* v = member(*u, "gid"))
      gid = static_cast<uint32_t>(unsigned_at(*v, f + ".user.gid", 0xFFFFFFFE));
    if (const json* v = member(*u, "additionalGids")) {
      array_at(*v, f + ".user.additionalGids");
      for (size_t i = 0; i < v->size(); ++i)
        s.supplementary_gids.push_back(static_cast<uint32_t>(
            unsigned_at((*v)[i], item(f + ".user.additionalGids", i), 0xFFFFFFFE)));
    }
    if (const json* v = member(*u, "umask"))
      if (unsigned_at(*v, f + ".user.umask", 0777) != 022)
        refuse(f + ".user.umask", "only 0022 (18) is supported, not " + v->dump());
    if (member(*u, "username")) refuse(f + ".user.username", "is for Windows");
  }
  s.uid = uid;
  s.gid = gid;
  r.user.reset();  // the init's own ids

  // What the process holds: root keeps its permitted set (within the
  // bounding set) across exec; another user only its ambient set.
  if (const json* c = member(p, "capabilities")) {
    object_at(*c, f + ".capabilities");
    const runtime::caps::Set bounding = cap_set(*c, "bounding", f + ".capabilities");
    const runtime::caps::Set permitted = cap_set(*c, "permitted", f + ".capabilities");
    const runtime::caps::Set effective = cap_set(*c, "effective", f + ".capabilities");
    const runtime::caps::Set inheritable = cap_set(*c, "inheritable", f + ".capabilities");
    const runtime::caps::Set ambient = cap_set(*c, "ambient", f + ".capabilities");
    (void)effective;
    (void)inheritable;
    s.cap_add = uid == 0 ? (permitted & bounding) : (ambient & permitted & bounding);
  }
  if (const json* v = member(p, "rlimits")) {
    array_at(*v, f + ".rlimits");
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string rf = item(f + ".rlimits", i);
      const json& rl = object_at((*v)[i], rf);
      const json* type = member(rl, "type");
      if (!type) refuse(rf + ".type", "is required");
      const std::string name = string_at(*type, rf + ".type");
      auto it = std::find_if(std::begin(kRlimits), std::end(kRlimits),
                             [&](const RlimitName& n) { return name == n.name; });
      if (it == std::end(kRlimits))
        refuse(rf + ".type", "\"" + name + "\" is not a resource limit");
      const json* hard = member(rl, "hard");
      const json* soft = member(rl, "soft");
      if (!hard || !soft) refuse(rf, "needs both \"hard\" and \"soft\"");
      runtime::Rlimit limit{it->resource, static_cast<rlim_t>(unsigned_at(*soft, rf + ".soft")),
                            static_cast<rlim_t>(unsigned_at(*hard, rf + ".hard")), it->name};
      if (limit.soft > limit.hard) refuse(rf, "soft is above hard");
      s.rlimits.push_back(limit);
    }
  }
  // no_new_privs is always set: "noNewPrivileges": false asks for less.
  if (const json* v = member(p, "noNewPrivileges")) bool_at(*v, f + ".noNewPrivileges");
  if (const json* v = member(p, "oomScoreAdj")) {
    int64_t adj = signed_at(*v, f + ".oomScoreAdj");
    if (adj < -1000 || adj > 1000) refuse(f + ".oomScoreAdj", "must be from -1000 to 1000");
    s.oom_score_adj = static_cast<int>(adj);
  }
  for (const char* key : {"apparmorProfile", "selinuxLabel"})
    if (const json* v = member(p, key); v && !string_at(*v, f + "." + key).empty())
      log::debug(f + "." + key + ": not applied (openshell's own confinement applies)");
  if (member(p, "ioPriority")) refuse(f + ".ioPriority", "is not supported");
  if (member(p, "scheduler")) refuse(f + ".scheduler", "is not supported");
  if (member(p, "execCPUAffinity")) refuse(f + ".execCPUAffinity", "is not supported");
}

// --- mounts ----------------------------------------------------------------

// The nodes every sandbox's /dev has of its own.
const std::set<std::string> kOwnDevices = {"/dev/null",    "/dev/zero", "/dev/full", "/dev/random",
                                           "/dev/urandom", "/dev/tty",  "/dev/ptmx"};

// A bind of a host device node into /dev: how rootless Podman gives
// devices (--device, --privileged), for it can make no node. It is taken
// as a linux.devices entry is: the host's node bound into the sandbox's
// /dev as it is built (after which /dev takes no new mount point).
bool is_device_bind(const std::string& source, const std::string& target) {
  struct stat st {};
  return target.rfind("/dev/", 0) == 0 && ::stat(source.c_str(), &st) == 0 &&
         (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode));
}

struct MountOptions {
  bool read_only = false, no_exec = false, no_suid = false, no_dev = false, bind = false;
  std::vector<std::string> data;  // the file system's own (size=, mode=, ...)
};

MountOptions mount_options(const json* v, const std::string& field) {
  MountOptions o;
  if (!v) return o;
  for (const auto& opt : strings_at(*v, field)) {
    if (opt == "ro")
      o.read_only = true;
    else if (opt == "rw")
      o.read_only = false;
    else if (opt == "noexec")
      o.no_exec = true;
    else if (opt == "exec")
      o.no_exec = false;
    else if (opt == "nosuid")
      o.no_suid = true;
    else if (opt == "suid")
      o.no_suid = false;
    else if (opt == "nodev")
      o.no_dev = true;
    else if (opt == "dev")
      o.no_dev = false;
    else if (opt == "bind" || opt == "rbind")
      o.bind = true;
    else if (opt == "shared" || opt == "rshared")
      refuse(field, "\"" + opt + "\": a mount shared with the host is not supported");
    // Every mount of a sandbox is private: nothing propagates out, and the
    // host's later mounts do not come in.
    else if (opt == "private" || opt == "rprivate" || opt == "slave" || opt == "rslave" ||
             opt == "unbindable" || opt == "runbindable")
      continue;
    // Access-time and sync flavours: the kernel's defaults serve.
    else if (opt == "relatime" || opt == "norelatime" || opt == "strictatime" ||
             opt == "nostrictatime" || opt == "noatime" || opt == "atime" || opt == "diratime" ||
             opt == "nodiratime" || opt == "sync" || opt == "async" || opt == "dirsync" ||
             opt == "mand" || opt == "nomand" || opt == "lazytime" || opt == "nolazytime" ||
             opt == "recursive" || opt == "rro" || opt == "rrw")
      o.read_only = opt == "rro" ? true : opt == "rrw" ? false : o.read_only;
    else if (opt.find("idmap") == 0)
      refuse(field, "\"" + opt + "\" is not supported (openshell maps a bind's owner itself)");
    else
      o.data.push_back(opt);
  }
  return o;
}

std::string join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : ",") + p;
  return out;
}

void read_mounts(const json& mounts, Bundle* b) {
  namespaces::FilesystemSpec& fs = b->spec.fs;
  array_at(mounts, "mounts");
  for (size_t i = 0; i < mounts.size(); ++i) {
    const std::string f = item("mounts", i);
    const json& m = object_at(mounts[i], f);
    const json* dst = member(m, "destination");
    if (!dst) refuse(f + ".destination", "is required");
    std::string target = string_at(*dst, f + ".destination");
    while (target.size() > 1 && target.back() == '/') target.pop_back();
    if (!absolute_clean(target))
      refuse(f + ".destination", "\"" + target + "\" must be an absolute path without \"..\"");
    const std::string fm = f + " (" + target + ")";
    std::string type;
    if (const json* t = member(m, "type")) type = string_at(*t, f + ".type");
    std::string source;
    if (const json* src = member(m, "source")) source = string_at(*src, f + ".source");
    MountOptions o = mount_options(member(m, "options"), f + ".options");
    if (member(m, "uidMappings") || member(m, "gidMappings"))
      refuse(fm, "idmapped mounts are not supported (openshell maps a bind's owner itself)");

    if (type == "bind" || o.bind) {
      if (source.empty()) refuse(f + ".source", "a bind mount needs a source");
      namespaces::BindSpec bind;
      bind.source = in_bundle(b->dir, source);
      bind.target = target;
      bind.read_only = o.read_only;
      bind.no_exec = o.no_exec;
      if (is_device_bind(bind.source, target)) {
        const bool listed = std::any_of(fs.devices.begin(), fs.devices.end(),
                                        [&](const auto& d) { return d.target == target; });
        if (!listed && !kOwnDevices.count(target))
          fs.devices.push_back({bind.source, target, o.read_only});
        continue;
      }
      // A bind of the host's shared memory, where ours already is: theirs.
      fs.binds.push_back(bind);
      continue;
    }
    // The kernel file systems every sandbox has, where a sandbox has them.
    if ((type == "proc" && target == "/proc") || (type == "sysfs" && target == "/sys") ||
        (type == "devpts" && target == "/dev/pts") || (type == "tmpfs" && target == "/dev") ||
        (type == "cgroup" && target == "/sys/fs/cgroup") ||
        (type == "cgroup2" && target == "/sys/fs/cgroup"))
      continue;
    if (type == "tmpfs" && target == "/dev/shm") {
      for (const auto& d : o.data)
        if (d.rfind("size=", 0) == 0)
          if (auto bytes = text::parse_size(d.substr(5))) fs.shm_size = *bytes;
      continue;
    }
    if (type == "tmpfs" || type == "mqueue") {
      namespaces::FsMount mount;
      mount.type = type;
      mount.target = target;
      mount.data = type == "tmpfs" ? join(o.data) : "";
      mount.read_only = o.read_only;
      mount.no_exec = o.no_exec;
      mount.no_suid = o.no_suid || true;  // never a set-id program from memory
      mount.no_dev = true;
      fs.fs_mounts.push_back(mount);
      continue;
    }
    if (type == "proc" || type == "sysfs" || type == "devpts" || type == "cgroup" ||
        type == "cgroup2")
      refuse(fm, "type \"" + type + "\" is supported only at its usual place");
    refuse(fm, "type \"" + type + "\" is not supported (bind, tmpfs, mqueue, proc, sysfs, " +
                   "devpts, cgroup)");
  }
}

// --- linux -----------------------------------------------------------------

void read_namespaces(const json& v, Bundle* b) {
  array_at(v, "linux.namespaces");
  std::set<std::string> listed;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = item("linux.namespaces", i);
    const json& ns = object_at(v[i], f);
    const json* t = member(ns, "type");
    if (!t) refuse(f + ".type", "is required");
    const std::string type = string_at(*t, f + ".type");
    std::string path;
    if (const json* p = member(ns, "path")) path = string_at(*p, f + ".path");
    if (!listed.insert(type).second) refuse(f + ".type", "\"" + type + "\" is listed twice");
    std::string* join = type == "network" ? &b->spec.join_net
                        : type == "ipc"   ? &b->spec.join_ipc
                        : type == "uts"   ? &b->spec.join_uts
                                          : nullptr;
    if (join) {
      *join = path;
      continue;
    }
    if (type == "pid" || type == "mount" || type == "user" || type == "cgroup") {
      if (!path.empty())
        refuse(f + ".path",
               "joining a " + type + " namespace is not supported (each sandbox has its own)");
      continue;
    }
    if (type == "time") refuse(f + ".type", "a time namespace is not supported");
    refuse(f + ".type", "\"" + type + "\" is not a namespace");
  }
  // One the config does not list is the runtime's own (the host's): joined.
  if (!listed.count("network")) b->spec.join_net = "/proc/self/ns/net";
  if (!listed.count("ipc")) b->spec.join_ipc = "/proc/self/ns/ipc";
  if (!listed.count("uts")) b->spec.join_uts = "/proc/self/ns/uts";
}

// One of linux.uidMappings, gidMappings: its ranges, checked as the kernel
// would take them (at most 340, none overlapping inside or outside).
std::vector<namespaces::IdRange> id_ranges(const json& v, const std::string& f) {
  array_at(v, f);
  if (v.size() > 340) refuse(f, "has more than 340 ranges (the kernel's limit)");
  std::vector<namespaces::IdRange> ranges;
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string rf = item(f, i);
    const json& r = object_at(v[i], rf);
    uint32_t fields[3] = {};
    const char* keys[3] = {"containerID", "hostID", "size"};
    for (int k = 0; k < 3; ++k) {
      const json* n = member(r, keys[k]);
      if (!n) refuse(rf + "." + keys[k], "is required");
      fields[k] = static_cast<uint32_t>(unsigned_at(*n, rf + "." + keys[k], UINT32_MAX));
    }
    namespaces::IdRange range{fields[0], fields[1], fields[2]};
    if (range.count == 0) refuse(rf + ".size", "must be above 0");
    if (uint64_t{range.inside} + range.count > UINT32_MAX ||
        uint64_t{range.outside} + range.count > UINT32_MAX)
      refuse(rf, "goes past the last id (4294967294)");
    for (const auto& other : ranges) {
      auto overlap = [](uint32_t a, uint32_t b, uint32_t count_a, uint32_t count_b) {
        return uint64_t{a} < uint64_t{b} + count_b && uint64_t{b} < uint64_t{a} + count_a;
      };
      if (overlap(range.inside, other.inside, range.count, other.count) ||
          overlap(range.outside, other.outside, range.count, other.count))
        refuse(rf, "overlaps an earlier range");
    }
    ranges.push_back(range);
  }
  return ranges;
}

void read_id_maps(const json& l, Context context, Bundle* b) {
  const json* uid = member(l, "uidMappings");
  const json* gid = member(l, "gidMappings");
  const bool uid_given = uid && !(uid->is_array() && uid->empty());
  const bool gid_given = gid && !(gid->is_array() && gid->empty());
  if (!uid_given && !gid_given) return;
  const char* key = uid_given ? "linux.uidMappings" : "linux.gidMappings";
  // Root of the host takes the engine's map (Podman's --uidmap and
  // --userns=auto, Kubernetes' hostUsers: false), whose ids the engine
  // gave the files, but never one that maps the host's root in; root of a
  // nested namespace (rootless Podman's) takes it in that namespace's ids.
  // An ordinary user's containers map from its subordinate ids, as
  // openshell plans them.
  if (!context.nested_root && !context.host_root)
    refuse(key,
           "is taken from root only: run as an ordinary user, openshell maps the sandbox's "
           "ids itself (from /etc/subuid)");
  if (!uid_given) refuse("linux.uidMappings", "is required with linux.gidMappings");
  if (!gid_given) refuse("linux.gidMappings", "is required with linux.uidMappings");
  namespaces::IdMap map;
  map.method = namespaces::IdMap::Method::kDirect;
  map.uid = id_ranges(*uid, "linux.uidMappings");
  map.gid = id_ranges(*gid, "linux.gidMappings");
  if (context.host_root) {
    auto maps_host_root = [](const std::vector<namespaces::IdRange>& ranges) {
      return std::any_of(ranges.begin(), ranges.end(),
                         [](const namespaces::IdRange& r) { return r.outside == 0; });
    };
    if (maps_host_root(map.uid))
      refuse("linux.uidMappings",
             "maps the host's root (hostID 0) into the container, which openshell never does");
    if (maps_host_root(map.gid))
      refuse("linux.gidMappings",
             "maps the host's root group (hostID 0) into the container, which openshell never "
             "does");
  }
  if (!map.host_uid(b->spec.uid))
    refuse("process.user.uid",
           std::to_string(b->spec.uid) + " is not in linux.uidMappings' container ids");
  if (!map.host_gid(b->spec.gid))
    refuse("process.user.gid",
           std::to_string(b->spec.gid) + " is not in linux.gidMappings' container ids");
  for (uint32_t extra : b->spec.supplementary_gids)
    if (!map.host_gid(extra))
      refuse("process.user.additionalGids",
             std::to_string(extra) + " is not in linux.gidMappings' container ids");
  b->spec.id_map = std::move(map);
}

void read_resources(const json& r, Bundle* b) {
  const std::string f = "linux.resources";
  object_at(r, f);
  runtime::Limits& limits = b->spec.limits;
  if (const json* m = member(r, "memory")) {
    object_at(*m, f + ".memory");
    if (const json* l = member(*m, "limit")) {
      int64_t n = signed_at(*l, f + ".memory.limit");
      if (n > 0) limits.memory_bytes = static_cast<uint64_t>(n);
    }
    for (const char* key : {"reservation", "swap", "kernel", "kernelTCP", "swappiness"})
      if (member(*m, key)) log::debug(f + ".memory." + key + ": not applied");
  }
  if (const json* p = member(r, "pids")) {
    object_at(*p, f + ".pids");
    if (const json* l = member(*p, "limit")) {
      int64_t n = signed_at(*l, f + ".pids.limit");
      if (n > 0) limits.pids = static_cast<uint64_t>(n);
    }
  }
  if (const json* c = member(r, "cpu")) {
    object_at(*c, f + ".cpu");
    const json* quota = member(*c, "quota");
    const json* period = member(*c, "period");
    if (quota && signed_at(*quota, f + ".cpu.quota") > 0) {
      uint64_t p = period ? unsigned_at(*period, f + ".cpu.period") : 100000;
      if (p == 0) refuse(f + ".cpu.period", "must be above 0");
      limits.cpus = static_cast<double>(quota->get<int64_t>()) / static_cast<double>(p);
    }
    for (const char* key : {"realtimeRuntime", "realtimePeriod"})
      if (member(*c, key)) refuse(f + ".cpu." + key, "is not supported");
    // shares, cpus and mems: weights and placement, not limits.
  }
  if (const json* h = member(r, "hugepageLimits"); h && h->is_array() && !h->empty())
    refuse(f + ".hugepageLimits", "is not supported");
  if (member(r, "rdma")) refuse(f + ".rdma", "is not supported");
  if (const json* u = member(r, "unified"); u && u->is_object() && !u->empty())
    refuse(f + ".unified", "is not supported");
  // devices: the sandbox's /dev holds only the nodes it is given, and no
  // node can be made (no mknod in its user namespace); blockIO and network:
  // weights, not applied.
}

void read_devices(const json& v, Bundle* b) {
  array_at(v, "linux.devices");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string f = item("linux.devices", i);
    const json& d = object_at(v[i], f);
    const json* p = member(d, "path");
    if (!p) refuse(f + ".path", "is required");
    const std::string path = string_at(*p, f + ".path");
    if (kOwnDevices.count(path)) continue;
    if (path.rfind("/dev/", 0) != 0 || !absolute_clean(path))
      refuse(f + ".path", "\"" + path + "\" must be below /dev");
    // The host's own node of that number, bound in (no mknod in a user
    // namespace).
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0 || !(S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)))
      refuse(f, path + " is not a device node on this host (openshell binds the host's node)");
    if (const json* major = member(d, "major"))
      if (const json* minor = member(d, "minor"))
        if (signed_at(*major, f + ".major") != static_cast<int64_t>(major(st.st_rdev)) ||
            signed_at(*minor, f + ".minor") != static_cast<int64_t>(minor(st.st_rdev)))
          refuse(f, "the host's " + path + " has another device number");
    b->spec.fs.devices.push_back({path, path, false});
  }
}

void read_linux(const json& l, Context context, Bundle* b) {
  object_at(l, "linux");
  if (const json* v = member(l, "namespaces"))
    read_namespaces(*v, b);
  else {
    b->spec.join_net = "/proc/self/ns/net";
    b->spec.join_ipc = "/proc/self/ns/ipc";
    b->spec.join_uts = "/proc/self/ns/uts";
  }
  read_id_maps(l, context, b);
  if (const json* v = member(l, "devices")) read_devices(*v, b);
  if (const json* v = member(l, "resources")) read_resources(*v, b);
  if (const json* v = member(l, "cgroupsPath")) {
    std::string path = string_at(*v, "linux.cgroupsPath");
    if (path.find(':') != std::string::npos)
      refuse("linux.cgroupsPath", "\"" + path +
                                      "\" is systemd's slice:prefix:name form, and openshell "
                                      "manages cgroups itself (use the cgroupfs manager)");
    if (!path.empty()) {
      if (path[0] != '/') path = "/" + path;
      if (!absolute_clean(path)) refuse("linux.cgroupsPath", "\"" + path + "\" has \"..\"");
      b->spec.cgroup_path = path;
    }
  }
  if (const json* v = member(l, "sysctl")) {
    object_at(*v, "linux.sysctl");
    for (const auto& [key, value] : v->items())
      b->spec.fs.sysctls.emplace_back(key, string_at(value, "linux.sysctl." + key));
  }
  if (const json* v = member(l, "maskedPaths"))
    b->spec.fs.masked_paths = strings_at(*v, "linux.maskedPaths");
  if (const json* v = member(l, "readonlyPaths"))
    b->spec.fs.read_only_paths = strings_at(*v, "linux.readonlyPaths");
  for (const auto& p : b->spec.fs.masked_paths)
    if (!absolute_clean(p)) refuse("linux.maskedPaths", "\"" + p + "\" must be absolute");
  for (const auto& p : b->spec.fs.read_only_paths)
    if (!absolute_clean(p)) refuse("linux.readonlyPaths", "\"" + p + "\" must be absolute");
  if (const json* v = member(l, "seccomp"); v && context.compile_seccomp) {
    b->seccomp = compile_seccomp(*v);
    b->spec.seccomp_program = b->seccomp.program();
  }
  if (const json* v = member(l, "rootfsPropagation")) {
    const std::string p = string_at(*v, "linux.rootfsPropagation");
    if (p == "shared" || p == "rshared")
      refuse("linux.rootfsPropagation", "a root shared with the host is not supported");
  }
  for (const char* key : {"intelRdt", "personality", "timeOffsets", "memoryPolicy"})
    if (member(l, key)) refuse(std::string("linux.") + key, "is not supported");
  if (const json* v = member(l, "mountLabel"); v && !string_at(*v, "linux.mountLabel").empty())
    log::debug("linux.mountLabel: not applied");
}

void read_hooks(const json& h, Bundle* b) {
  object_at(h, "hooks");
  for (const auto& [name, list] : h.items()) {
    const std::string f = "hooks." + name;
    auto stage = runtime::hook_stage(name);
    if (!stage)
      refuse(f,
             "is not a hook (prestart, createRuntime, createContainer, "
             "startContainer, poststart, poststop)");
    array_at(list, f);
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string hf = item(f, i);
      const json& entry = object_at(list[i], hf);
      runtime::Hook hook;
      hook.stage = *stage;
      const json* path = member(entry, "path");
      if (!path) refuse(hf + ".path", "is required");
      hook.path = string_at(*path, hf + ".path");
      if (hook.path.empty() || hook.path[0] != '/') refuse(hf + ".path", "must be absolute");
      if (const json* v = member(entry, "args")) hook.args = strings_at(*v, hf + ".args");
      if (const json* v = member(entry, "env")) hook.env = strings_at(*v, hf + ".env");
      if (const json* v = member(entry, "timeout")) {
        int64_t t = signed_at(*v, hf + ".timeout");
        if (t <= 0) refuse(hf + ".timeout", "must be above 0");
        hook.timeout_s = static_cast<int>(std::min<int64_t>(t, INT_MAX));
      }
      if (*stage == runtime::HookStage::kPoststart)
        b->poststart.push_back(hook);
      else if (*stage == runtime::HookStage::kStartContainer)
        b->start_container.push_back(hook);
      else if (*stage == runtime::HookStage::kPoststop)
        b->poststop.push_back(hook);
      else
        b->spec.hooks.push_back(hook);
    }
  }
}

// The policy the annotation names: its filesystem part becomes Landlock
// rules (the config's bind targets stay reachable as bound, as `openshell
// run --bind` keeps them); its network part makes the egress proxy, which
// the monitor serves, the container's only way out. Its process part is
// not used: the config's process.user is the engine's to give.
void apply_policy(Bundle* b) {
  const std::string field = std::string("annotations.") + kPolicyAnnotation;
  auto text = files::try_read(b->policy_file);
  if (!text) refuse(field, errno_message("read " + b->policy_file, errno ? errno : ENOENT));
  policy::Policy policy;
  try {
    policy = policy::parse(*text, b->policy_file);
  } catch (const Error& e) {
    refuse(field, e.what());
  }
  runtime::ContainerSpec& s = b->spec;
  if (!policy.network.empty()) {
    // The proxy is the only way out only where nothing else is: a network
    // namespace of the container's own, holding nothing but loopback.
    if (!s.join_net.empty())
      refuse(field,
             "its network_policies need a network namespace of the container's own "
             "(linux.namespaces: {\"type\": \"network\"} without a path), where the "
             "egress proxy is the only way out");
    if (spec::inspects_traffic(policy))
      refuse(field,
             "an endpoint with protocol (traffic inspection) is not available to OCI "
             "containers yet; give endpoints without protocol, or tls = \"skip\"");
    s.egress = true;
    s.fs.dns_stub = true;
    b->process.env = spec::merge_env(spec::proxy_env(), b->process.env);
  }
  if (policy.has_filesystem_policy) {
    policy::Policy confined = policy;
    for (const auto& bind : s.fs.binds)
      (bind.read_only ? confined.filesystem.read_only : confined.filesystem.read_write)
          .push_back(bind.target);
    s.landlock = runtime::landlock::plan(confined, s.fs.workdir, runtime::landlock::abi_version());
    s.landlock_policy.has_filesystem_policy = true;
    s.landlock_policy.filesystem = confined.filesystem;
    s.landlock_policy.landlock = confined.landlock;
  }
  b->policy = std::move(policy);
}

}  // namespace

Context current_context() {
  Context c;
  const bool root = ::geteuid() == 0, initial = namespaces::in_initial_user_namespace();
  c.nested_root = root && !initial;
  c.host_root = root && initial;
  return c;
}

std::unique_ptr<Bundle> bundle_from_json(const json& config, const std::string& dir,
                                         Context context) {
  auto b = std::make_unique<Bundle>();
  b->dir = dir;
  b->config = config;
  object_at(config, "(top level)");
  const json* version = member(config, "ociVersion");
  if (!version) refuse("ociVersion", "is required");
  b->oci_version = string_at(*version, "ociVersion");
  if (b->oci_version.rfind("1.", 0) != 0)
    refuse("ociVersion", "\"" + b->oci_version + "\" is not 1.x (runtime-spec 1.0 to 1.2)");
  for (const char* key : {"windows", "solaris", "vm", "zos"})
    if (member(config, key)) refuse(key, "is not for this platform");

  runtime::ContainerSpec& s = b->spec;
  s.argv.clear();  // the main process comes with `start`
  s.fs.root = namespaces::RootKind::kDirectory;
  s.fs.plain_root = true;
  s.fs.private_tmp = false;
  s.seccomp = true;
  const json* root = member(config, "root");
  if (!root) refuse("root", "is required");
  object_at(*root, "root");
  const json* root_path = member(*root, "path");
  if (!root_path) refuse("root.path", "is required");
  s.fs.rootfs = in_bundle(dir, string_at(*root_path, "root.path"));
  if (const json* v = member(*root, "readonly")) s.fs.read_only = bool_at(*v, "root.readonly");
  s.hostname.clear();
  if (const json* v = member(config, "hostname")) s.hostname = string_at(*v, "hostname");
  const bool hostname_given = !s.hostname.empty();
  if (s.hostname.empty()) {
    char name[256] = {};
    ::gethostname(name, sizeof name - 1);
    s.hostname = name;
  }
  if (member(config, "domainname")) refuse("domainname", "is not supported");

  const json* process = member(config, "process");
  if (!process) refuse("process", "is required (openshell runs a process in each container)");
  read_process(*process, b.get());
  if (const json* v = member(config, "mounts")) read_mounts(*v, b.get());
  if (const json* v = member(config, "linux"))
    read_linux(*v, context, b.get());
  else
    refuse("linux", "is required on Linux");
  if (hostname_given && !s.join_uts.empty())
    refuse("hostname", "needs a uts namespace of the container's own (linux.namespaces)");
  if (const json* v = member(config, "hooks")) read_hooks(*v, b.get());
  if (const json* v = member(config, "annotations")) {
    object_at(*v, "annotations");
    for (const auto& [key, value] : v->items())
      b->annotations[key] = string_at(value, "annotations." + key);
  }
  if (auto it = b->annotations.find(kPolicyAnnotation); it != b->annotations.end()) {
    b->policy_file = in_bundle(dir, it->second);
    apply_policy(b.get());
  }
  return b;
}

std::unique_ptr<Bundle> read_bundle(const std::string& dir, ReadFor purpose) {
  const std::string path = dir + "/config.json";
  auto text = files::try_read(path);
  if (!text) throw Error(errno_message("read " + path, errno ? errno : ENOENT));
  json config = json::parse(*text, nullptr, false);
  if (config.is_discarded()) throw Error(path + ": not valid JSON");
  Context context = current_context();
  context.compile_seccomp = purpose == ReadFor::kStart;
  return bundle_from_json(config, dir, context);
}

json example_config(bool rootless) {
  json caps = json::array({"CAP_AUDIT_WRITE", "CAP_KILL", "CAP_NET_BIND_SERVICE"});
  json config = {
      {"ociVersion", "1.0.2"},
      {"process",
       {{"terminal", true},
        {"user", {{"uid", 0}, {"gid", 0}}},
        {"args", {"sh"}},
        {"env",
         {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TERM=xterm"}},
        {"cwd", "/"},
        {"capabilities",
         {{"bounding", caps}, {"effective", caps}, {"permitted", caps}, {"ambient", caps}}},
        {"rlimits", {{{"type", "RLIMIT_NOFILE"}, {"hard", 1024}, {"soft", 1024}}}},
        {"noNewPrivileges", true}}},
      {"root", {{"path", "rootfs"}, {"readonly", true}}},
      {"hostname", "openshell"},
      {"mounts",
       {{{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
        {{"destination", "/dev"},
         {"type", "tmpfs"},
         {"source", "tmpfs"},
         {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
        {{"destination", "/dev/pts"}, {"type", "devpts"}, {"source", "devpts"}},
        {{"destination", "/dev/shm"},
         {"type", "tmpfs"},
         {"source", "shm"},
         {"options", {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}},
        {{"destination", "/dev/mqueue"},
         {"type", "mqueue"},
         {"source", "mqueue"},
         {"options", {"nosuid", "noexec", "nodev"}}},
        {{"destination", "/sys"},
         {"type", "sysfs"},
         {"source", "sysfs"},
         {"options", {"nosuid", "noexec", "nodev", "ro"}}}}},
      {"linux",
       {{"namespaces",
         {{{"type", "pid"}},
          {{"type", "network"}},
          {{"type", "ipc"}},
          {{"type", "uts"}},
          {{"type", "mount"}},
          {{"type", "cgroup"}}}},
        {"maskedPaths",
         {"/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"}},
        {"readonlyPaths",
         {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}}}}};
  if (rootless) config["linux"]["namespaces"].push_back({{"type", "user"}});
  return config;
}

}  // namespace openshell::oci
