#include "namespaces/id_pool.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"

namespace openshell::namespaces {

namespace {

constexpr const char* kPoolUser = "openshell";
// A sandbox's claim is made just before its directory: younger claims are
// never taken for stale.
constexpr time_t kClaimGraceSeconds = 600;

std::vector<SubordinateRange> others_ranges(std::string_view text) {
  std::vector<SubordinateRange> out;
  for (const auto& raw : text::split(text, '\n')) {
    auto line = text::trim(raw);
    if (line.empty() || line[0] == '#') continue;
    auto fields = text::split(line, ':');
    if (fields.size() != 3 || fields[0] == kPoolUser) continue;
    auto start = text::parse_uint(fields[1], UINT32_MAX);
    auto count = text::parse_uint(fields[2], UINT32_MAX);
    if (start && count && *count > 0)
      out.push_back({static_cast<uint32_t>(*start), static_cast<uint32_t>(*count)});
  }
  return out;
}

// The third field of each line (the id) of /etc/passwd or /etc/group.
std::vector<SubordinateRange> ids_of(std::string_view text) {
  std::vector<SubordinateRange> out;
  for (const auto& line : text::split(text, '\n')) {
    auto fields = text::split(line, ':');
    if (fields.size() < 3) continue;
    if (auto id = text::parse_uint(fields[2], UINT32_MAX))
      out.push_back({static_cast<uint32_t>(*id), 1});
  }
  return out;
}

bool overlaps(uint64_t start, uint64_t count, const SubordinateRange& r) {
  return start < uint64_t{r.start} + r.count && uint64_t{r.start} < start + count;
}

// Whether a claim file's owner is gone. Called under the registry's lock.
bool stale(const std::string& path) {
  std::string text;
  if (files::read_into(path, &text) != 0) return false;
  auto line = std::string(text::trim(text));
  // Claims are written whole under this lock: an empty one is what a crash
  // of the machine left of a run's (not synced).
  if (line.empty()) return true;
  if (line.rfind("run ", 0) == 0) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
    return fd && ::flock(fd.get(), LOCK_EX | LOCK_NB) == 0;
  }
  if (line.rfind("sandbox ", 0) == 0) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0 || std::time(nullptr) - st.st_mtime < kClaimGraceSeconds)
      return false;
    return !files::exists(line.substr(8));
  }
  return false;  // not ours to judge: kept
}

}  // namespace

IdPool pool_from(std::string_view subuid, std::string_view subgid) {
  IdPool pool;
  auto u = find_subordinate(subuid, kPoolUser, UINT32_MAX);
  auto g = find_subordinate(subgid, kPoolUser, UINT32_MAX);
  if (!u || !g) return pool;
  pool.uid_start = u->start;
  pool.gid_start = g->start;
  pool.slots = std::min(u->count, g->count) / kRangeSize;
  return pool;
}

Reserved reserved_from(std::string_view subuid, std::string_view subgid, std::string_view passwd,
                       std::string_view group) {
  Reserved r;
  r.uids = others_ranges(subuid);
  r.gids = others_ranges(subgid);
  for (const auto& id : ids_of(passwd)) r.uids.push_back(id);
  for (const auto& id : ids_of(group)) r.gids.push_back(id);
  r.uids.push_back({kRootRangeStart, kRangeSize});
  r.gids.push_back({kRootRangeStart, kRangeSize});
  return r;
}

bool slot_clear(const IdPool& pool, uint32_t slot, const Reserved& reserved) {
  const uint64_t uid = pool.uid_start + uint64_t{slot} * kRangeSize;
  const uint64_t gid = pool.gid_start + uint64_t{slot} * kRangeSize;
  // The last id, 2^32-1, is "no id" to the kernel.
  if (uid + kRangeSize > UINT32_MAX || gid + kRangeSize > UINT32_MAX) return false;
  for (const auto& r : reserved.uids)
    if (overlaps(uid, kRangeSize, r)) return false;
  for (const auto& r : reserved.gids)
    if (overlaps(gid, kRangeSize, r)) return false;
  return true;
}

RangeClaim& RangeClaim::operator=(RangeClaim&& other) noexcept {
  if (this != &other) {
    if (lock_ && !path_.empty()) ::unlink(path_.c_str());
    range_ = other.range_;
    path_ = std::move(other.path_);
    lock_ = std::move(other.lock_);
    other.path_.clear();
  }
  return *this;
}

RangeClaim::~RangeClaim() {
  // A run's claim goes with it; a sandbox's is released by its delete.
  if (lock_ && !path_.empty()) ::unlink(path_.c_str());
}

RangeClaim claim_range(const std::string& registry_dir, const std::string& owner, bool for_run,
                       const IdPool& pool, const Reserved& reserved) {
  const std::string parent = registry_dir.substr(0, registry_dir.rfind('/'));
  if (!parent.empty() && ::mkdir(parent.c_str(), 0700) != 0 && errno != EEXIST)
    throw_errno("create " + parent);
  if (::mkdir(registry_dir.c_str(), 0700) != 0 && errno != EEXIST)
    throw_errno("create " + registry_dir);
  const std::string lock_path = registry_dir + "/.lock";
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
  if (!lock) throw_errno("open " + lock_path);
  while (::flock(lock.get(), LOCK_EX) != 0)
    if (errno != EINTR) throw_errno("lock " + lock_path);

  // Round robin from after the last claim: a range freed by one sandbox or
  // run goes to another only once the rest of the pool has been used, so
  // files the first left in a shared host directory are not soon the
  // second's.
  const std::string next_path = registry_dir + "/.next";
  uint32_t first = 0;
  if (auto text = files::try_read(next_path))
    if (auto n = text::parse_uint(text::trim(*text), UINT32_MAX)) first = static_cast<uint32_t>(*n);
  for (uint32_t i = 0; i < pool.slots; ++i) {
    const uint32_t slot = pool.slots ? (first + i) % pool.slots : 0;
    if (!slot_clear(pool, slot, reserved)) continue;
    RangeClaim claim;
    claim.range_ = {pool.uid_start + slot * kRangeSize, pool.gid_start + slot * kRangeSize};
    claim.path_ = registry_dir + "/" + std::to_string(claim.range_.uid_start);
    if (files::exists(claim.path_)) {
      if (!stale(claim.path_)) continue;
      ::unlink(claim.path_.c_str());
    }
    UniqueFd fd(
        ::open(claim.path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600));
    if (!fd) throw_errno("create " + claim.path_);
    std::string text =
        for_run ? "run " + std::to_string(::getpid()) + "\n" : "sandbox " + owner + "\n";
    // A sandbox's claim outlives a reboot with the sandbox: synced. A run's
    // is void after one (no process holds its lock), so it is not: what a
    // crash leaves of it, an empty file included, is stale.
    if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size()) ||
        (!for_run && ::fsync(fd.get()) != 0))
      throw_errno("write " + claim.path_);
    if (for_run) {
      if (::flock(fd.get(), LOCK_EX) != 0) throw_errno("lock " + claim.path_);
      claim.lock_ = std::move(fd);
    }
    // Under the lock, not synced (a crash only moves the search's start),
    // and always ten digits: one write over the same bytes replaces it
    // whole. Truncating it first cost ext4 0.7 ms of every run.
    char next[16];
    std::snprintf(next, sizeof next, "%010u\n", slot + 1);
    constexpr size_t kNextSize = 11;
    UniqueFd next_fd(::open(next_path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600));
    struct stat st;
    if (!next_fd || ::pwrite(next_fd.get(), next, kNextSize, 0) != kNextSize ||
        ::fstat(next_fd.get(), &st) != 0 ||
        (st.st_size > static_cast<off_t>(kNextSize) && ::ftruncate(next_fd.get(), kNextSize) != 0))
      throw_errno("write " + next_path);
    return claim;
  }
  throw Error("no free id range for a sandbox: the " + std::to_string(pool.slots) +
              " ranges of the pool are in use or collide with other users' ids (see " +
              registry_dir + " and /etc/subuid)");
}

RangeClaim claim_host_range(const std::string& owner, bool for_run) {
  const std::string subuid = files::try_read("/etc/subuid").value_or("");
  const std::string subgid = files::try_read("/etc/subgid").value_or("");
  return claim_range(kRegistryDir, owner, for_run, pool_from(subuid, subgid),
                     reserved_from(subuid, subgid, files::try_read("/etc/passwd").value_or(""),
                                   files::try_read("/etc/group").value_or("")));
}

RunRelease run_release(const std::string& registry_dir, uint32_t uid_start, pid_t pid) {
  return {registry_dir + "/.lock", registry_dir + "/" + std::to_string(uid_start),
          "run " + std::to_string(pid)};
}

void release_run_range(const RunRelease& release) noexcept {
  UniqueFd lock(::open(release.lock_path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  if (!lock) return;
  while (::flock(lock.get(), LOCK_EX) != 0)
    if (errno != EINTR) return;
  UniqueFd claim(::open(release.claim_path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!claim) return;
  char text[64];
  ssize_t n = ::read(claim.get(), text, sizeof text);
  while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == ' ')) --n;
  // Still that run's, and no process holds it (the stale test above).
  if (n < 0 || static_cast<size_t>(n) != release.text.size() ||
      std::memcmp(text, release.text.data(), static_cast<size_t>(n)) != 0 ||
      ::flock(claim.get(), LOCK_EX | LOCK_NB) != 0)
    return;
  ::unlink(release.claim_path.c_str());
}

void release_sandbox_range(const std::string& registry_dir, uint32_t uid_start,
                           const std::string& owner) {
  const std::string path = registry_dir + "/" + std::to_string(uid_start);
  std::string text;
  if (files::read_into(path, &text) != 0) return;
  if (std::string(text::trim(text)) == "sandbox " + owner) ::unlink(path.c_str());
}

}  // namespace openshell::namespaces
