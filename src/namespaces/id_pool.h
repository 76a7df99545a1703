// Host id ranges for root's sandboxes, one per sandbox: uid 1000 of one
// sandbox is never uid 1000 of another, so one sandbox's files are not
// another's.
//
// The pool is the `openshell` user's entries in /etc/subuid and /etc/subgid
// when they exist (a packaged install declares them), else the built-in
// kPoolStart + kPoolSlots ranges of kRangeSize ids. A range that overlaps
// another user's subordinate ids, an id in /etc/passwd or /etc/group, or the
// shared range sandboxes used before (kRootRangeStart) is never handed out.
//
// Claims live in one host-wide directory (kRegistryDir), one file per range,
// named by its first uid, made with O_EXCL under a lock:
//  - "sandbox DIR": a gateway sandbox's, durable until the sandbox is
//    deleted (it is in the sandbox's spec as well); stale once DIR is gone;
//  - "run PID": `openshell run`'s, flock-held for the run; stale once no
//    one holds the lock.
// Ranges are handed out round robin (.next holds where the next search
// starts).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/unique_fd.h"
#include "namespaces/userns.h"

namespace openshell::namespaces {

inline constexpr uint32_t kPoolStart = kRootRangeStart + kRangeSize;  // past the shared range
inline constexpr uint32_t kPoolSlots = 4096;
inline constexpr const char* kRegistryDir = "/var/lib/openshell/id-ranges";

struct IdPool {
  uint32_t uid_start = kPoolStart;
  uint32_t gid_start = kPoolStart;
  uint32_t slots = kPoolSlots;
};

// The pool from /etc/subuid and /etc/subgid text: the `openshell` entries,
// else the built-in one.
IdPool pool_from(std::string_view subuid, std::string_view subgid);

// Ids a range must not overlap, from the host's files: every subordinate
// range of a user other than `openshell`, every id of /etc/passwd (uids)
// or /etc/group (gids), and the shared range of older sandboxes.
struct Reserved {
  std::vector<SubordinateRange> uids, gids;
};
Reserved reserved_from(std::string_view subuid, std::string_view subgid, std::string_view passwd,
                       std::string_view group);

// Whether slot i of the pool is free of every reserved id.
bool slot_clear(const IdPool& pool, uint32_t slot, const Reserved& reserved);

// A claimed range. A run's claim is released (its file removed) when the
// object goes; a sandbox's stays until release_sandbox_range().
class RangeClaim {
 public:
  RangeClaim() = default;
  RangeClaim(RangeClaim&&) noexcept = default;
  RangeClaim& operator=(RangeClaim&&) noexcept;
  ~RangeClaim();
  HostRange range() const { return range_; }

 private:
  friend RangeClaim claim_range(const std::string&, const std::string&, bool, const IdPool&,
                                const Reserved&);
  HostRange range_{};
  std::string path_;
  UniqueFd lock_;  // a run's: held while it lives
};

// Claims the first free range of the pool in registry_dir (made 0700 when
// missing). owner: the sandbox's directory (for_run false) or ignored (a
// run: its pid). Throws Error when the pool is exhausted.
RangeClaim claim_range(const std::string& registry_dir, const std::string& owner, bool for_run,
                       const IdPool& pool, const Reserved& reserved);

// The same with the host's files and kRegistryDir.
RangeClaim claim_host_range(const std::string& owner, bool for_run);

// Frees the range of a run that ended without doing so (killed), if the
// claim is still that process's and no process holds it: for the helper
// that outlives it. That helper shares the run's memory (a clone without a
// copy of it), so the paths are made beforehand and the release itself
// allocates nothing.
struct RunRelease {
  std::string lock_path, claim_path, text;  // text: the claim's line, "run PID"
};
RunRelease run_release(const std::string& registry_dir, uint32_t uid_start, pid_t pid);
void release_run_range(const RunRelease& release) noexcept;

// Frees a sandbox's range (its claim file), if it is this owner's.
void release_sandbox_range(const std::string& registry_dir, uint32_t uid_start,
                           const std::string& owner);

}  // namespace openshell::namespaces
