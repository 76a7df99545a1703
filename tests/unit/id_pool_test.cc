#include "namespaces/id_pool.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/files.h"
#include "test_util.h"

namespace openshell::namespaces {
namespace {

constexpr const char* kNoSubuid = "";

TEST(IdPool, BuiltInUnlessTheOpenshellUserHasEntries) {
  IdPool pool = pool_from(kNoSubuid, kNoSubuid);
  EXPECT_EQ(pool.uid_start, kPoolStart);
  EXPECT_EQ(pool.gid_start, kPoolStart);
  EXPECT_EQ(pool.slots, kPoolSlots);
  EXPECT_GT(kPoolStart, kRootRangeStart)
      << "the shared range of older sandboxes is not in the pool";
  pool = pool_from("alice:100000:65536\nopenshell:2147483648:655360\n",
                   "openshell:3000000000:262144\n");
  EXPECT_EQ(pool.uid_start, 2147483648u);
  EXPECT_EQ(pool.gid_start, 3000000000u);
  EXPECT_EQ(pool.slots, 4u);  // the smaller of the two
  // Only one of the two files: the built-in pool.
  EXPECT_EQ(pool_from("openshell:2147483648:655360\n", "").uid_start, kPoolStart);
}

TEST(IdPool, SlotsCollidingWithOtherUsersIdsAreSkipped) {
  IdPool pool{1000000, 1000000, 8};
  // alice's range covers slot 1; uid 1000000 + 2*65536 + 5 is in /etc/passwd
  // (slot 2); a group id is in slot 3; openshell's own entry is no collision.
  Reserved r = reserved_from("alice:1065536:10\nopenshell:1000000:524288\n", "",
                             "root:x:0:0::/root:/bin/sh\nsvc:x:1131077:1131077::/:/bin/false\n",
                             "grp:x:1196613:\n");
  EXPECT_TRUE(slot_clear(pool, 0, r));
  EXPECT_FALSE(slot_clear(pool, 1, r));
  EXPECT_FALSE(slot_clear(pool, 2, r));
  EXPECT_FALSE(slot_clear(pool, 3, r));
  EXPECT_TRUE(slot_clear(pool, 4, r));
  // The shared range, and ids past 2^32-1, never.
  EXPECT_FALSE(slot_clear(IdPool{kRootRangeStart - 100, kPoolStart, 1}, 0, r));
  EXPECT_FALSE(slot_clear(IdPool{UINT32_MAX - 65535, kPoolStart, 1}, 0, r));
  EXPECT_TRUE(slot_clear(IdPool{UINT32_MAX - 65536, kPoolStart, 1}, 0, r));
}

TEST(IdPool, ClaimsDoNotOverlapAndSurviveARestart) {
  openshell::testing::TempDir dir;
  const std::string registry = dir.path() + "/ids";
  IdPool pool{1000000, 2000000, 4};
  Reserved r = reserved_from("alice:1065536:1\n", "", "", "");  // slot 1 taken by alice
  std::string a = dir.path() + "/sandboxes/a", b = dir.path() + "/sandboxes/b";
  HostRange first = claim_range(registry, a, false, pool, r).range();
  HostRange second = claim_range(registry, b, false, pool, r).range();
  EXPECT_EQ(first, (HostRange{1000000, 2000000}));
  EXPECT_EQ(second, (HostRange{1000000 + 2 * 65536, 2000000 + 2 * 65536}));
  // A new process (a restarted gateway) reads the claims from disk: a third
  // sandbox gets the last free one, a fourth none.
  HostRange third = claim_range(registry, dir.path() + "/sandboxes/c", false, pool, r).range();
  EXPECT_EQ(third.uid_start, 1000000u + 3 * 65536);
  EXPECT_THROW(claim_range(registry, dir.path() + "/sandboxes/d", false, pool, r), Error);
  // A delete frees its range, for the next sandbox; another owner's release
  // does nothing.
  release_sandbox_range(registry, second.uid_start, a);
  EXPECT_THROW(claim_range(registry, dir.path() + "/sandboxes/d", false, pool, r), Error);
  release_sandbox_range(registry, second.uid_start, b);
  EXPECT_EQ(claim_range(registry, dir.path() + "/sandboxes/d", false, pool, r).range(), second);
  struct stat st;
  ASSERT_EQ(::stat(registry.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(IdPool, ARunsClaimLastsAsLongAsTheRun) {
  openshell::testing::TempDir dir;
  const std::string registry = dir.path() + "/ids";
  IdPool pool{1000000, 1000000, 3};
  Reserved none;
  {
    RangeClaim run = claim_range(registry, "", true, pool, none);
    EXPECT_EQ(run.range().uid_start, 1000000u);
    EXPECT_EQ(::access((registry + "/1000000").c_str(), F_OK), 0);
    // While it holds it, others get another.
    EXPECT_EQ(claim_range(registry, "", true, pool, none).range().uid_start, 1000000u + 65536);
  }
  // Gone with it.
  EXPECT_EQ(::access((registry + "/1000000").c_str(), F_OK), -1);
  // Round robin: the next run gets the range after the last one claimed.
  EXPECT_EQ(claim_range(registry, "", true, pool, none).range().uid_start, 1000000u + 2 * 65536);
  // A run killed without cleaning up leaves a file no one holds: stale,
  // and claimed again when its turn comes.
  pid_t child = ::fork();
  if (child == 0) {
    RangeClaim run = claim_range(registry, "", true, pool, none);
    ::_exit(run.range().uid_start == 1000000u ? 0 : 1);  // no destructor runs
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_EQ(::access((registry + "/1000000").c_str(), F_OK), 0) << "the killed run's claim";
  // The helper that outlives a run frees it; only that run's.
  release_run_range(run_release(registry, 1000000, child + 1));
  EXPECT_EQ(::access((registry + "/1000000").c_str(), F_OK), 0);
  release_run_range(run_release(registry, 1000000, child));
  EXPECT_EQ(::access((registry + "/1000000").c_str(), F_OK), -1);
  RangeClaim held = claim_range(registry, "", true, pool, none);   // slot 1
  RangeClaim held2 = claim_range(registry, "", true, pool, none);  // slot 2
  EXPECT_EQ(claim_range(registry, "", true, pool, none).range().uid_start, 1000000u);
}

TEST(IdPool, WhereTheNextSearchStartsIsWrittenWhole) {
  // A shorter number over a longer one: "3\n" over "1000\n" once read
  // "3\n00\n", which is no number, and every search started at the first
  // range again. Now it is always ten digits and a newline.
  openshell::testing::TempDir dir;
  const std::string registry = dir.path() + "/ids";
  IdPool pool{1000000, 1000000, 4};
  Reserved none;
  ASSERT_EQ(::mkdir(registry.c_str(), 0700), 0);
  openshell::files::write_atomically(registry + "/.next", "0002\n");
  RangeClaim first = claim_range(registry, "", true, pool, none);
  EXPECT_EQ(first.range().uid_start, 1000000u + 2 * 65536);
  EXPECT_EQ(openshell::files::read(registry + "/.next"), "0000000003\n");
  // A longer file than that (of an earlier form) is cut to it.
  openshell::files::write_atomically(registry + "/.next", "3\n\n\n\n\n\n\n\n\n\n\n\n");
  RangeClaim after_long = claim_range(registry, "", true, pool, none);
  EXPECT_EQ(after_long.range().uid_start, 1000000u + 3 * 65536);
  EXPECT_EQ(openshell::files::read(registry + "/.next"), "0000000004\n");
  // Past the last range the search wraps to the first.
  RangeClaim second = claim_range(registry, "", true, pool, none);
  EXPECT_EQ(second.range().uid_start, 1000000u);
}

TEST(IdPool, AnEmptyClaimIsWhatACrashLeftAndIsTakenAgain) {
  openshell::testing::TempDir dir;
  const std::string registry = dir.path() + "/ids";
  IdPool pool{1000000, 1000000, 2};
  Reserved none;
  // A run's claim is not synced: after a crash of the machine its file may
  // be there, empty. The ranges must not be lost to such files.
  ASSERT_EQ(::mkdir(registry.c_str(), 0700), 0);
  for (const char* slot : {"/1000000", "/1065536"}) {
    int fd = ::open((registry + slot).c_str(), O_WRONLY | O_CREAT | O_EXCL, 0600);
    ASSERT_GE(fd, 0);
    ::close(fd);
  }
  RangeClaim first = claim_range(registry, "", true, pool, none);
  RangeClaim second = claim_range(registry, "", true, pool, none);
  EXPECT_NE(first.range().uid_start, second.range().uid_start);
  // Both were taken: a third finds none. A file of text that is not a
  // claim of ours is kept, and its range with it.
  EXPECT_THROW(claim_range(registry, "", true, pool, none), Error);
  const std::string other = dir.path() + "/ids2";
  ASSERT_EQ(::mkdir(other.c_str(), 0700), 0);
  ASSERT_EQ(openshell::files::write_once(other + "/1000000", "someone else's\n"), 0);
  EXPECT_THROW(claim_range(other, "", true, IdPool{1000000, 1000000, 1}, none), Error);
}

}  // namespace
}  // namespace openshell::namespaces
