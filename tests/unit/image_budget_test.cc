#include <algorithm>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "image/budget.h"
#include "test_util.h"

namespace openshell::image {
namespace {

using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using ::testing::HasSubstr;

std::string add_error(UnpackBudget& budget, uint64_t bytes) {
  try {
    budget.add_entry(bytes);
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(UnpackBudget, CountsEntriesUpToTheBound) {
  TempDir store;
  ScopedEnv env("OPENSHELL_MAX_UNPACKED", nullptr);
  UnpackBudget budget("bomb:1", store.path(), 10000);
  EXPECT_EQ(budget.limit(), 10000u);
  EXPECT_EQ(add_error(budget, 4000), "<no error>");
  EXPECT_EQ(add_error(budget, 6000), "<no error>");  // exactly the bound
  EXPECT_EQ(add_error(budget, 1),
            "bomb:1: unpacks to more than 9.8 KiB (--max-unpacked-size); set a larger bound with "
            "--max-unpacked-size SIZE or OPENSHELL_MAX_UNPACKED=SIZE");
}

TEST(UnpackBudget, TheEnvironmentSetsTheBoundUnlessTheOptionDoes) {
  TempDir store;
  ScopedEnv env("OPENSHELL_MAX_UNPACKED", "1M");
  UnpackBudget from_env("img", store.path(), 0);
  EXPECT_EQ(from_env.limit(), 1u << 20);
  EXPECT_THAT(add_error(from_env, (1u << 20) + 1),
              HasSubstr("img: unpacks to more than 1.0 MiB (OPENSHELL_MAX_UNPACKED)"));
  UnpackBudget from_option("img", store.path(), 5000);
  EXPECT_EQ(from_option.limit(), 5000u);
  ScopedEnv bad("OPENSHELL_MAX_UNPACKED", "lots");
  try {
    UnpackBudget b("img", store.path(), 0);
    FAIL() << "a bad OPENSHELL_MAX_UNPACKED was taken";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "OPENSHELL_MAX_UNPACKED=lots: not a size (like 512M or 20G)");
  }
}

TEST(UnpackBudget, DefaultIsAShareOfTheFreeSpace) {
  TempDir store;
  ScopedEnv env("OPENSHELL_MAX_UNPACKED", nullptr);
  const uint64_t before = free_space(store.path());
  UnpackBudget budget("img", store.path(), 0);
  const uint64_t free = free_space(store.path());
  ASSERT_GT(free, 0u);
  // Others may write to that file system meanwhile: within what was free.
  const uint64_t low = std::min(before, free), high = std::max(before, free);
  EXPECT_GE(budget.limit(), std::min(kDefaultMaxUnpacked, low / 10 * 9) - (uint64_t{64} << 20));
  EXPECT_LE(budget.limit(), std::min(kDefaultMaxUnpacked, high / 10 * 9) + (uint64_t{64} << 20));
  EXPECT_NO_THROW(budget.check_free_space(free / 2));
  try {
    budget.check_free_space(free + (uint64_t{1} << 30));
    FAIL() << "more than the free space was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("img: its layers take "));
    EXPECT_THAT(std::string(e.what()), HasSubstr(" free on " + store.path()));
  }
}

}  // namespace
}  // namespace openshell::image
