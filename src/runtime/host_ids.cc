// The gateway's door to a sandbox's host ids and to the overlay probe.
#include "runtime/host_ids.h"

#include <unistd.h>

#include "base/error.h"
#include "namespaces/id_pool.h"
#include "namespaces/overlay.h"
#include "namespaces/userns.h"

namespace openshell::runtime {

SandboxIds claim_sandbox_ids(const std::string& sandbox_dir) {
  const namespaces::HostRange range = namespaces::claim_host_range(sandbox_dir, false).range();
  return {range.uid_start, range.gid_start};
}

void release_sandbox_ids(uint32_t uid_start, const std::string& sandbox_dir) {
  namespaces::release_sandbox_range(namespaces::kRegistryDir, uid_start, sandbox_dir);
}

void chown_to_sandbox(const std::string& path, SandboxIds ids, uint32_t inside_uid,
                      uint32_t inside_gid) {
  const namespaces::IdMap map = namespaces::plan_id_map_for_host(
      namespaces::current_identity(), 0, 0, namespaces::HostRange{ids.uid_start, ids.gid_start});
  const auto uid = map.host_uid(inside_uid);
  const auto gid = map.host_gid(inside_gid);
  if (!uid || !gid)
    throw Error("chown " + path + ": " + std::to_string(inside_uid) + ":" +
                std::to_string(inside_gid) + " is not mapped in the sandbox's range");
  if (::chown(path.c_str(), *uid, *gid) != 0) throw_errno("chown " + path);
}

std::string overlay_problem(const std::vector<std::string>& lowers,
                            const std::string& scratch_dir) {
  return namespaces::overlay_problem(lowers, scratch_dir);
}

}  // namespace openshell::runtime
