#include <map>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "gateway/config.h"
#include "test_util.h"

namespace openshell::gateway {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

struct FakeEnv {
  std::map<std::string, std::string> vars;
  Getenv getenv() const {
    return [this](const char* name) -> const char* {
      auto it = vars.find(name);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

TEST(GatewayConfig, WithoutAFileEverySettingIsTheDefault) {
  openshell::testing::TempDir dir;
  FakeEnv env;
  GatewayConfig c = load_config(dir.path() + "/gateway.toml", env.getenv());
  EXPECT_FALSE(c.file_exists);
  EXPECT_EQ(c.storage.value, "auto");
  EXPECT_EQ(c.storage.source, "default");
  // The API's limits are net/http.h's defaults.
  net::ServerLimits builtin;
  EXPECT_EQ(c.api_limits().idle_timeout, builtin.idle_timeout);
  EXPECT_EQ(c.api_limits().max_connections_per_uid, builtin.max_connections_per_uid);
  EXPECT_EQ(c.hosts_file.value, "/etc/hosts");
  EXPECT_THAT(c.supervisor_env(), IsEmpty());
  EXPECT_FALSE(c.sandbox_defaults.pids);
}

TEST(GatewayConfig, TheFileSetsAndTheEnvironmentWins) {
  openshell::testing::TempDir dir;
  const std::string path = dir.path() + "/gateway.toml";
  openshell::testing::write_file(path,
                                 "[dns]\nservers = [\"192.0.2.53\", \"[2001:db8::1]:5353\"]\n"
                                 "hosts_file = \"/srv/hosts\"\nquery_rate = 0\n"
                                 "[storage]\nmode = \"copy\"\n"
                                 "[api]\nheader_timeout_ms = 1500\nmax_connections_per_uid = 9\n"
                                 "[sandbox_defaults]\npids = 64\n");
  FakeEnv env;
  env.vars["OPENSHELL_HOSTS_FILE"] = "/env/hosts";
  env.vars["OPENSHELL_DNS_QUERY_BURST"] = "7";
  env.vars["OPENSHELL_API_MAX_CONNECTIONS_PER_UID"] = "4";
  GatewayConfig c = load_config(path, env.getenv());
  EXPECT_TRUE(c.file_exists);
  EXPECT_EQ(c.servers.value, "192.0.2.53,[2001:db8::1]:5353");
  EXPECT_EQ(c.servers.source, "file");
  EXPECT_EQ(c.hosts_file.value, "/env/hosts");
  EXPECT_EQ(c.hosts_file.source, "environment");
  EXPECT_EQ(c.query_rate.value, "0");
  EXPECT_EQ(c.query_burst.source, "environment");
  EXPECT_EQ(c.storage.value, "copy");
  EXPECT_EQ(c.sandbox_defaults.pids, 64u);
  EXPECT_EQ(c.api_limits().header_timeout, std::chrono::milliseconds(1500));
  EXPECT_EQ(c.max_connections_per_uid.source, "environment");
  EXPECT_EQ(c.api_limits().max_connections_per_uid, 4u);
  // What the supervisors get: what is not a default, under the variables
  // the supervisor reads.
  EXPECT_THAT(c.supervisor_env(),
              ElementsAre("OPENSHELL_DNS_SERVERS=192.0.2.53,[2001:db8::1]:5353",
                          "OPENSHELL_HOSTS_FILE=/env/hosts", "OPENSHELL_DNS_QUERY_RATE=0",
                          "OPENSHELL_DNS_QUERY_BURST=7"));
  nlohmann::json view = c.view();
  EXPECT_EQ(view["settings"]["dns.hosts_file"]["source"], "environment");
  EXPECT_EQ(view["settings"]["storage.mode"]["source"], "file");
  EXPECT_EQ(view["settings"]["sandbox_defaults.pids"]["value"], "64");
  EXPECT_EQ(view["settings"]["dns.resolv_conf"]["source"], "default");
}

TEST(GatewayConfig, ListenersAndTheTlsDirectoryComeFromTheApiTable) {
  openshell::testing::TempDir dir;
  const std::string path = dir.path() + "/gateway.toml";
  FakeEnv env;
  GatewayConfig none = load_config(path, env.getenv());
  EXPECT_EQ(none.listen.value, "");
  EXPECT_EQ(none.tls_dir.source, "default");
  openshell::testing::write_file(path,
                                 "[api]\nlisten = [\"127.0.0.1:17670\", \"[::1]:17670\"]\n"
                                 "insecure_listen = [\"127.0.0.1:17671\"]\n"
                                 "tls_dir = \"/srv/tls\"\n");
  GatewayConfig c = load_config(path, env.getenv());
  EXPECT_EQ(c.listen.value, "127.0.0.1:17670,[::1]:17670");
  EXPECT_EQ(c.listen.source, "file");
  EXPECT_EQ(c.insecure_listen.value, "127.0.0.1:17671");
  EXPECT_EQ(c.tls_dir.value, "/srv/tls");
  EXPECT_EQ(c.view()["settings"]["api.listen"]["value"], "127.0.0.1:17670,[::1]:17670");
  auto error = [&](const std::string& text) {
    openshell::testing::write_file(path, text);
    try {
      load_config(path, env.getenv());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("[api]\nlisten = \"127.0.0.1:1\"\n"),
            path + ":2: api.listen: must be a list, like [\"127.0.0.1:17670\"]");
  EXPECT_EQ(error("[api]\ntls_dir = \"tls\"\n"),
            path + ":2: api.tls_dir: must be an absolute path");
}

TEST(GatewayConfig, TheSocketGroupIsUnsetOrTheFilesName) {
  openshell::testing::TempDir dir;
  const std::string path = dir.path() + "/gateway.toml";
  FakeEnv env;
  EXPECT_EQ(load_config(path, env.getenv()).socket_group.value, "");
  openshell::testing::write_file(path, "[api]\nsocket_group = \"openshell\"\n");
  GatewayConfig c = load_config(path, env.getenv());
  EXPECT_EQ(c.socket_group.value, "openshell");
  EXPECT_EQ(c.socket_group.source, "file");
  EXPECT_EQ(c.view()["settings"]["api.socket_group"]["value"], "openshell");
}

TEST(GatewayConfig, ImagesNameTheDefaultRegistryOverRegistriesConf) {
  openshell::testing::TempDir dir;
  const std::string path = dir.path() + "/gateway.toml";
  const std::string conf = dir.path() + "/registries.conf";
  openshell::testing::write_file(conf,
                                 "unqualified-search-registries = [\"search.example\"]\n"
                                 "[[registry]]\nprefix = \"gw.example\"\n"
                                 "location = \"api.gw.example\"\n");
  FakeEnv env;
  env.vars["OPENSHELL_REGISTRIES_CONF"] = conf;
  // Unset: registries.conf's first search registry, and status says so.
  GatewayConfig none = load_config(path, env.getenv());
  EXPECT_EQ(none.registries(env.getenv()).default_registry, "search.example");
  openshell::testing::write_file(
      path, "[images]\ndefault_registry = \"gw.example\"\none_component_prefix = \"library\"\n");
  GatewayConfig c = load_config(path, env.getenv());
  EXPECT_EQ(c.default_registry.value, "gw.example");
  EXPECT_EQ(c.default_registry.source, "file");
  image::RegistryConfig r = c.registries(env.getenv());
  EXPECT_EQ(r.default_registry, "gw.example");
  EXPECT_EQ(r.one_component_prefix, "library");
  EXPECT_EQ(r.location_of("gw.example"), "api.gw.example");
  EXPECT_EQ(c.view()["settings"]["images.default_registry"]["value"], "gw.example");
  env.vars["OPENSHELL_DEFAULT_REGISTRY"] = "env.test";
  EXPECT_EQ(load_config(path, env.getenv()).registries(env.getenv()).default_registry, "env.test");
  openshell::testing::write_file(path, "[images]\ndefault_registry = \"https://x.example/\"\n");
  EXPECT_THROW(load_config(path, env.getenv()), Error);
}

TEST(GatewayConfig, TheSystemGatewayReadsEtcWhenItExists) {
  openshell::testing::TempDir dir;
  Paths paths{dir.path() + "/state", dir.path() + "/run"};
  const std::string etc = dir.path() + "/etc-gateway.toml";
  FakeEnv env;
  EXPECT_EQ(config_path(paths, 0, env.getenv(), etc), dir.path() + "/state/gateway.toml");
  openshell::testing::write_file(etc, "");
  EXPECT_EQ(config_path(paths, 0, env.getenv(), etc), etc);
  // Not for an ordinary user's gateway, nor for root's with OPENSHELL_HOME.
  EXPECT_EQ(config_path(paths, 1000, env.getenv(), etc), dir.path() + "/state/gateway.toml");
  env.vars["OPENSHELL_HOME"] = dir.path() + "/state";
  EXPECT_EQ(config_path(paths, 0, env.getenv(), etc), dir.path() + "/state/gateway.toml");
}

TEST(GatewayConfig, BadSettingsNameTheFileLineAndKey) {
  openshell::testing::TempDir dir;
  const std::string path = dir.path() + "/gateway.toml";
  FakeEnv env;
  auto error = [&](const std::string& text) {
    openshell::testing::write_file(path, text);
    try {
      load_config(path, env.getenv());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(error("[dns]\nserver = [\"192.0.2.1\"]\n"),
            path +
                ":2: dns.server: unknown key (known: servers, hosts_file, resolv_conf, "
                "query_rate, query_burst)");
  EXPECT_EQ(
      error("[network]\nx = 1\n"),
      path + ":1: network: unknown table (known: dns, storage, api, images, sandbox_defaults)");
  EXPECT_EQ(error("[api]\nidle_timeout_ms = 0\n"),
            path + ":2: api.idle_timeout_ms: not a whole number from 1 to 86400000");
  EXPECT_EQ(error("[api]\nidle_timeout = 5\n"),
            path +
                ":2: api.idle_timeout: unknown key (known: header_timeout_ms, body_timeout_ms, "
                "idle_timeout_ms, max_connections_per_uid, listen, insecure_listen, tls_dir, "
                "socket_group)");
  EXPECT_EQ(error("[api]\nsocket_group = \"\"\n"),
            path + ":2: api.socket_group: must be a group's name");
  EXPECT_EQ(error("[api]\nsocket_group = 100\n"),
            path + ":2: api.socket_group: must be a group's name");
  EXPECT_EQ(error("[dns]\n\nservers = [\"nameserver\"]\n"),
            path + ":3: dns.servers: \"nameserver\" is not an address or address:port");
  EXPECT_EQ(error("[dns]\nservers = \"192.0.2.1\"\n"),
            path + ":2: dns.servers: must be a list, like [\"192.0.2.53\", \"192.0.2.54:5353\"]");
  EXPECT_EQ(error("[dns]\nquery_burst = 0\n"),
            path + ":2: dns.query_burst: not a number of DNS lookups of at least 1");
  EXPECT_EQ(error("[dns]\nhosts_file = \"hosts\"\n"),
            path + ":2: dns.hosts_file: must be an absolute path");
  EXPECT_EQ(error("[storage]\nmode = \"zfs\"\n"),
            path + ":2: storage.mode: not one of auto, overlay, copy");
  EXPECT_EQ(error("[storage]\nkind = \"copy\"\n"),
            path + ":2: storage.kind: unknown key (known: mode)");
  EXPECT_EQ(error("[sandbox_defaults]\nmemory = 1\n"),
            path + ":2: sandbox_defaults.memory: unknown key (known: pids, tmp_size, shm_size)");
  EXPECT_THAT(error("[dns\n"), ::testing::StartsWith(path + ":1: "));
  // The environment's values are checked too, naming the variable.
  openshell::testing::write_file(path, "");
  env.vars["OPENSHELL_STORAGE"] = "zfs";
  EXPECT_EQ(error(""), "OPENSHELL_STORAGE=zfs: not one of auto, overlay, copy");
  env.vars.clear();
  env.vars["OPENSHELL_DNS_SERVERS"] = "192.0.2.1, x";
  EXPECT_EQ(error(""),
            "OPENSHELL_DNS_SERVERS=192.0.2.1, x: \"x\" is not an address or address:port");
}

}  // namespace
}  // namespace openshell::gateway
