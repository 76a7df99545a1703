#include "namespaces/userns.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"

namespace openshell::namespaces {

// For readable failure messages.
void PrintTo(const IdRange& r, std::ostream* os) {
  *os << "{" << r.inside << ", " << r.outside << ", " << r.count << "}";
}

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Optional;

uint64_t total(const std::vector<IdRange>& ranges) {
  uint64_t sum = 0;
  for (const auto& r : ranges) sum += r.count;
  return sum;
}

// --- find_subordinate -------------------------------------------------------

constexpr const char* kSubuid =
    "# subordinate ids\n"
    "\n"
    "alice:100000:65536\n"
    "1001:200000:65536\n"
    "  bob:300000:1000  \n";

TEST(FindSubordinate, ByName) {
  auto r = find_subordinate(kSubuid, "alice", 1000);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->start, 100000u);
  EXPECT_EQ(r->count, 65536u);
}

TEST(FindSubordinate, ByUid) {
  auto r = find_subordinate(kSubuid, "carol", 1001);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->start, 200000u);
}

TEST(FindSubordinate, TrimsWhitespace) {
  auto r = find_subordinate(kSubuid, "bob", 5);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->start, 300000u);
  EXPECT_EQ(r->count, 1000u);
}

TEST(FindSubordinate, NoEntry) {
  EXPECT_FALSE(find_subordinate(kSubuid, "nobody", 7).has_value());
  EXPECT_FALSE(find_subordinate("", "alice", 1000).has_value());
}

TEST(FindSubordinate, SkipsCommentsAndMalformedLines) {
  constexpr const char* text =
      "#alice:1:2\n"
      "alice:abc:65536\n"
      "alice:1:2:3\n"
      "alice:5\n"
      "alice:100:0\n"
      "alice:-5:10\n"
      "alice:1:4294967296\n"
      "alice:400000:65536\n";
  auto r = find_subordinate(text, "alice", 1000);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->start, 400000u);
  EXPECT_EQ(r->count, 65536u);
}

TEST(FindSubordinate, FirstMatchWins) {
  auto r = find_subordinate("alice:100000:65536\nalice:500000:65536\n", "alice", 1000);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->start, 100000u);
  // A line matching the uid before one matching the name wins too.
  r = find_subordinate("1000:700000:10\nalice:100000:65536\n", "alice", 1000);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->start, 700000u);
  EXPECT_EQ(r->count, 10u);
}

TEST(FindSubordinate, NameMustMatchWholly) {
  EXPECT_FALSE(find_subordinate("alice2:100000:65536\n", "alice", 1000).has_value());
  EXPECT_FALSE(find_subordinate("10000:100000:65536\n", "alice", 1000).has_value());
}

// --- plan_id_map: root caller -------------------------------------------------

const Identity kRoot{0, 0, "root"};
const Identity kAlice{1000, 1000, "alice"};

TEST(PlanIdMapRoot, DefaultRange) {
  IdMap map = plan_id_map(kRoot, 1000, 1000, std::nullopt, std::nullopt, false);
  EXPECT_EQ(map.method, IdMap::Method::kDirect);
  EXPECT_FALSE(map.deny_setgroups);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, kRootRangeStart, kRangeSize}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{0, kRootRangeStart, kRangeSize}));
  EXPECT_THAT(map.host_uid(0), Optional(kRootRangeStart));
  EXPECT_THAT(map.host_uid(1000), Optional(kRootRangeStart + 1000));
  EXPECT_THAT(map.host_gid(65535), Optional(kRootRangeStart + 65535));
  EXPECT_EQ(map.host_uid(65536), std::nullopt);
  EXPECT_FALSE(map.is_single());
}

TEST(PlanIdMapRoot, UsesRootsSubordinateRangeCappedAt65536) {
  IdMap map = plan_id_map(kRoot, 0, 0, SubordinateRange{500000, 100000},
                          SubordinateRange{600000, 70000}, true);
  EXPECT_EQ(map.method, IdMap::Method::kDirect);  // root writes the map itself
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 500000, kRangeSize}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{0, 600000, kRangeSize}));
  EXPECT_THAT(map.host_uid(0), Optional(500000u));  // root inside is not root outside
}

TEST(PlanIdMapRoot, SmallRangeLimitsTheIds) {
  IdMap map = plan_id_map(kRoot, 999, 5, SubordinateRange{500000, 1000},
                          SubordinateRange{600000, 10}, false);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 500000, 1000}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{0, 600000, 10}));
}

TEST(PlanIdMapRoot, TargetOutsideRangeThrows) {
  try {
    plan_id_map(kRoot, 1000, 0, SubordinateRange{500000, 1000}, std::nullopt, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("user id 1000 is outside the sandbox's ids (0-999)"));
  }
  try {
    plan_id_map(kRoot, 0, 70000, std::nullopt, std::nullopt, false);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("group id 70000 is outside the sandbox's ids (0-65535)"));
  }
  EXPECT_THROW(plan_id_map(kRoot, 65536, 0, std::nullopt, std::nullopt, false), Error);
}

// --- plan_id_map: rootless with newuidmap and /etc/subuid -----------------------

TEST(PlanIdMapHelper, KeepIdLayout) {
  IdMap map = plan_id_map(kAlice, 1000, 1000, SubordinateRange{100000, 65536},
                          SubordinateRange{300000, 65536}, true);
  EXPECT_EQ(map.method, IdMap::Method::kHelper);
  EXPECT_FALSE(map.deny_setgroups);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 100000, 1000}, IdRange{1000, 1000, 1},
                                   IdRange{1001, 101000, 64535}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{0, 300000, 1000}, IdRange{1000, 1000, 1},
                                   IdRange{1001, 301000, 64535}));
  EXPECT_EQ(total(map.uid), kRangeSize);
  EXPECT_EQ(total(map.gid), kRangeSize);
  EXPECT_THAT(map.host_uid(1000), Optional(1000u));  // the sandbox user is the caller
  EXPECT_THAT(map.host_uid(0), Optional(100000u));
  EXPECT_THAT(map.host_uid(999), Optional(100999u));
  EXPECT_THAT(map.host_uid(1001), Optional(101000u));
  EXPECT_THAT(map.host_uid(65535), Optional(165534u));
  EXPECT_EQ(map.host_uid(65536), std::nullopt);
  EXPECT_FALSE(map.is_single());
  // Every other id stays inside the subordinate range.
  for (uint32_t inside : {0u, 1u, 999u, 1001u, 40000u, 65535u}) {
    auto host = map.host_uid(inside);
    ASSERT_TRUE(host.has_value()) << inside;
    EXPECT_GE(*host, 100000u) << inside;
    EXPECT_LT(*host, 100000u + 65536u) << inside;
  }
}

TEST(PlanIdMapHelper, TargetZero) {
  IdMap map = plan_id_map(kAlice, 0, 0, SubordinateRange{100000, 65536},
                          SubordinateRange{100000, 65536}, true);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 1000, 1}, IdRange{1, 100000, 65535}));
  EXPECT_EQ(total(map.uid), kRangeSize);
  EXPECT_THAT(map.host_uid(0), Optional(1000u));
}

TEST(PlanIdMapHelper, DifferentGroup) {
  Identity caller{1000, 2000, "alice"};
  IdMap map = plan_id_map(caller, 1000, 100, SubordinateRange{100000, 65536},
                          SubordinateRange{300000, 65536}, true);
  EXPECT_THAT(map.gid, ElementsAre(IdRange{0, 300000, 100}, IdRange{100, 2000, 1},
                                   IdRange{101, 300100, 65435}));
  EXPECT_THAT(map.host_gid(100), Optional(2000u));
}

TEST(PlanIdMapHelper, RangeSmallerThanTarget) {
  IdMap map = plan_id_map(kAlice, 1000, 1000, SubordinateRange{100000, 500},
                          SubordinateRange{100000, 500}, true);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 100000, 500}, IdRange{1000, 1000, 1}));
  EXPECT_EQ(total(map.uid), 501u);
  EXPECT_EQ(map.host_uid(600), std::nullopt);
  EXPECT_THAT(map.host_uid(499), Optional(100499u));
}

TEST(PlanIdMapHelper, TargetAboveTheUsualRange) {
  IdMap map = plan_id_map(kAlice, 70000, 70000, SubordinateRange{100000, 65536},
                          SubordinateRange{100000, 65536}, true);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 100000, 65536}, IdRange{70000, 1000, 1}));
}

// --- plan_id_map: rootless, no helpers ------------------------------------------

TEST(PlanIdMapSingle, WithoutHelpers) {
  IdMap map = plan_id_map(kAlice, 1000, 1000, SubordinateRange{100000, 65536},
                          SubordinateRange{100000, 65536}, false);
  EXPECT_EQ(map.method, IdMap::Method::kDirect);
  EXPECT_TRUE(map.deny_setgroups);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{1000, 1000, 1}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{1000, 1000, 1}));
  EXPECT_TRUE(map.is_single());
  EXPECT_EQ(map.host_uid(0), std::nullopt);
}

TEST(PlanIdMapSingle, HelpersButNoSubordinateRange) {
  Identity caller{1000, 1001, "alice"};
  IdMap map =
      plan_id_map(caller, 0, 5, SubordinateRange{100000, 65536}, std::nullopt, /*helpers=*/true);
  EXPECT_EQ(map.method, IdMap::Method::kDirect);
  EXPECT_TRUE(map.deny_setgroups);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 1000, 1}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{5, 1001, 1}));
  EXPECT_THAT(map.host_gid(5), Optional(1001u));
}

TEST(IdMap, Describe) {
  IdMap single = plan_id_map(kAlice, 1000, 1000, std::nullopt, std::nullopt, false);
  EXPECT_EQ(single.describe(), "direct uid 1000->1000+1 gid 1000->1000+1 setgroups=deny");
  IdMap helper = plan_id_map(kAlice, 0, 0, SubordinateRange{100000, 65536},
                             SubordinateRange{200000, 65536}, true);
  EXPECT_EQ(helper.describe(),
            "newuidmap uid 0->1000+1,1->100000+65535 gid 0->1000+1,1->200000+65535");
  IdMap root = plan_id_map(kRoot, 0, 0, std::nullopt, std::nullopt, false);
  EXPECT_EQ(root.describe(), "direct uid 0->1879048192+65536 gid 0->1879048192+65536");
}

TEST(IdMap, IsSingleNeedsOneIdInOneRange) {
  IdMap map;
  map.uid = {{0, 1000, 1}};
  EXPECT_TRUE(map.is_single());
  map.uid = {{0, 1000, 2}};
  EXPECT_FALSE(map.is_single());
  map.uid = {{0, 1000, 1}, {1, 5000, 1}};
  EXPECT_FALSE(map.is_single());
}

// --- a nested user namespace's root (the runtime under rootless Podman) ------

TEST(ParseIdMap, ReadsProcsColumns) {
  EXPECT_THAT(parse_id_map("         0       1001          1\n         1     100000      65536\n"),
              ElementsAre(IdRange{0, 1001, 1}, IdRange{1, 100000, 65536}));
  EXPECT_THAT(parse_id_map("0 0 4294967295\n"), ElementsAre(IdRange{0, 0, UINT32_MAX}));
  EXPECT_THAT(parse_id_map("0 1\nx y z\n5 6 0\n\n7 8 9"), ElementsAre(IdRange{7, 8, 9}));
}

TEST(ParseIdMap, OnlyTheWholeRangeIsTheInitialNamespace) {
  EXPECT_TRUE(is_initial_map(parse_id_map("         0          0 4294967295\n")));
  EXPECT_FALSE(is_initial_map(parse_id_map("0 0 4294967294\n")));
  EXPECT_FALSE(is_initial_map(parse_id_map("0 1001 1\n1 100000 65536\n")));
  EXPECT_FALSE(is_initial_map({}));
}

TEST(PlanNestedRoot, EachIdOfTheOwnNamespaceIsItself) {
  // Podman's namespace: 0 is the user, 1-65536 and 65537-131072 its two
  // subordinate ranges; inside, the same ids, range for range (the kernel
  // refuses a line that spans two of the parent's).
  const std::vector<IdRange> own_uid = {{0, 1001, 1}, {1, 100000, 65536}, {65537, 500000, 65536}};
  const std::vector<IdRange> own_gid = {{0, 1001, 1}, {1, 200000, 1000}};
  IdMap map = plan_nested_root_map(own_uid, own_gid, 0, 0);
  EXPECT_EQ(map.method, IdMap::Method::kDirect);
  EXPECT_FALSE(map.deny_setgroups);
  EXPECT_THAT(map.uid,
              ElementsAre(IdRange{0, 0, 1}, IdRange{1, 1, 65536}, IdRange{65537, 65537, 65536}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{0, 0, 1}, IdRange{1, 1, 1000}));
  EXPECT_THAT(map.host_uid(65537), Optional(65537u));
  EXPECT_EQ(map.host_gid(1001), std::nullopt);
}

TEST(PlanNestedRoot, InOrderWithGapsKept) {
  IdMap map = plan_nested_root_map({{1000, 1000, 1}, {0, 5000, 10}}, {{0, 7, 1}}, 1000, 0);
  EXPECT_THAT(map.uid, ElementsAre(IdRange{0, 0, 10}, IdRange{1000, 1000, 1}));
  EXPECT_THAT(map.gid, ElementsAre(IdRange{0, 0, 1}));
}

TEST(PlanNestedRoot, TargetOutsideTheNamespaceThrows) {
  try {
    plan_nested_root_map({{0, 1001, 1}}, {{0, 1001, 1}}, 1000, 0);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("user id 1000 is not mapped in the runtime's user namespace"));
  }
  EXPECT_THROW(plan_nested_root_map({{0, 1001, 1}}, {{0, 1001, 1}}, 0, 5), Error);
}

}  // namespace
}  // namespace openshell::namespaces
