// As root, each sandbox has host ids of its own: uid 1000 of one sandbox is
// not uid 1000 of another (of the same gateway, of another gateway, or of
// an `openshell run`), so one sandbox's files are never another's.
// Rootless sandboxes use their user's own subordinate ids, as before.
#include <sys/stat.h>
#include <unistd.h>

#include <set>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;

namespace e2e {
namespace {

class IdRanges : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    if (mode() != Mode::kRoot)
      GTEST_SKIP() << "per-sandbox ranges are root's; rootless uses the user's subuid";
    static int counter = 0;
    for (int i = 0; i < 2; ++i)
      homes_.push_back(make_dir(mode(), "ids-home-" + std::to_string(++counter), 0700));
  }
  void TearDown() override {
    for (const auto& home : homes_)
      EXPECT_EQ(stop_gateway(mode(), home), std::vector<std::string>{}) << "gateway left: " << home;
    ModeTest::TearDown();
  }
  Result os(const std::string& home, const std::vector<std::string>& args) {
    Options o;
    o.env.push_back("OPENSHELL_HOME=" + home);
    return openshell(mode(), args, o);
  }
  std::string id_of(const std::string& home, const std::string& name) {
    Result r = os(home, {"sandbox", "get", name, "-o", "json"});
    auto pos = r.out.find("\"id\": \"");
    return pos == std::string::npos ? "" : r.out.substr(pos + 7, 12);
  }
  // The host owner of a file the sandbox's uid 1000 wrote in /sandbox.
  uid_t owner_of_note(const std::string& home, const std::string& name) {
    struct stat st;
    std::string path = home + "/sandboxes/" + id_of(home, name) + "/layer/upper/sandbox/note";
    return ::stat(path.c_str(), &st) == 0 ? st.st_uid : static_cast<uid_t>(-1);
  }
  std::vector<std::string> homes_;
};
E2E_ALL_MODES(IdRanges);

TEST_P(IdRanges, EverySandboxHasItsOwnHostIds) {
  const std::string& a = homes_[0];
  const std::string& b = homes_[1];
  // Two sandboxes of one gateway, one of another.
  for (const auto& [home, name] :
       {std::pair{a, "one"}, std::pair{a, "two"}, std::pair{b, "three"}}) {
    ASSERT_EQ(os(home, {"sandbox", "create", "--name", name, "--from", rootfs()}).status, 0);
    Result w = os(home, {"sandbox", "exec", name, "--", "sh", "-c",
                         "id -u; echo secret > /sandbox/note; chmod 600 /sandbox/note"});
    ASSERT_EQ(w.status, 0) << w.err;
    EXPECT_EQ(w.out, "1000\n");
  }
  std::set<uid_t> owners = {owner_of_note(a, "one"), owner_of_note(a, "two"),
                            owner_of_note(b, "three")};
  EXPECT_EQ(owners.size(), 3u) << "two sandboxes' uid 1000 are the same host uid";
  EXPECT_EQ(owners.count(static_cast<uid_t>(-1)), 0u);
  EXPECT_EQ(owners.count(0x70000000 + 1000), 0u) << "the shared range of older sandboxes";
  // An `openshell run` gets yet another.
  Result run = sandbox(mode(), {}, {"cat", "/proc/self/uid_map"});
  ASSERT_EQ(run.status, 0) << run.err;
  std::istringstream map(run.out);
  uint32_t inside = 1, outside = 0, count = 0;
  map >> inside >> outside >> count;
  EXPECT_EQ(inside, 0u);
  EXPECT_EQ(owners.count(outside + 1000), 0u) << run.out;

  // A stop and start keep the range: the sandbox's files stay its own.
  uid_t before = owner_of_note(a, "one");
  ASSERT_EQ(os(a, {"sandbox", "stop", "one"}).status, 0);
  ASSERT_EQ(os(a, {"sandbox", "start", "one"}).status, 0);
  Result again = os(a, {"sandbox", "exec", "one", "--", "sh", "-c",
                        "cat /sandbox/note && echo more >> /sandbox/note"});
  EXPECT_EQ(again.status, 0) << again.err;
  EXPECT_EQ(again.out, "secret\n");
  EXPECT_EQ(owner_of_note(a, "one"), before);

  // A gateway restart does not hand a live range out again.
  ASSERT_EQ(os(a, {"gateway", "stop"}).status, 0);
  ASSERT_EQ(os(a, {"sandbox", "create", "--name", "four", "--from", rootfs()}).status, 0);
  ASSERT_EQ(os(a, {"sandbox", "exec", "four", "--", "sh", "-c", "echo x > /sandbox/note"}).status,
            0);
  EXPECT_EQ(owners.count(owner_of_note(a, "four")), 0u);

  // Deleted, a sandbox's claim goes.
  std::string claim =
      "/var/lib/openshell/id-ranges/" + std::to_string(owner_of_note(b, "three") - 1000);
  EXPECT_EQ(::access(claim.c_str(), F_OK), 0) << claim;
  ASSERT_EQ(os(b, {"sandbox", "delete", "three"}).status, 0);
  EXPECT_EQ(::access(claim.c_str(), F_OK), -1) << claim;
}

// A client cannot pick another sandbox's ids through the API's spec.
TEST_P(IdRanges, ASpecCannotChooseTheHostIds) {
  const std::string& a = homes_[0];
  ASSERT_EQ(os(a, {"sandbox", "create", "--name", "victim", "--from", rootfs()}).status, 0);
  ASSERT_EQ(os(a, {"sandbox", "exec", "victim", "--", "sh", "-c", "echo x > /sandbox/note"}).status,
            0);
  uid_t victim = owner_of_note(a, "victim");
  // Straight to the API, with the victim's range in the spec.
  std::string body = "{\"name\":\"thief\",\"spec\":{\"from\":\"" + rootfs() +
                     "\",\"host_ids\":{\"uid_start\":" + std::to_string(victim - 1000) +
                     ",\"gid_start\":" + std::to_string(victim - 1000) + "}}}";
  std::string cmd = "curl -s --unix-socket " + a + "/run/gateway.sock -X POST -d '" + body +
                    "' http://localhost/v1/sandboxes >/dev/null";
  if (std::system("command -v curl >/dev/null") != 0) GTEST_SKIP() << "no curl";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  ASSERT_EQ(os(a, {"sandbox", "exec", "thief", "--", "sh", "-c", "echo y > /sandbox/note"}).status,
            0);
  EXPECT_NE(owner_of_note(a, "thief"), victim);
}

}  // namespace
}  // namespace e2e
