#include "base/process_name.h"

#include <sys/prctl.h>

#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace openshell::process_name {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<std::string> words(std::vector<const char*> argv) {
  return role_arguments(static_cast<int>(argv.size()), argv.data());
}

TEST(ProcessName, RolesStartedUnderTheirOwnNames) {
  EXPECT_THAT(words({"openshell-gateway", "--ready-fd", "3"}),
              ElementsAre("openshell", "gateway", "run", "--ready-fd", "3"));
  // The sandbox's name is for people reading ps, not for the command line.
  EXPECT_THAT(words({"openshell-supervisor", "demo", "--launch", "/x/launch.cred"}),
              ElementsAre("openshell", "supervisor", "--launch", "/x/launch.cred"));
  EXPECT_THAT(words({"/usr/bin/openshell-gateway"}), ElementsAre("openshell", "gateway", "run"));
  EXPECT_THAT(words({"openshell-supervisor"}), ElementsAre("openshell", "supervisor"));
  // Other names are the command line's own.
  EXPECT_THAT(words({"openshell", "gateway", "run"}), IsEmpty());
  EXPECT_THAT(words({"/proc/self/exe", "supervisor"}), IsEmpty());
  EXPECT_THAT(words({"openshell-gatewayx"}), IsEmpty());
}

TEST(ProcessName, SetCommCutsAtFifteenBytes) {
  // On a thread of its own, so that the test binary keeps its name.
  std::string seen_short, seen_long;
  std::thread([&] {
    char buf[17] = {};
    set_comm(kSupervisorComm);
    ::prctl(PR_GET_NAME, buf, 0, 0, 0);
    seen_short = buf;
    set_comm("openshell-supervisor-long");
    ::prctl(PR_GET_NAME, buf, 0, 0, 0);
    seen_long = buf;
  }).join();
  EXPECT_EQ(seen_short, "osh-supervisor");
  EXPECT_EQ(seen_long, "openshell-super");
}

}  // namespace
}  // namespace openshell::process_name
