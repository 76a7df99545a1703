// User namespace id maps: which ids exist inside a sandbox and whom they are
// on the host.
//
//  - root: inside 0-65535 map to a subordinate range (root's entry in
//    /etc/subuid, else kRootRangeStart), so that root in a sandbox is nobody
//    on the host;
//  - an ordinary user with an /etc/subuid entry and newuidmap: the sandbox
//    user is the caller (so bound host files stay theirs) and every other
//    inside id comes from the subordinate range;
//  - otherwise: a single-id map, the sandbox user <-> the caller, and
//    setgroups denied;
//  - root of a user namespace that is not the initial one (the runtime
//    under rootless Podman, in Podman's own namespace): each id of that
//    namespace is itself inside, a namespace nested in it, since every id
//    there is already the invoking user's; or the map the engine gives
//    (an OCI config's linux.uidMappings), in that namespace's ids.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/unique_fd.h"

namespace openshell::namespaces {

inline constexpr uint32_t kRootRangeStart = 0x70000000;  // 1879048192
inline constexpr uint32_t kRangeSize = 65536;

struct IdRange {
  uint32_t inside;
  uint32_t outside;
  uint32_t count;
  bool operator==(const IdRange&) const = default;
};

struct SubordinateRange {
  uint32_t start;
  uint32_t count;
};

// As root, a sandbox's own host ids (see namespaces/id_pool.h): inside
// 0-65535 map to uid_start.. and gid_start...
struct HostRange {
  uint32_t uid_start;
  uint32_t gid_start;
  bool operator==(const HostRange&) const = default;
};

struct IdMap {
  enum class Method { kDirect, kHelper };  // write /proc/PID/*_map, or newuidmap/newgidmap
  Method method = Method::kDirect;
  std::vector<IdRange> uid;
  std::vector<IdRange> gid;
  bool deny_setgroups = false;

  // Host id of an inside id, if mapped.
  std::optional<uint32_t> host_uid(uint32_t inside) const;
  std::optional<uint32_t> host_gid(uint32_t inside) const;
  // Whether the sandbox can hold ids other than its user (setgroups, chown).
  bool is_single() const { return uid.size() == 1 && uid[0].count == 1; }
  std::string describe() const;
};

// The entry for a user in /etc/subuid or /etc/subgid text ("name:start:count"
// or "uid:start:count"); the first match wins, as in shadow's tools.
std::optional<SubordinateRange> find_subordinate(std::string_view text, std::string_view user,
                                                 uint32_t id);

struct Identity {
  uid_t host_uid;
  gid_t host_gid;
  std::string user_name;  // the caller's name, for /etc/subuid lookups
};

// Plans the map for running as target_uid:target_gid inside. Throws Error when
// the target cannot exist in the sandbox.
IdMap plan_id_map(const Identity& caller, uint32_t target_uid, uint32_t target_gid,
                  std::optional<SubordinateRange> subuid, std::optional<SubordinateRange> subgid,
                  bool helpers_available);

// The map of a user namespace as /proc/PID/uid_map writes it ("inside
// outside count" a line); lines that do not parse are skipped.
std::vector<IdRange> parse_id_map(std::string_view text);

// Whether a map is the initial user namespace's (0 0 4294967295).
bool is_initial_map(const std::vector<IdRange>& map);

// Whether this process runs in the initial user namespace (true when its
// map cannot be read). Root outside it holds no privilege over the host.
bool in_initial_user_namespace();

// Whether this process is root of the host: uid 0 in the initial user
// namespace (root of a nested one is someone else on the host).
bool is_host_root();

// For root of a nested user namespace whose maps are own_uid/own_gid: the
// same ids inside, range for range. Throws Error when the target
// ids are not among them.
IdMap plan_nested_root_map(const std::vector<IdRange>& own_uid, const std::vector<IdRange>& own_gid,
                           uint32_t target_uid, uint32_t target_gid);

// Reads /etc/subuid, /etc/subgid and looks for newuidmap/newgidmap, then plans.
// Root of a nested user namespace gets plan_nested_root_map of its own maps.
// root_range (as root only): the sandbox's own range instead of root's
// subordinate one; ignored for other callers, whose own ranges apply.
IdMap plan_id_map_for_host(const Identity& caller, uint32_t target_uid, uint32_t target_gid,
                           std::optional<HostRange> root_range = std::nullopt);

Identity current_identity();

// As root (a map written directly): each host group of `host_gids` (not 0,
// not one the map already holds) becomes the sandbox's group of the same
// number, carved out of the range that held that inside id, so that a
// process of the sandbox can hold it (a device node's group: --gpu).
// Returns the inside gids, the same numbers.
std::vector<uint32_t> map_host_groups(IdMap* map, const std::vector<uint32_t>& host_gids);

// A user namespace that holds only the given maps, for idmapped mounts (as
// root). Returns its fd; throws Error.
UniqueFd make_user_namespace(const std::vector<IdRange>& uid, const std::vector<IdRange>& gid);

// Writes the map of process pid (which must be waiting in its new user
// namespace). A helper that fails falls back to a single-id map with a
// warning; *map is updated to what was applied. Throws Error.
void apply_id_map(pid_t pid, IdMap* map);

}  // namespace openshell::namespaces
