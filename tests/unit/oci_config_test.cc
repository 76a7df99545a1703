// config.json -> what the runtime starts (oci/config.h): each field where
// it lands, and each refusal naming its field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "oci/config.h"
#include "test_util.h"

namespace openshell::oci {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

json minimal() {
  return {
      {"ociVersion", "1.2.0"},
      {"process", {{"args", {"sh"}}, {"cwd", "/"}, {"env", {"PATH=/bin"}}}},
      {"root", {{"path", "rootfs"}}},
      {"linux", {{"namespaces", {{{"type", "pid"}}, {{"type", "mount"}}, {{"type", "network"}}}}}}};
}

std::string refusal(const json& config) {
  try {
    bundle_from_json(config, "/b");
  } catch (const Error& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(OciConfig, MinimalConfigStartsAnInitWithoutAMainProcess) {
  auto b = bundle_from_json(minimal(), "/b");
  EXPECT_TRUE(b->spec.argv.empty());
  EXPECT_EQ(b->process.argv, std::vector<std::string>{"sh"});
  EXPECT_TRUE(b->process.main);
  EXPECT_EQ(b->spec.fs.rootfs, "/b/rootfs");
  EXPECT_TRUE(b->spec.fs.plain_root);
  EXPECT_FALSE(b->spec.fs.private_tmp);
  EXPECT_EQ(b->spec.uid, 0u);
  EXPECT_EQ(b->spec.cap_add, 0u);
  EXPECT_TRUE(b->spec.seccomp);
  EXPECT_EQ(b->spec.seccomp_program.length, 0);
  // Not listed: the host's, joined; listed without a path: a new one.
  EXPECT_EQ(b->spec.join_net, "");
  EXPECT_EQ(b->spec.join_ipc, "/proc/self/ns/ipc");
  EXPECT_EQ(b->spec.join_uts, "/proc/self/ns/uts");
}

TEST(OciConfig, ProcessFieldsLandInTheSpec) {
  json c = minimal();
  c["process"]["user"] = {{"uid", 1000}, {"gid", 100}, {"additionalGids", {5, 6}}};
  c["process"]["terminal"] = true;
  c["process"]["consoleSize"] = {{"height", 40}, {"width", 120}};
  c["process"]["cwd"] = "/work";
  c["process"]["oomScoreAdj"] = -100;
  c["process"]["rlimits"] = {{{"type", "RLIMIT_NOFILE"}, {"soft", 100}, {"hard", 200}}};
  // A user other than root keeps its ambient capabilities only.
  c["process"]["capabilities"] = {{"bounding", {"CAP_NET_ADMIN", "CAP_KILL"}},
                                  {"permitted", {"CAP_NET_ADMIN", "CAP_KILL"}},
                                  {"ambient", {"CAP_KILL", "CAP_NO_SUCH_THING"}}};
  auto b = bundle_from_json(c, "/b");
  EXPECT_EQ(b->spec.uid, 1000u);
  EXPECT_EQ(b->spec.gid, 100u);
  EXPECT_EQ(b->spec.supplementary_gids, (std::vector<uint32_t>{5, 6}));
  EXPECT_TRUE(b->spec.tty);
  EXPECT_TRUE(b->process.tty);
  EXPECT_EQ(b->spec.tty_rows, 40);
  EXPECT_EQ(b->spec.tty_cols, 120);
  EXPECT_EQ(b->spec.fs.workdir, "/work");
  EXPECT_EQ(b->process.workdir, "/work");
  EXPECT_EQ(b->spec.oom_score_adj, -100);
  ASSERT_EQ(b->spec.rlimits.size(), 1u);
  EXPECT_EQ(b->spec.rlimits[0].soft, 100u);
  EXPECT_EQ(b->spec.rlimits[0].hard, 200u);
  EXPECT_EQ(b->spec.cap_add, runtime::caps::Set{1} << 5);  // CAP_KILL
  // Root keeps its permitted set within the bounding set.
  c["process"]["user"] = {{"uid", 0}, {"gid", 0}};
  EXPECT_EQ(bundle_from_json(c, "/b")->spec.cap_add,
            (runtime::caps::Set{1} << 5) | (runtime::caps::Set{1} << 12));
}

TEST(OciConfig, MountsMapOntoTheSandboxs) {
  json c = minimal();
  c["mounts"] = {
      {{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
      {{"destination", "/dev/shm"}, {"type", "tmpfs"}, {"options", {"size=1m"}}},
      {{"destination", "/run"}, {"type", "tmpfs"}, {"options", {"nosuid", "mode=755", "size=2m"}}},
      {{"destination", "/dev/mqueue"}, {"type", "mqueue"}, {"source", "mqueue"}},
      {{"destination", "/data/"},
       {"type", "bind"},
       {"source", "data"},
       {"options", {"rbind", "ro", "noexec", "rprivate"}}},
      {{"destination", "/sys/fs/cgroup"}, {"type", "cgroup"}, {"source", "cgroup"}}};
  auto b = bundle_from_json(c, "/b");
  EXPECT_EQ(b->spec.fs.shm_size, 1024u * 1024u);
  ASSERT_EQ(b->spec.fs.fs_mounts.size(), 2u);
  EXPECT_EQ(b->spec.fs.fs_mounts[0].type, "tmpfs");
  EXPECT_EQ(b->spec.fs.fs_mounts[0].target, "/run");
  EXPECT_EQ(b->spec.fs.fs_mounts[0].data, "mode=755,size=2m");
  EXPECT_EQ(b->spec.fs.fs_mounts[1].type, "mqueue");
  ASSERT_EQ(b->spec.fs.binds.size(), 1u);
  EXPECT_EQ(b->spec.fs.binds[0].source, "/b/data");
  EXPECT_EQ(b->spec.fs.binds[0].target, "/data");
  EXPECT_TRUE(b->spec.fs.binds[0].read_only);
  EXPECT_TRUE(b->spec.fs.binds[0].no_exec);
}

TEST(OciConfig, LinuxFieldsLandInTheSpec) {
  json c = minimal();
  c["linux"]["namespaces"] = {{{"type", "pid"}},
                              {{"type", "network"}, {"path", "/run/netns/x"}},
                              {{"type", "ipc"}},
                              {{"type", "uts"}}};
  c["linux"]["cgroupsPath"] = "default/abc";
  c["linux"]["resources"] = {{"memory", {{"limit", 1 << 20}}},
                             {"pids", {{"limit", 64}}},
                             {"cpu", {{"quota", 50000}, {"period", 100000}, {"shares", 1024}}}};
  c["linux"]["sysctl"] = {{"net.ipv4.ip_forward", "1"}};
  c["linux"]["maskedPaths"] = {"/proc/kcore"};
  c["linux"]["readonlyPaths"] = {"/proc/sys"};
  c["linux"]["seccomp"] = {{"defaultAction", "SCMP_ACT_ALLOW"}};
  c["annotations"] = {{"x", "y"}};
  c["hooks"] = {{"prestart", {{{"path", "/bin/a"}}}},
                {"poststart", {{{"path", "/bin/b"}}}},
                {"poststop", {{{"path", "/bin/c"}, {"timeout", 5}}}}};
  auto b = bundle_from_json(c, "/b");
  EXPECT_EQ(b->spec.join_net, "/run/netns/x");
  EXPECT_EQ(b->spec.join_ipc, "");
  EXPECT_EQ(b->spec.cgroup_path, "/default/abc");
  EXPECT_EQ(b->spec.limits.memory_bytes, 1u << 20);
  EXPECT_EQ(b->spec.limits.pids, 64u);
  EXPECT_DOUBLE_EQ(*b->spec.limits.cpus, 0.5);
  ASSERT_EQ(b->spec.fs.sysctls.size(), 1u);
  EXPECT_EQ(b->spec.fs.sysctls[0].first, "net.ipv4.ip_forward");
  EXPECT_EQ(b->spec.fs.masked_paths, std::vector<std::string>{"/proc/kcore"});
  EXPECT_EQ(b->spec.fs.read_only_paths, std::vector<std::string>{"/proc/sys"});
  EXPECT_GT(b->spec.seccomp_program.length, 0);
  EXPECT_EQ(b->spec.seccomp_program.filter, b->seccomp.code.data());
  EXPECT_EQ(b->annotations.at("x"), "y");
  ASSERT_EQ(b->spec.hooks.size(), 1u);  // prestart is createRuntime, run by the runtime
  EXPECT_EQ(b->spec.hooks[0].stage, runtime::HookStage::kCreateRuntime);
  ASSERT_EQ(b->poststart.size(), 1u);
  ASSERT_EQ(b->poststop.size(), 1u);
  EXPECT_EQ(b->poststop[0].timeout_s, 5);
}

// The policy annotation names a file in the bundle: its network part turns
// on the egress proxy (and the proxy's variables join the process's env),
// its filesystem part the Landlock rules; a missing file is refused by name.
TEST(OciConfig, ThePolicyAnnotationTurnsOnTheProxyAndLandlock) {
  openshell::testing::TempDir dir;
  openshell::testing::write_file(
      dir / "policy.toml",
      "version = 1\n[filesystem_policy]\nread_only = [\"/bin\"]\n"
      "[network_policies.local]\nendpoints = [ { host = \"localhost\", port = 80 } ]\n");
  json c = minimal();
  c["annotations"] = {{"org.openshell.policy", "policy.toml"}};
  auto b = bundle_from_json(c, dir.path());
  EXPECT_EQ(b->policy_file, dir / "policy.toml");
  ASSERT_TRUE(b->policy);
  EXPECT_TRUE(b->spec.egress);
  EXPECT_TRUE(b->spec.fs.dns_stub);
  EXPECT_THAT(b->process.env, ::testing::Contains(HasSubstr("http_proxy=")));
  EXPECT_TRUE(b->spec.landlock.enabled);

  c["annotations"] = {{"org.openshell.policy", "missing.toml"}};
  try {
    bundle_from_json(c, dir.path());
    ADD_FAILURE() << "a missing policy file was accepted";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("annotations.org.openshell.policy: read " + dir.path() +
                                    "/missing.toml"));
  }
}

TEST(OciConfig, RefusalsNameTheField) {
  auto with = [](auto edit) {
    json c = minimal();
    edit(c);
    return refusal(c);
  };
  EXPECT_EQ(with([](json& c) { c["ociVersion"] = "2.0.0"; }),
            "config.json: ociVersion: \"2.0.0\" is not 1.x (runtime-spec 1.0 to 1.2)");
  EXPECT_EQ(with([](json& c) { c["process"].erase("args"); }),
            "config.json: process.args: is required (the command to run)");
  EXPECT_EQ(with([](json& c) { c["process"]["args"] = json::array(); }),
            "config.json: process.args: must name a command (it is empty)");
  EXPECT_EQ(with([](json& c) { c["process"]["cwd"] = "work"; }),
            "config.json: process.cwd: \"work\" must be an absolute path without \"..\"");
  EXPECT_EQ(with([](json& c) { c["process"]["env"] = {"NOEQUALS"}; }),
            "config.json: process.env[0]: \"NOEQUALS\" is not KEY=VALUE");
  EXPECT_EQ(with([](json& c) {
              c["process"]["user"] = {{"uid", -1}};
            }),
            "config.json: process.user.uid: must be an integer from 0 to 4294967294, not -1");
  EXPECT_EQ(with([](json& c) {
              c["process"]["rlimits"] = {{{"type", "RLIMIT_BOGUS"}, {"soft", 1}, {"hard", 1}}};
            }),
            "config.json: process.rlimits[0].type: \"RLIMIT_BOGUS\" is not a resource limit");
  EXPECT_EQ(with([](json& c) { c["process"]["oomScoreAdj"] = 2000; }),
            "config.json: process.oomScoreAdj: must be from -1000 to 1000");
  EXPECT_EQ(with([](json& c) {
              c["mounts"] = {{{"destination", "/x"}, {"type", "nfs"}}};
            }),
            "config.json: mounts[0] (/x): type \"nfs\" is not supported (bind, tmpfs, mqueue, "
            "proc, sysfs, devpts, cgroup)");
  EXPECT_EQ(with([](json& c) {
              c["mounts"] = {{{"destination", "/x"},
                              {"type", "bind"},
                              {"source", "/y"},
                              {"options", {"rbind", "rshared"}}}};
            }),
            "config.json: mounts[0].options: \"rshared\": a mount shared with the host is not "
            "supported");
  EXPECT_EQ(with([](json& c) {
              c["linux"]["namespaces"].push_back({{"type", "user"}, {"path", "/proc/1/ns/user"}});
            }),
            "config.json: linux.namespaces[3].path: joining a user namespace is not supported "
            "(each sandbox has its own)");
  EXPECT_EQ(with([](json& c) { c["linux"]["cgroupsPath"] = "system.slice:docker:abc"; }),
            "config.json: linux.cgroupsPath: \"system.slice:docker:abc\" is systemd's "
            "slice:prefix:name form, and openshell manages cgroups itself (use the cgroupfs "
            "manager)");
  EXPECT_EQ(with([](json& c) {
              c["linux"]["uidMappings"] = {{{"containerID", 0}, {"hostID", 1000}, {"size", 1}}};
            }),
            "config.json: linux.uidMappings: is taken from root only: run as an ordinary user, "
            "openshell maps the sandbox's ids itself (from /etc/subuid)");
  EXPECT_EQ(with([](json& c) {
              c["hooks"] = {{"prestart", {{{"path", "x"}}}}};
            }),
            "config.json: hooks.prestart[0].path: must be absolute");
  EXPECT_THAT(with([](json& c) {
                c["linux"]["seccomp"] = {{"defaultAction", "SCMP_ACT_NOPE"}};
              }),
              HasSubstr("config.json: linux.seccomp.defaultAction"));
  EXPECT_EQ(with([](json& c) { c.erase("linux"); }), "config.json: linux: is required on Linux");
  EXPECT_EQ(with([](json& c) { c["hostname"] = "box"; }),
            "config.json: hostname: needs a uts namespace of the container's own "
            "(linux.namespaces)");
}

TEST(OciConfig, ExampleConfigIsAccepted) {
  for (bool rootless : {false, true}) {
    auto b = bundle_from_json(example_config(rootless), "/b");
    EXPECT_EQ(b->process.argv, std::vector<std::string>{"sh"});
    EXPECT_TRUE(b->spec.fs.read_only);
    EXPECT_TRUE(b->terminal);
  }
}

TEST(OciConfig, IdMappingsAreTakenFromRootOnly) {
  json c = minimal();
  c["process"]["user"] = {{"uid", 1001}, {"gid", 1001}, {"additionalGids", {1001}}};
  // Podman's keep-id, rootless: the user's own id (Podman's 0) is 1001 inside.
  c["linux"]["uidMappings"] = {{{"containerID", 0}, {"hostID", 1}, {"size", 1001}},
                               {{"containerID", 1001}, {"hostID", 0}, {"size", 1}},
                               {{"containerID", 1002}, {"hostID", 1002}, {"size", 64535}}};
  c["linux"]["gidMappings"] = c["linux"]["uidMappings"];
  auto b = bundle_from_json(c, "/b", Context{true});
  ASSERT_TRUE(b->spec.id_map.has_value());
  EXPECT_EQ(b->spec.id_map->method, namespaces::IdMap::Method::kDirect);
  EXPECT_EQ(b->spec.id_map->uid.size(), 3u);
  EXPECT_EQ(b->spec.id_map->host_uid(1001), std::optional<uint32_t>(0));
  EXPECT_EQ(b->spec.id_map->host_gid(0), std::optional<uint32_t>(1));
  EXPECT_EQ(b->spec.id_map->host_uid(65537), std::nullopt);
  // Without mappings, none is given: the runtime plans its own.
  EXPECT_FALSE(bundle_from_json(minimal(), "/b", Context{true})->spec.id_map.has_value());
  // An ordinary user: refused (its ids come from its subordinate range).
  EXPECT_EQ(refusal(c),
            "config.json: linux.uidMappings: is taken from root only: run as an ordinary user, "
            "openshell maps the sandbox's ids itself (from /etc/subuid)");
  // Root of the host: Podman's --uidmap, in host ids; never host id 0.
  Context host_root;
  host_root.host_root = true;
  c["process"]["user"] = {{"uid", 0}, {"gid", 0}};
  c["linux"]["uidMappings"] = {{{"containerID", 0}, {"hostID", 300000}, {"size", 65536}}};
  c["linux"]["gidMappings"] = c["linux"]["uidMappings"];
  b = bundle_from_json(c, "/b", host_root);
  ASSERT_TRUE(b->spec.id_map.has_value());
  EXPECT_EQ(b->spec.id_map->host_uid(0), std::optional<uint32_t>(300000));
  c["linux"]["gidMappings"] = {{{"containerID", 0}, {"hostID", 0}, {"size", 1}},
                               {{"containerID", 1}, {"hostID", 300001}, {"size", 65535}}};
  try {
    bundle_from_json(c, "/b", host_root);
    ADD_FAILURE() << "a map of the host's root group was accepted";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "config.json: linux.gidMappings: maps the host's root group (hostID 0) into the "
                 "container, which openshell never does");
  }
}

TEST(OciConfig, IdMappingsAreChecked) {
  auto nested = [](auto edit) {
    json c = minimal();
    c["linux"]["uidMappings"] = {{{"containerID", 0}, {"hostID", 0}, {"size", 65536}}};
    c["linux"]["gidMappings"] = {{{"containerID", 0}, {"hostID", 0}, {"size", 65536}}};
    edit(c);
    try {
      bundle_from_json(c, "/b", Context{true});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("(accepted)");
  };
  EXPECT_EQ(nested([](json&) {}), "(accepted)");
  EXPECT_EQ(nested([](json& c) { c["linux"].erase("gidMappings"); }),
            "config.json: linux.gidMappings: is required with linux.uidMappings");
  EXPECT_EQ(nested([](json& c) { c["linux"]["uidMappings"][0]["size"] = 0; }),
            "config.json: linux.uidMappings[0].size: must be above 0");
  EXPECT_EQ(nested([](json& c) { c["linux"]["gidMappings"][0].erase("hostID"); }),
            "config.json: linux.gidMappings[0].hostID: is required");
  EXPECT_EQ(
      nested([](json& c) {
        c["linux"]["uidMappings"].push_back({{"containerID", 70000}, {"hostID", 100}, {"size", 1}});
      }),
      "config.json: linux.uidMappings[1]: overlaps an earlier range");
  EXPECT_EQ(nested([](json& c) {
              c["process"]["user"] = {{"uid", 70000}};
            }),
            "config.json: process.user.uid: 70000 is not in linux.uidMappings' container ids");
  EXPECT_EQ(nested([](json& c) {
              c["process"]["user"] = {{"additionalGids", {90000}}};
            }),
            "config.json: process.user.additionalGids: 90000 is not in linux.gidMappings' "
            "container ids");
}

}  // namespace
}  // namespace openshell::oci
