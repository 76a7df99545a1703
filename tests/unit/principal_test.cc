#include "gateway/principal.h"

#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "gateway/host_paths.h"
#include "test_util.h"

namespace openshell::gateway {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kNobody = 65534;

net::PeerCredentials unix_peer(uid_t uid) {
  net::PeerCredentials p;
  p.transport = net::PeerCredentials::Transport::kUnix;
  p.uid = uid;
  p.gid = uid;
  p.pid = 1;
  return p;
}

TEST(Principal, OnTheSocketTheUidsUserNameAndRootOrTheGatewaysUserIsAdmin) {
  Principal root = principal_of(unix_peer(0), 1000);
  EXPECT_EQ(root.name, "root");
  EXPECT_TRUE(root.admin);
  EXPECT_EQ(root.transport, "unix");
  EXPECT_TRUE(root.unix_peer);
  // The gateway's own user is its owner, an admin of it.
  EXPECT_TRUE(principal_of(unix_peer(4321), 4321).admin);
  Principal other = principal_of(unix_peer(4321), 0);
  EXPECT_FALSE(other.admin);
  EXPECT_EQ(other.uid, 4321u);
  // A uid that passwd does not know (none here has 4000000000).
  EXPECT_EQ(principal_of(unix_peer(4000000000u), 0).name, "uid-4000000000");
}

TEST(Principal, OverTlsTheCertificatesSubjectAndItsAdminMark) {
  net::PeerCredentials p;
  p.transport = net::PeerCredentials::Transport::kTls;
  p.subject = "alice";
  p.uid = 0;  // meaningless over TLS: never taken for root
  Principal alice = principal_of(p, 0);
  EXPECT_EQ(alice.name, "alice");
  EXPECT_FALSE(alice.admin);
  EXPECT_FALSE(alice.unix_peer);
  EXPECT_EQ(alice.transport, "tls");
  p.admin = true;
  EXPECT_TRUE(principal_of(p, 0).admin);
}

TEST(Principal, PlainTcpIsTheGatewayOwnerButNeverAnAdmin) {
  net::PeerCredentials p;
  p.transport = net::PeerCredentials::Transport::kTcp;
  p.address = "127.0.0.1:40000";
  Principal tcp = principal_of(p, 0);
  EXPECT_EQ(tcp.name, "root");
  EXPECT_FALSE(tcp.admin);
  EXPECT_FALSE(tcp.unix_peer);
  EXPECT_EQ(tcp.transport, "tcp");
}

TEST(Principal, AnOwnerlessSandboxIsTheGatewayOwnersAndOnlyItsOwnerOrAnAdminMayTouchIt) {
  EXPECT_EQ(effective_owner("", 0), "root");
  EXPECT_EQ(effective_owner("bob", 0), "bob");
  Principal alice{"alice", false, "unix"};
  EXPECT_TRUE(may_touch(alice, "alice"));
  EXPECT_FALSE(may_touch(alice, "bob"));
  Principal admin{"ops", true, "tls"};
  EXPECT_TRUE(may_touch(admin, "bob"));
}

TEST(Principal, UsersAndGroupsAreReadFromTheFilesText) {
  const std::string passwd =
      "root:x:0:0:root:/root:/bin/bash\n# a comment\nalice:x:1001:1001::/home/alice:/bin/sh\n"
      "broken line\n";
  EXPECT_EQ(user_name_in(passwd, 0), "root");
  EXPECT_EQ(user_name_in(passwd, 1001), "alice");
  EXPECT_EQ(user_name_in(passwd, 1002), "uid-1002");
  const std::string group =
      "root:x:0:\nalice:x:1001:\nshare:x:1500:bob,alice\nother:x:1600:bob\n"
      "again:x:1001:alice\nbad:x:nope:alice\n";
  EXPECT_THAT(groups_in(group, "alice", 1001), ::testing::ElementsAre(1001u, 1500u));
  EXPECT_THAT(groups_in(group, "carol", 42), ::testing::ElementsAre(42u));
  EXPECT_EQ(group_id_in(group, "share"), 1500u);
  EXPECT_EQ(group_id_in(group, "none"), std::nullopt);
  EXPECT_EQ(group_id_in(group, "bad"), std::nullopt);
}

class HostPaths : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "checking paths as another uid needs root";
    ASSERT_EQ(::chmod(dir_.path().c_str(), 0755), 0);
  }
  openshell::testing::TempDir dir_;
};

TEST_F(HostPaths, ARootOnlyDirectoryIsRefusedToAnotherUser) {
  const std::string secret = dir_.path() + "/secret";
  ASSERT_EQ(::mkdir(secret.c_str(), 0700), 0);
  std::string problem = host_path_problem(kNobody, kNobody, {{secret, "--bind", false}});
  EXPECT_THAT(problem, HasSubstr("--bind: uid 65534 may not read " + secret));
  EXPECT_THAT(problem, HasSubstr("Permission denied"));
  // Root itself may.
  EXPECT_EQ(host_path_problem(0, 0, {{secret, "--bind", false}}), "");
}

TEST_F(HostPaths, TheUsersOwnDirectoryIsAllowedAndWriteNeedsWriteAccess) {
  const std::string own = dir_.path() + "/own";
  ASSERT_EQ(::mkdir(own.c_str(), 0700), 0);
  ASSERT_EQ(::chown(own.c_str(), kNobody, kNobody), 0);
  EXPECT_EQ(host_path_problem(kNobody, kNobody, {{own, "--bind", true}}), "");
  const std::string readable = dir_.path() + "/readable";
  ASSERT_EQ(::mkdir(readable.c_str(), 0755), 0);
  EXPECT_EQ(host_path_problem(kNobody, kNobody, {{readable, "--from", false}}), "");
  EXPECT_THAT(host_path_problem(kNobody, kNobody, {{readable, "--bind", true}}),
              HasSubstr("may not read and write " + readable));
}

TEST_F(HostPaths, APathThatNowLeadsElsewhereIsRefused) {
  const std::string target = dir_.path() + "/target";
  const std::string link = dir_.path() + "/link";
  ASSERT_EQ(::mkdir(target.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  EXPECT_THAT(host_path_problem(kNobody, kNobody, {{link, "--bind", false}}),
              HasSubstr("is no longer where it leads (" + target + ")"));
}

TEST_F(HostPaths, ARootDirectoryMustBeReadableThroughout) {
  const std::string root = dir_.path() + "/root";
  ASSERT_EQ(::mkdir(root.c_str(), 0755), 0);
  ASSERT_EQ(::mkdir((root + "/etc").c_str(), 0755), 0);
  openshell::testing::write_file(root + "/etc/passwd", "root:x:0:0::/:/bin/sh\n");
  ASSERT_EQ(::chmod((root + "/etc/passwd").c_str(), 0644), 0);
  ASSERT_EQ(::symlink("/root/.ssh", (root + "/link").c_str()), 0);  // not followed
  HostPath from{root, "--from", false, false, true};
  EXPECT_EQ(host_path_problem(kNobody, kNobody, {from}), "");
  openshell::testing::write_file(root + "/etc/shadow", "root:secret\n");
  ASSERT_EQ(::chmod((root + "/etc/shadow").c_str(), 0600), 0);
  EXPECT_THAT(
      host_path_problem(kNobody, kNobody, {from}),
      HasSubstr("--from: uid 65534 may not read " + root + "/…/shadow (Permission denied)"));
}

TEST_F(HostPaths, ABindSourceMustBeTheCallersOrRoots) {
  const std::string others = dir_.path() + "/others";
  ASSERT_EQ(::mkdir(others.c_str(), 0755), 0);
  ASSERT_EQ(::chown(others.c_str(), 4242, 4242), 0);
  HostPath bind{others, "--bind", false, true, false};
  EXPECT_THAT(host_path_problem(kNobody, kNobody, {bind}),
              HasSubstr("--bind: " + others + " belongs to uid 4242, not uid 65534"));
  ASSERT_EQ(::chown(others.c_str(), kNobody, kNobody), 0);
  EXPECT_EQ(host_path_problem(kNobody, kNobody, {bind}), "");
  ASSERT_EQ(::chown(others.c_str(), 0, 0), 0);
  EXPECT_EQ(host_path_problem(kNobody, kNobody, {bind}), "");
}

TEST_F(HostPaths, AMissingPathIsRefused) {
  EXPECT_THAT(host_path_problem(kNobody, kNobody, {{dir_.path() + "/none", "--from", false}}),
              HasSubstr("No such file or directory"));
}

}  // namespace
}  // namespace openshell::gateway
