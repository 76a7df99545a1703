#include "runtime/caps.h"

#include <linux/capability.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/files.h"
#include "base/text.h"
#include "test_util.h"

namespace openshell::runtime::caps {
namespace {

using ::testing::HasSubstr;

TEST(CapsParse, NamesWithAndWithoutPrefix) {
  EXPECT_EQ(parse({"NET_ADMIN"}), Set{1} << 12);
  EXPECT_EQ(parse({"NET_ADMIN"}), Set{1} << CAP_NET_ADMIN);
  EXPECT_EQ(parse({"cap_sys_ptrace"}), Set{1} << 19);
  EXPECT_EQ(parse({"Net_Raw"}), Set{1} << CAP_NET_RAW);
  EXPECT_EQ(parse({" chown "}), Set{1} << CAP_CHOWN);
  EXPECT_EQ(parse({"NET_ADMIN", "CAP_SYS_PTRACE", "net_admin"}), (Set{1} << 12) | (Set{1} << 19));
  EXPECT_EQ(parse({}), 0u);
}

TEST(CapsParse, AllCoversEveryKnownCapability) {
  Set all = parse({"ALL"});
  for (int i = 0; i <= last_cap(); ++i) EXPECT_TRUE(all & (Set{1} << i)) << "bit " << i;
  // No bit beyond last_cap().
  const Set known = last_cap() >= 63 ? ~Set{0} : (Set{1} << (last_cap() + 1)) - 1;
  EXPECT_EQ(all & ~known, 0u) << "bits beyond last_cap()";
  EXPECT_EQ(parse({"all"}), all);
}

TEST(CapsParse, UnknownNameThrows) {
  for (const char* bad : {"NET_FOO", "", "12", "CAP_", "ALL_OF_THEM", "NET_ADMINS"}) {
    try {
      parse({"NET_ADMIN", bad});
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()), std::string("--cap-add ") + bad + ": unknown capability");
    }
  }
}

// Regression (caps.cc parse, fixed): libcap's cap_from_name() matches the longest leading
// run of letters and '_' against its table and ignores what follows, and
// parse() does not check that the whole name was consumed. "NET_ADMIN2" and
// "NET_ADMIN!" are taken as NET_ADMIN, and "SYS_ADMIN,KILL" grants SYS_ADMIN
// and silently drops KILL.
TEST(CapsParse, TrailingCharactersAreRefused) {
  for (const char* bad : {"NET_ADMIN2", "NET_ADMIN!", "SYS_ADMIN,KILL", "CAP_CHOWN x"})
    EXPECT_THROW(parse({bad}), Error) << "accepted '" << bad << "' as " << describe(parse({bad}));
}

TEST(CapsDescribe, UpperCaseNamesInBitOrder) {
  EXPECT_EQ(describe(0), "none");
  EXPECT_EQ(describe(Set{1} << 12), "CAP_NET_ADMIN");
  EXPECT_EQ(describe((Set{1} << 19) | (Set{1} << 12)), "CAP_NET_ADMIN,CAP_SYS_PTRACE");
  EXPECT_EQ(describe(Set{1} << 0), "CAP_CHOWN");
}

TEST(CapsDescribe, RoundTripsThroughParse) {
  Set set = (Set{1} << CAP_KILL) | (Set{1} << CAP_SETUID) | (Set{1} << CAP_SYS_ADMIN);
  std::vector<std::string> names = text::split(describe(set), ',');
  EXPECT_EQ(names.size(), 3u);
  EXPECT_EQ(parse(names), set);
  Set all = parse({"ALL"});
  EXPECT_EQ(parse(text::split(describe(all), ',')), all);
}

TEST(CapsLastCap, MatchesTheKernel) {
  auto text = files::try_read("/proc/sys/kernel/cap_last_cap");
  if (!text) GTEST_SKIP() << "no /proc/sys/kernel/cap_last_cap";
  EXPECT_EQ(std::to_string(last_cap()), std::string(text::trim(*text)));
  EXPECT_GE(last_cap(), CAP_AUDIT_READ);  // 37, in every kernel this runs on
}

}  // namespace
}  // namespace openshell::runtime::caps
