// sandbox commit end to end: what a sandbox wrote in its root and in
// /sandbox, and what it deleted, make a new image that new sandboxes start
// from; a running sandbox is frozen while read and runs on unchanged; what
// cannot be committed is refused saying why. As root and rootless.
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"
#include "image_helpers.h"

using testing::HasSubstr;
using json = nlohmann::json;

namespace e2e {
namespace {

using image_helpers::busybox_layout;

class SandboxCommit : public GatewayTest {
 protected:
  SandboxCommit() : GatewayTest("commit") {}
  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    if (busybox_layout().empty()) GTEST_SKIP() << "the busybox image could not be built";
    Result r = os({"image", "import", busybox_layout(), "bb"});
    ASSERT_EQ(r.status, 0) << r.err;
    // Root inside the sandbox, writing /etc: what an agent installing
    // something does.
    policy_ = write_file(home_ + "/root.toml",
                         "version = 1\n[filesystem_policy]\nread_only = [\"/\"]\n"
                         "read_write = [\"/sandbox\", \"/tmp\", \"/etc\", \"/dev/null\"]\n"
                         "[process]\nallow_root = true\nrun_as_user = \"root\"\n"
                         "run_as_group = \"root\"\n");
  }
  void TearDown() override {
    if (!home_.empty()) os({"sandbox", "delete", "--all"});
    GatewayTest::TearDown();
  }
  Result create(const std::string& name, const std::vector<std::string>& command) {
    std::vector<std::string> args = {"sandbox", "create",   "--name", name, "--from",
                                     "bb",      "--policy", policy_,  "-d", "--"};
    args.insert(args.end(), command.begin(), command.end());
    return os(args);
  }
  Result exec(const std::string& name, const std::string& script) {
    return os({"sandbox", "exec", name, "--", "sh", "-c", script});
  }
  // Runs script in a new sandbox from image; its output.
  std::string run_from(const std::string& image, const std::string& script) {
    Result r = os({"sandbox", "create", "--no-keep", "--from", image, "--policy", policy_, "--",
                   "sh", "-c", script});
    EXPECT_EQ(r.status, 0) << r.err;
    return r.out;
  }

  std::string policy_;
};

TEST_P(SandboxCommit, AStoppedSandboxsFilesWorkspaceAndDeletionsMakeTheImage) {
  ASSERT_EQ(create("box", {"sleep", "600"}).status, 0);
  Result w = exec("box",
                  "echo agent > /etc/agent-file && echo notes > /sandbox/notes && "
                  "rm /etc/hostname && mkdir -m 777 /sandbox/u");
  ASSERT_EQ(w.status, 0) << w.err;
  // /sandbox/u/private is uid 1000's, mode 0600: rootless with subordinate
  // ids, a file that the gateway's own user cannot read itself.
  if (mode() != Mode::kRootlessSingle) {
    w = os({"sandbox", "exec", "--user", "1000", "box", "--", "sh", "-c",
            "echo secret > /sandbox/u/private && chmod 600 /sandbox/u/private"});
  }
  ASSERT_EQ(w.status, 0) << w.err;
  ASSERT_EQ(os({"sandbox", "stop", "box"}).status, 0);
  Result c = os({"sandbox", "commit", "box", "snap:1", "-m", "tools in", "-o", "json"});
  ASSERT_EQ(c.status, 0) << c.err;
  json result = json::parse(c.out, nullptr, false);
  ASSERT_TRUE(result.is_object()) << c.out;
  EXPECT_EQ(result.value("image", ""), "localhost/snap:1");
  EXPECT_EQ(result.value("frozen", true), false);

  // The image: the base's layers and one more, named in the store.
  Result inspect = os({"image", "inspect", "snap:1"});
  ASSERT_EQ(inspect.status, 0) << inspect.err;
  json record = json::parse(inspect.out, nullptr, false);
  if (record.is_array()) record = record[0];
  EXPECT_EQ(record["layers"].size(), 2u);
  EXPECT_EQ(record.value("id", ""), result.value("id", "x"));

  EXPECT_EQ(run_from("snap:1",
                     "cat /etc/agent-file /sandbox/notes; "
                     "test -e /etc/hostname && echo present || echo gone"),
            "agent\nnotes\ngone\n");
  // The layer keeps uid 1000's unreadable file, with its owner and mode.
  if (mode() != Mode::kRootlessSingle) {
    const std::string blob =
        home_ + "/images/blobs/sha256/" + result["layer"].value("digest", "").substr(7);
    image_helpers::Shell listing = image_helpers::sh("tar -tvzf " + image_helpers::q(blob) +
                                                     " --numeric-owner sandbox/u/private");
    EXPECT_EQ(listing.status, 0) << listing.out;
    EXPECT_THAT(listing.out, testing::ContainsRegex("^-rw------- 1000/1000 +7 ")) << listing.out;
  }
  // The base image is as it was.
  EXPECT_EQ(run_from("bb",
                     "test -e /etc/agent-file && echo present || echo absent; "
                     "test -e /etc/hostname && echo present || echo gone"),
            "absent\npresent\n");
}

TEST_P(SandboxCommit, ARunningSandboxIsFrozenWhileReadAndRunsOnUnchanged) {
  // Each count is written beside the file and renamed over it: a freeze
  // between `>`'s truncate and its write would commit an empty file.
  ASSERT_EQ(create("live", {"sh", "-c",
                            "i=0; while true; do i=$((i+1)); echo $i > /sandbox/count.new; "
                            "mv /sandbox/count.new /sandbox/count; sleep 0.05; done"})
                .status,
            0);
  ASSERT_EQ(exec("live", "echo before > /etc/marker").status, 0);
  const std::string pid_before = exec("live", "cat /proc/1/stat | cut -d' ' -f1,22").out;
  Result c = os({"sandbox", "commit", "live", "live-snap:1", "-o", "json"});
  if (is_rootless(mode())) {
    // No freezer cgroup for an ordinary user: refused, and it runs on.
    EXPECT_EQ(c.status, 125) << c.out;
    EXPECT_THAT(c.err, HasSubstr("cannot freeze it"));
    EXPECT_THAT(c.err, HasSubstr("stop it first"));
    EXPECT_EQ(phase("live"), "Ready");
    return;
  }
  ASSERT_EQ(c.status, 0) << c.err;
  EXPECT_EQ(json::parse(c.out, nullptr, false).value("frozen", false), true);
  // Still running, the same processes, its files as they were, still counting.
  EXPECT_EQ(phase("live"), "Ready");
  EXPECT_EQ(exec("live", "cat /proc/1/stat | cut -d' ' -f1,22").out, pid_before);
  EXPECT_EQ(exec("live", "cat /etc/marker").out, "before\n");
  const std::string first = exec("live", "cat /sandbox/count").out;
  std::string later = first;
  for (int i = 0; i < 100 && later == first; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    later = exec("live", "cat /sandbox/count").out;
  }
  EXPECT_NE(later, first) << "the sandbox stopped counting after the commit";
  // And no freezer cgroup of the commit is left (the harness checks too).
  EXPECT_EQ(file_contents_of_dir("/sys/fs/cgroup/freezer").find("openshell-commit-"),
            std::string::npos);
  // The image holds what the sandbox had written.
  EXPECT_EQ(run_from("live-snap:1", "cat /etc/marker; test -s /sandbox/count && echo counted"),
            "before\ncounted\n");
}

TEST_P(SandboxCommit, WhatCannotBeCommittedIsRefusedSayingWhy) {
  ASSERT_EQ(create("box", {"sleep", "600"}).status, 0);
  Result bad = os({"sandbox", "commit", "box", "Bad Name"});
  EXPECT_EQ(bad.status, 125);
  EXPECT_THAT(bad.err, HasSubstr("Bad Name"));
  Result digest = os({"sandbox", "commit", "box", "x@sha256:" + std::string(64, 'a')});
  EXPECT_EQ(digest.status, 125);
  EXPECT_THAT(digest.err, HasSubstr("with a tag, not a digest"));
  Result missing = os({"sandbox", "commit", "no-such-box", "x:1"});
  EXPECT_EQ(missing.status, 125);
  EXPECT_THAT(missing.err, HasSubstr("no-such-box"));
  // A root that is a copy, not an overlay: nothing to take the layer from.
  ASSERT_EQ(os({"gateway", "stop"}).status, 0);
  Options copy = with_home();
  copy.env.push_back("OPENSHELL_STORAGE=copy");
  ASSERT_EQ(openshell(mode(),
                      {"sandbox", "create", "--name", "copied", "--from", "bb", "-d", "--", "sleep",
                       "600"},
                      copy)
                .status,
            0);
  Result copied = os({"sandbox", "commit", "copied", "x:1"});
  EXPECT_EQ(copied.status, 125);
  EXPECT_THAT(copied.err, HasSubstr("storage copy"));
  EXPECT_EQ(os({"image", "list", "-q"}).out.find("x:1"), std::string::npos);
}

TEST_P(SandboxCommit, ACommittedImagePushesAndPullsBackTheSame) {
  image_helpers::LoggingRegistry registry;
  if (!registry.ok()) GTEST_SKIP() << "docker-registry did not start (package docker-registry)";
  ASSERT_EQ(create("box", {"sleep", "600"}).status, 0);
  ASSERT_EQ(exec("box", "echo pushed > /sandbox/notes && rm /etc/hostname").status, 0);
  ASSERT_EQ(os({"sandbox", "stop", "box"}).status, 0);
  ASSERT_EQ(os({"sandbox", "commit", "box", "snap:1"}).status, 0);
  std::string m = mode_name(mode());
  for (auto& ch : m) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  const std::string ref = registry.host() + "/commit-" + m + "/snap:1";
  Result pushed = os({"image", "push", "snap:1", ref, "-o", "json"});
  ASSERT_EQ(pushed.status, 0) << pushed.err;
  json result = json::parse(pushed.out, nullptr, false);
  ASSERT_EQ(result["layers"].size(), 2u) << pushed.out;

  const std::string other = make_dir(mode(), "commit-pull-" + m, 0700);
  Options there;
  there.env.push_back("OPENSHELL_HOME=" + other);
  there.timeout_s = 120;
  Result pulled = openshell(mode(), {"image", "pull", ref, "-o", "json"}, there);
  ASSERT_EQ(pulled.status, 0) << pulled.err;
  json theirs = json::parse(pulled.out, nullptr, false);
  EXPECT_EQ(theirs.value("digest", "x"), result.value("digest", "y"));
  Result inspect = os({"image", "inspect", "snap:1"});
  json mine = json::parse(inspect.out, nullptr, false);
  if (mine.is_array()) mine = mine[0];
  EXPECT_EQ(theirs["layers"].size(), 2u);
  EXPECT_EQ(theirs.value("id", "x"), mine.value("id", "y"));
  if (theirs["layers"].size() == 2 && mine["layers"].size() == 2)
    EXPECT_EQ(theirs["layers"][1].value("diff_id", "x"), mine["layers"][1].value("diff_id", "y"));
  openshell(mode(), {"gateway", "stop"}, there);
}

E2E_ALL_MODES(SandboxCommit);

}  // namespace
}  // namespace e2e
