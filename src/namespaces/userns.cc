#include "namespaces/userns.h"

#include <fcntl.h>
#include <linux/sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "base/error.h"
#include "base/files.h"
#include "base/log.h"
#include "base/text.h"

extern char** environ;

namespace openshell::namespaces {

namespace {

std::optional<uint32_t> lookup(const std::vector<IdRange>& ranges, uint32_t inside) {
  for (const auto& r : ranges)
    if (inside >= r.inside && inside - r.inside < r.count) return r.outside + (inside - r.inside);
  return std::nullopt;
}

// Keep-id layout: target -> host id; the other ids of 0-65535 from the range.
std::vector<IdRange> keep_id_ranges(uint32_t target, uint32_t host, SubordinateRange sub) {
  std::vector<IdRange> out;
  uint32_t below = std::min(target, sub.count);
  if (below > 0) out.push_back({0, sub.start, below});
  out.push_back({target, host, 1});
  uint32_t left = sub.count - below;
  uint32_t wanted = target < kRangeSize - 1 ? kRangeSize - 1 - target : 0;
  uint32_t above = std::min(left, wanted);
  if (above > 0) out.push_back({target + 1, sub.start + below, above});
  return out;
}

std::string render(const std::vector<IdRange>& ranges) {
  std::string out;
  for (const auto& r : ranges)
    out += std::to_string(r.inside) + " " + std::to_string(r.outside) + " " +
           std::to_string(r.count) + "\n";
  return out;
}

std::optional<std::string> find_helper(const char* name) {
  for (const char* dir : {"/usr/bin/", "/bin/", "/usr/sbin/", "/sbin/"}) {
    std::string path = std::string(dir) + name;
    if (::access(path.c_str(), X_OK) == 0) return path;
  }
  return std::nullopt;
}

pid_t spawn_helper(const std::string& helper, pid_t pid, const std::vector<IdRange>& ranges) {
  std::vector<std::string> args{helper, std::to_string(pid)};
  for (const auto& r : ranges) {
    args.push_back(std::to_string(r.inside));
    args.push_back(std::to_string(r.outside));
    args.push_back(std::to_string(r.count));
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t child;
  int err = ::posix_spawn(&child, helper.c_str(), nullptr, nullptr, argv.data(), environ);
  if (err) throw_errno("run " + helper, err);
  return child;
}

bool wait_helper(pid_t child) {
  int status;
  while (::waitpid(child, &status, 0) < 0)
    if (errno != EINTR) return false;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

void write_direct(pid_t pid, const IdMap& map) {
  std::string base = "/proc/" + std::to_string(pid) + "/";
  files::write(base + "uid_map", render(map.uid));
  if (map.deny_setgroups) files::write(base + "setgroups", "deny");
  files::write(base + "gid_map", render(map.gid));
}

}  // namespace

std::optional<uint32_t> IdMap::host_uid(uint32_t inside) const { return lookup(uid, inside); }
std::optional<uint32_t> IdMap::host_gid(uint32_t inside) const { return lookup(gid, inside); }

std::string IdMap::describe() const {
  auto one = [](const std::vector<IdRange>& ranges) {
    std::string out;
    for (const auto& r : ranges) {
      if (!out.empty()) out += ',';
      out += std::to_string(r.inside);
      out += "->";
      out += std::to_string(r.outside);
      out += '+';
      out += std::to_string(r.count);
    }
    return out;
  };
  return std::string(method == Method::kHelper ? "newuidmap" : "direct") + " uid " + one(uid) +
         " gid " + one(gid) + (deny_setgroups ? " setgroups=deny" : "");
}

std::optional<SubordinateRange> find_subordinate(std::string_view text, std::string_view user,
                                                 uint32_t id) {
  std::string id_text = std::to_string(id);
  for (const auto& raw : text::split(text, '\n')) {
    auto line = text::trim(raw);
    if (line.empty() || line[0] == '#') continue;
    auto fields = text::split(line, ':');
    if (fields.size() != 3) continue;
    if (fields[0] != user && fields[0] != id_text) continue;
    auto start = text::parse_uint(fields[1], UINT32_MAX);
    auto count = text::parse_uint(fields[2], UINT32_MAX);
    if (!start || !count || *count == 0) continue;
    return SubordinateRange{static_cast<uint32_t>(*start), static_cast<uint32_t>(*count)};
  }
  return std::nullopt;
}

IdMap plan_id_map(const Identity& caller, uint32_t target_uid, uint32_t target_gid,
                  std::optional<SubordinateRange> subuid, std::optional<SubordinateRange> subgid,
                  bool helpers_available) {
  IdMap map;
  if (caller.host_uid == 0) {
    SubordinateRange u = subuid.value_or(SubordinateRange{kRootRangeStart, kRangeSize});
    SubordinateRange g = subgid.value_or(SubordinateRange{kRootRangeStart, kRangeSize});
    uint32_t ucount = std::min(u.count, kRangeSize), gcount = std::min(g.count, kRangeSize);
    if (target_uid >= ucount)
      throw Error("user id " + std::to_string(target_uid) + " is outside the sandbox's ids (0-" +
                  std::to_string(ucount - 1) + ")");
    if (target_gid >= gcount)
      throw Error("group id " + std::to_string(target_gid) + " is outside the sandbox's ids (0-" +
                  std::to_string(gcount - 1) + ")");
    map.uid = {{0, u.start, ucount}};
    map.gid = {{0, g.start, gcount}};
    return map;
  }
  if (helpers_available && subuid && subgid) {
    map.method = IdMap::Method::kHelper;
    map.uid = keep_id_ranges(target_uid, caller.host_uid, *subuid);
    map.gid = keep_id_ranges(target_gid, caller.host_gid, *subgid);
    return map;
  }
  map.uid = {{target_uid, caller.host_uid, 1}};
  map.gid = {{target_gid, caller.host_gid, 1}};
  map.deny_setgroups = true;
  return map;
}

std::vector<uint32_t> map_host_groups(IdMap* map, const std::vector<uint32_t>& host_gids) {
  std::vector<uint32_t> mapped;
  for (uint32_t gid : host_gids) {
    if (gid == 0 || gid == UINT32_MAX) continue;
    bool held = false;
    for (const auto& r : map->gid) held = held || (gid >= r.outside && gid - r.outside < r.count);
    if (held) continue;
    std::vector<IdRange> out;
    for (const auto& r : map->gid) {
      if (gid < r.inside || gid - r.inside >= r.count) {
        out.push_back(r);
        continue;
      }
      const uint32_t below = gid - r.inside;
      if (below > 0) out.push_back({r.inside, r.outside, below});
      if (r.count - below - 1 > 0)
        out.push_back({gid + 1, r.outside + below + 1, r.count - below - 1});
    }
    out.push_back({gid, gid, 1});
    map->gid = std::move(out);
    mapped.push_back(gid);
  }
  return mapped;
}

Identity current_identity() {
  Identity id{::geteuid(), ::getegid(), {}};
  // /etc/passwd directly: a static binary cannot load NSS modules.
  std::string uid_text = std::to_string(id.host_uid);
  for (const auto& line : text::split(files::try_read("/etc/passwd").value_or(""), '\n')) {
    auto fields = text::split(line, ':');
    if (fields.size() >= 3 && fields[2] == uid_text) {
      id.user_name = fields[0];
      break;
    }
  }
  return id;
}

std::vector<IdRange> parse_id_map(std::string_view text) {
  std::vector<IdRange> out;
  for (const auto& raw : text::split(text, '\n')) {
    std::vector<std::string> fields;
    for (const auto& field : text::split(text::trim(raw), ' '))
      if (!field.empty()) fields.push_back(std::string(field));
    if (fields.size() != 3) continue;
    auto inside = text::parse_uint(fields[0], UINT32_MAX);
    auto outside = text::parse_uint(fields[1], UINT32_MAX);
    auto count = text::parse_uint(fields[2], UINT32_MAX);
    if (!inside || !outside || !count || *count == 0) continue;
    out.push_back({static_cast<uint32_t>(*inside), static_cast<uint32_t>(*outside),
                   static_cast<uint32_t>(*count)});
  }
  return out;
}

bool is_initial_map(const std::vector<IdRange>& map) {
  return map.size() == 1 && map[0] == IdRange{0, 0, UINT32_MAX};
}

bool in_initial_user_namespace() {
  auto text = files::try_read("/proc/self/uid_map");
  return !text || is_initial_map(parse_id_map(*text));
}

bool is_host_root() { return ::geteuid() == 0 && in_initial_user_namespace(); }

IdMap plan_nested_root_map(const std::vector<IdRange>& own_uid, const std::vector<IdRange>& own_gid,
                           uint32_t target_uid, uint32_t target_gid) {
  // Range for range: the kernel takes a line only when its ids lie in one
  // line of the parent's map, so adjacent ones are not joined.
  auto identity = [](const std::vector<IdRange>& own) {
    std::vector<IdRange> out;
    for (const auto& r : own) out.push_back({r.inside, r.inside, r.count});
    std::sort(out.begin(), out.end(),
              [](const IdRange& a, const IdRange& b) { return a.inside < b.inside; });
    return out;
  };
  IdMap map;
  map.uid = identity(own_uid);
  map.gid = identity(own_gid);
  if (!map.host_uid(target_uid))
    throw Error("user id " + std::to_string(target_uid) +
                " is not mapped in the runtime's user namespace (/proc/self/uid_map)");
  if (!map.host_gid(target_gid))
    throw Error("group id " + std::to_string(target_gid) +
                " is not mapped in the runtime's user namespace (/proc/self/gid_map)");
  return map;
}

IdMap plan_id_map_for_host(const Identity& caller, uint32_t target_uid, uint32_t target_gid,
                           std::optional<HostRange> root_range) {
  if (caller.host_uid == 0 && !in_initial_user_namespace())
    return plan_nested_root_map(parse_id_map(files::try_read("/proc/self/uid_map").value_or("")),
                                parse_id_map(files::try_read("/proc/self/gid_map").value_or("")),
                                target_uid, target_gid);
  std::optional<SubordinateRange> subuid, subgid;
  bool helpers = false;
  if (caller.host_uid == 0 && root_range) {
    subuid = SubordinateRange{root_range->uid_start, kRangeSize};
    subgid = SubordinateRange{root_range->gid_start, kRangeSize};
  } else if (caller.host_uid == 0) {
    if (auto text = files::try_read("/etc/subuid")) subuid = find_subordinate(*text, "root", 0);
    if (auto text = files::try_read("/etc/subgid")) subgid = find_subordinate(*text, "root", 0);
  } else {
    helpers = find_helper("newuidmap") && find_helper("newgidmap");
    if (helpers) {
      if (auto text = files::try_read("/etc/subuid"))
        subuid = find_subordinate(*text, caller.user_name, caller.host_uid);
      if (auto text = files::try_read("/etc/subgid"))
        subgid = find_subordinate(*text, caller.user_name, caller.host_uid);
    }
  }
  return plan_id_map(caller, target_uid, target_gid, subuid, subgid, helpers);
}

UniqueFd make_user_namespace(const std::vector<IdRange>& uid, const std::vector<IdRange>& gid) {
  // A child in a new user namespace holds it while we write its maps and
  // open it; then it goes.
  Pipe hold = Pipe::create();
  clone_args args{};
  args.flags = CLONE_NEWUSER;
  args.exit_signal = SIGCHLD;
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid < 0) throw_errno("clone3 (user namespace for an idmapped mount)");
  if (pid == 0) {
    ::close(hold.write.get());  // our copy: EOF must come from the parent's
    char byte;
    while (::read(hold.read.get(), &byte, 1) < 0 && errno == EINTR) {
    }
    ::_exit(0);
  }
  auto reap = [&]() {
    hold.write.reset();
    int status;
    while (::waitpid(static_cast<pid_t>(pid), &status, 0) < 0 && errno == EINTR) {
    }
  };
  UniqueFd ns;
  try {
    std::string base = "/proc/" + std::to_string(pid) + "/";
    files::write(base + "uid_map", render(uid));
    files::write(base + "gid_map", render(gid));
    ns.reset(::open((base + "ns/user").c_str(), O_RDONLY | O_CLOEXEC));
    if (!ns) throw_errno("open " + base + "ns/user");
  } catch (...) {
    reap();
    throw;
  }
  reap();
  return ns;
}

void apply_id_map(pid_t pid, IdMap* map) {
  if (map->method == IdMap::Method::kDirect) {
    write_direct(pid, *map);
    return;
  }
  // Both helpers at once: each is a fork+exec of a setuid program.
  pid_t uid_helper = spawn_helper(*find_helper("newuidmap"), pid, map->uid);
  pid_t gid_helper = spawn_helper(*find_helper("newgidmap"), pid, map->gid);
  bool uid_ok = wait_helper(uid_helper);
  bool gid_ok = wait_helper(gid_helper);
  if (uid_ok && gid_ok) return;
  // A map can be written once: whatever failed can still fall back.
  uint32_t target_uid = 0, target_gid = 0;
  for (const auto& r : map->uid)
    if (r.count == 1 && r.outside == ::geteuid()) target_uid = r.inside;
  for (const auto& r : map->gid)
    if (r.count == 1 && r.outside == ::getegid()) target_gid = r.inside;
  log::warn(std::string("new") + (uid_ok ? "gid" : "uid") +
            "map failed; falling back to a single-id map (check /etc/subuid and /etc/subgid)");
  std::string base = "/proc/" + std::to_string(pid) + "/";
  if (!uid_ok) {
    map->uid = {{target_uid, static_cast<uint32_t>(::geteuid()), 1}};
    files::write(base + "uid_map", render(map->uid));
  }
  if (!gid_ok) {
    map->gid = {{target_gid, static_cast<uint32_t>(::getegid()), 1}};
    map->deny_setgroups = true;
    files::write(base + "setgroups", "deny");
    files::write(base + "gid_map", render(map->gid));
  }
  map->method = IdMap::Method::kDirect;
}

}  // namespace openshell::namespaces
