#include "cli/gateway_registry.h"

#include <sys/stat.h>

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/files.h"
#include "test_util.h"

namespace openshell::cli {
namespace {

using openshell::testing::error_of;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using Source = GatewayChoice::Source;

// A user registry and a system registry in a temporary directory, and
// credentials to register.
class Registries : public ::testing::Test {
 protected:
  Registries()
      : user(tmp.path() + "/user"),
        system(tmp.path() + "/system"),
        registry(user, system),
        system_writer(system, "") {
    paths.state_dir = tmp.path() + "/state";
    paths.run_dir = tmp.path() + "/state/run";
    write_file(tmp.path() + "/ca.pem", "CA\n");
    write_file(tmp.path() + "/cert.pem", "CERT\n");
    write_file(tmp.path() + "/key.pem", "KEY\n");
    tls = {tmp.path() + "/ca.pem", tmp.path() + "/cert.pem", tmp.path() + "/key.pem"};
  }
  GatewayChoice choose(GatewaySelection selection = {},
                       std::optional<std::string> environment = std::nullopt) {
    return choose_gateway(selection, environment, registry, paths);
  }
  static mode_t mode_of(const std::string& path) {
    struct stat st {};
    ::stat(path.c_str(), &st);
    return st.st_mode & 07777;
  }

  TempDir tmp;
  std::string user, system;
  GatewayRegistry registry;
  GatewayRegistry system_writer;  // what a package does: the system registry as its user one
  Paths paths;
  net::TlsFiles tls;
};

TEST_F(Registries, NothingRegisteredIsTheLocalSocket) {
  GatewayChoice c = choose();
  EXPECT_EQ(c.source, Source::kLocal);
  EXPECT_TRUE(c.local_default());
  EXPECT_EQ(c.endpoint.url(), "unix://" + paths.socket());
  EXPECT_TRUE(registry.list().empty());
  EXPECT_EQ(registry.active(), "");
}

TEST_F(Registries, AddWritesPrivateFilesAndTheFirstBecomesActive) {
  registry.add("lab", net::Endpoint::parse("https://10.0.0.5:17670"), tls);
  registry.add("other", net::Endpoint::parse("unix:///run/other.sock"), {});
  EXPECT_EQ(registry.active(), "lab");
  const std::string dir = user + "/gateways/lab";
  EXPECT_EQ(mode_of(dir), 0700u);
  for (const char* leaf : {"ca.crt", "client.crt", "client.key", "endpoint.json"})
    EXPECT_EQ(mode_of(dir + "/" + leaf), 0600u) << leaf;
  EXPECT_EQ(files::read(dir + "/client.key"), "KEY\n");
  auto lab = registry.find("lab");
  ASSERT_TRUE(lab);
  EXPECT_EQ(lab->endpoint.url(), "https://10.0.0.5:17670");
  EXPECT_EQ(lab->endpoint.tls.ca, dir + "/ca.crt");
  EXPECT_EQ(lab->endpoint.tls.key, dir + "/client.key");
  EXPECT_FALSE(lab->system);
  auto other = registry.find("other");
  ASSERT_TRUE(other);
  EXPECT_TRUE(other->endpoint.tls.ca.empty());
}

TEST_F(Registries, ResolutionOrderIsFlagEnvironmentActiveSystemLocal) {
  registry.add("mine", net::Endpoint::parse("unix:///run/mine.sock"), {});
  registry.add("flagged", net::Endpoint::parse("unix:///run/flagged.sock"), {});
  registry.add("envd", net::Endpoint::parse("unix:///run/envd.sock"), {});
  system_writer.add("sys", net::Endpoint::parse("unix:///run/sys.sock"), {});
  // Flag over environment over active.
  GatewayChoice c = choose({"flagged", ""}, "envd");
  EXPECT_EQ(c.source, Source::kFlagName);
  EXPECT_EQ(c.name, "flagged");
  c = choose({"", "unix:///run/url.sock"}, "envd");
  EXPECT_EQ(c.source, Source::kFlagEndpoint);
  EXPECT_EQ(c.endpoint.socket_path, "/run/url.sock");
  c = choose({}, "envd");
  EXPECT_EQ(c.source, Source::kEnvironment);
  EXPECT_EQ(c.name, "envd");
  c = choose({}, "unix:///run/envurl.sock");
  EXPECT_EQ(c.source, Source::kEnvironment);
  EXPECT_EQ(c.endpoint.socket_path, "/run/envurl.sock");
  EXPECT_FALSE(c.local_default());
  c = choose();
  EXPECT_EQ(c.source, Source::kActive);
  EXPECT_EQ(c.name, "mine");
  // Without a user's active gateway: the system's (its first entry became
  // its active one).
  registry.remove("mine");
  c = choose();
  EXPECT_EQ(c.source, Source::kSystem);
  EXPECT_EQ(c.name, "sys");
  // The user's choice is over the system's.
  registry.select("envd");
  EXPECT_EQ(choose().name, "envd");
}

TEST_F(Registries, AUserEntryShadowsTheSystemsAndSystemEntriesStay) {
  system_writer.add("shared", net::Endpoint::parse("unix:///run/system.sock"), {});
  auto found = registry.find("shared");
  ASSERT_TRUE(found);
  EXPECT_TRUE(found->system);
  EXPECT_EQ(error_of([&] { registry.remove("shared"); }),
            "gateway 'shared' is in the system registry (" + system +
                "/gateways), which only its package changes; add one of that name to shadow it");
  registry.add("shared", net::Endpoint::parse("unix:///run/user.sock"), {});
  found = registry.find("shared");
  ASSERT_TRUE(found);
  EXPECT_FALSE(found->system);
  EXPECT_EQ(found->endpoint.socket_path, "/run/user.sock");
  ASSERT_EQ(registry.list().size(), 1u);
  // Removing the user's entry uncovers the system's again.
  registry.remove("shared");
  found = registry.find("shared");
  ASSERT_TRUE(found);
  EXPECT_TRUE(found->system);
}

TEST_F(Registries, AUrlBorrowsTheCredentialsOfTheGatewayRegisteredForIt) {
  registry.add("lab", net::Endpoint::parse("https://[::1]:17670"), tls);
  GatewayChoice c = choose({"", "https://[::1]:17670/"});
  EXPECT_EQ(c.name, "lab");
  EXPECT_EQ(c.endpoint.tls.cert, user + "/gateways/lab/client.crt");
  // Two entries for one URL: the active one's credentials.
  registry.add("again", net::Endpoint::parse("https://[::1]:17670"), tls);
  registry.add("aaa", net::Endpoint::parse("https://[::1]:17670"), tls);
  EXPECT_EQ(choose({"", "https://[::1]:17670"}).name, "lab");
  registry.select("again");
  EXPECT_EQ(choose({"", "https://[::1]:17670"}).name, "again");
  // Another URL: this user's generate-certs files, when they are there.
  c = choose({"", "https://127.0.0.1:17671"});
  EXPECT_TRUE(c.endpoint.tls.ca.empty());
  ::mkdir(paths.state_dir.c_str(), 0700);
  ::mkdir(paths.tls_dir().c_str(), 0700);
  for (const char* leaf : {"ca.crt", "client.crt", "client.key"})
    write_file(paths.tls_dir() + "/" + leaf, "x");
  c = choose({"", "https://127.0.0.1:17671"});
  EXPECT_EQ(c.endpoint.tls.ca, paths.tls_dir() + "/ca.crt");
  EXPECT_EQ(c.endpoint.tls.key, paths.tls_dir() + "/client.key");
}

TEST_F(Registries, ErrorsNameWhatIsWrong) {
  EXPECT_EQ(error_of([&] {
              choose({"nope", ""});
            }),
            "--gateway nope: no such gateway is registered (see 'openshell gateway list')");
  EXPECT_EQ(error_of([&] { choose({}, "nope"); }),
            "OPENSHELL_GATEWAY=nope: no such gateway is registered (see 'openshell gateway "
            "list')");
  EXPECT_EQ(error_of([&] {
              choose({"a", "unix:///x"});
            }),
            "--gateway and --gateway-endpoint both choose a gateway: give one");
  EXPECT_EQ(error_of([&] {
              choose({"", "ftp://x"});
            }),
            "--gateway-endpoint: gateway endpoint 'ftp://x': the scheme must be unix, https or "
            "http");
  EXPECT_EQ(error_of([&] { registry.add("../up", net::Endpoint::parse("unix:///x"), {}); }),
            "gateway name '../up': starts with '.'");
  EXPECT_EQ(error_of([&] { registry.add("a/b", net::Endpoint::parse("unix:///x"), {}); }),
            "gateway name 'a/b': only letters, digits, '-', '_' and '.' are allowed");
  EXPECT_EQ(error_of([&] { registry.select("ghost"); }),
            "gateway 'ghost' is not registered (see 'openshell gateway list')");
}

TEST_F(Registries, OnlyATcpGatewayOffLoopbackIsRemote) {
  auto remote = [&](const std::string& url) { return choose({"", url}).remote(); };
  EXPECT_FALSE(remote("unix:///run/openshell/gateway.sock"));
  EXPECT_FALSE(remote("https://127.0.0.1:17670"));
  EXPECT_FALSE(remote("https://127.8.9.10:17670"));
  EXPECT_FALSE(remote("https://[::1]:17670"));
  EXPECT_FALSE(remote("http://localhost:17671"));
  EXPECT_TRUE(remote("https://10.0.0.5:17670"));
  EXPECT_TRUE(remote("https://[fd00::5]:17670"));
  EXPECT_TRUE(remote("https://gw.example.org:17670"));
  EXPECT_TRUE(remote("http://192.0.2.1:17671"));
}

TEST_F(Registries, RemovingTheActiveGatewayLeavesNoneActive) {
  registry.add("a", net::Endpoint::parse("unix:///run/a.sock"), {});
  registry.add("b", net::Endpoint::parse("unix:///run/b.sock"), {});
  registry.select("b");
  registry.remove("b");
  EXPECT_EQ(registry.active(), "");
  EXPECT_EQ(choose().source, Source::kLocal);
  EXPECT_FALSE(files::exists(user + "/gateways/b"));
}

}  // namespace
}  // namespace openshell::cli
