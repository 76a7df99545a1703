// The one builder of container specs (spec/container_spec.h), for both kinds
// of sandbox: a gateway's (through sandbox_placement, as the supervisor
// calls it) and a one-shot one (a Placement with its one_shot part, as
// `openshell run` fills it; run_options_test.cc tests its flags).
#include "spec/container_spec.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/ca_bundles.h"
#include "base/error.h"
#include "base/files.h"
#include "image/store.h"
#include "policy/policy.h"
#include "runtime/guest_init.h"
#include "runtime/landlock.h"
#include "spec/ca_certs.h"
#include "supervisor/guest_vm.h"
#include "test_util.h"

namespace openshell::spec {
namespace {

using openshell::testing::error_of;
using openshell::testing::ScopedEnv;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

const char kPath[] = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const char kLayer[] = "sha256:1111111111111111111111111111111111111111111111111111111111111111";

const char kPasswd[] =
    "root:x:0:0::/root:/bin/sh\ntoor:x:0:0::/root:/bin/sh\n"
    "app:x:1500:1501::/home/app:/bin/sh\nsandbox:x:1000:1000::/home/sandbox:/bin/sh\n";
const char kGroup[] = "root:x:0:\nwheel:x:0:\nstaff:x:50:\napp:x:1501:\n";

// A gateway's state directory with one sandbox ("sb-1", named "box") and an
// image store whose one layer holds the given /etc/passwd and /etc/group.
struct Gateway {
  TempDir state;
  Paths paths{state.path(), state / "run"};

  Placement sandbox() const { return sandbox_placement("sb-1", "box", paths); }
  Placement one_shot() const {
    Placement where;
    where.hostname = "run";
    where.cgroup_name = "openshell-run-1";
    where.images_dir = paths.images();
    where.one_shot.emplace();
    return where;
  }
  // The image's one layer, with an /etc/passwd.
  void make_layer() const {
    write_file(image::Store(paths.images()).layer_root(kLayer) + "/etc/passwd", kPasswd);
  }
  // A spec made from an image whose layer has these files.
  SandboxSpec from_image(const std::string& passwd, const std::string& group,
                         const std::string& user = "") const {
    const std::string root = image::Store(paths.images()).layer_root(kLayer);
    write_file(root + "/etc/passwd", passwd);
    write_file(root + "/etc/group", group);
    SandboxSpec spec;
    spec.from = "example/app";
    image::ImageRecord record;
    record.name = "localhost/example/app:latest";
    record.config_digest = "sha256:" + std::string(64, '2');
    record.diff_ids = {kLayer};
    record.config.user = user;
    resolve_image(&spec, record);
    return spec;
  }
};

SandboxSpec with_policy(SandboxSpec spec, const std::string& toml) {
  spec.policy = "version = 1\n" + toml;
  spec.policy_source = "p.toml";
  return spec;
}

// --- merge_env: the one env merge ----------------------------------------------------

TEST(MergeEnv, OverridesAndAppends) {
  EXPECT_THAT(merge_env({"A=1", "B=2"}, {"A=9"}), ElementsAre("A=9", "B=2"));
  EXPECT_THAT(merge_env({"A=1"}, {"C=3", "D="}), ElementsAre("A=1", "C=3", "D="));
  EXPECT_THAT(merge_env({"A=1"}, {"A=2", "A=3"}), ElementsAre("A=3"));
  EXPECT_THAT(merge_env({}, {"X=a=b"}), ElementsAre("X=a=b"));
}

TEST(MergeEnv, KeyIsNotAPrefixMatch) {
  EXPECT_THAT(merge_env({"AB=1", "A=0"}, {"A=2"}), ElementsAre("AB=1", "A=2"));
  EXPECT_THAT(merge_env({"AB=1"}, {"A=2"}), ElementsAre("AB=1", "A=2"));
  EXPECT_THAT(merge_env({"A=1"}, {"AB=2"}), ElementsAre("A=1", "AB=2"));
}

TEST(MergeEnv, SkipsEntriesWithoutAKey) {
  EXPECT_THAT(merge_env({"A=1"}, {"B", "=x", "", "C=3"}), ElementsAre("A=1", "C=3"));
}

// --- the environment ----------------------------------------------------------------

// Base (PATH, HOME, HOSTNAME), then the proxy variables, then the image's
// environment, then the caller's: each replaces what came before in place.
TEST(ContainerSpecEnv, MergeOrderOfAGatewaysSandbox) {
  Gateway g;
  SandboxSpec spec;
  spec.from = "example/app";
  spec.env = {"IMG=caller", "HTTP_PROXY=http://proxy.example:1", "NEW=1"};
  g.make_layer();
  image::ImageRecord record;
  record.name = "localhost/example/app:latest";
  record.diff_ids = {kLayer};
  record.config.env = {"PATH=/image/bin", "IMG=image", "ONLY_IMAGE=1"};
  resolve_image(&spec, record);
  EXPECT_THAT(spec.env, ElementsAre("PATH=/image/bin", "IMG=caller", "ONLY_IMAGE=1",
                                    "HTTP_PROXY=http://proxy.example:1", "NEW=1"));

  runtime::ContainerSpec c = container_spec_for(spec, g.sandbox());
  std::vector<std::string> want = {"PATH=/image/bin", "HOME=/sandbox", "HOSTNAME=box"};
  for (auto entry : proxy_env()) {
    if (entry.rfind("HTTP_PROXY=", 0) == 0) entry = "HTTP_PROXY=http://proxy.example:1";
    want.push_back(entry);
  }
  want.insert(want.end(), {"IMG=caller", "ONLY_IMAGE=1", "NEW=1"});
  EXPECT_THAT(c.env, ElementsAreArray(want));
}

TEST(ContainerSpecEnv, MergeOrderOfAOneShotSandbox) {
  Gateway g;
  SandboxSpec spec = g.from_image(kPasswd, kGroup);
  spec.env = merge_env({"A=image", "B=image"}, {"B=caller"});
  Placement where = g.one_shot();
  where.one_shot->tty = true;
  where.one_shot->term = "vt100";
  runtime::ContainerSpec c = container_spec_for(spec, where);
  // HOME: the default user's home in the image's /etc/passwd; no proxy
  // without network policies.
  EXPECT_THAT(c.env, ElementsAre(kPath, "HOME=/home/sandbox", "HOSTNAME=run", "TERM=vt100",
                                 "A=image", "B=caller"));
  where.one_shot->term = "";
  EXPECT_THAT(container_spec_for(spec, where).env, Contains("TERM=xterm"));
}

// An image's Env entry without '=' is not the caller's variable of that name.
TEST(ContainerSpecEnv, AnImageNeverNamesTheCallersVariables) {
  ScopedEnv secret("OPENSHELL_UNIT_SECRET", "hunter2");
  Gateway g;
  SandboxSpec spec;
  spec.from = "example/app";
  image::ImageRecord record;
  record.diff_ids = {kLayer};
  record.config.env = {"OPENSHELL_UNIT_SECRET", "KEPT=1"};
  g.make_layer();
  resolve_image(&spec, record);
  EXPECT_THAT(spec.env, ElementsAre("KEPT=1"));
  for (const Placement& where : {g.sandbox(), g.one_shot()})
    for (const auto& entry : container_spec_for(spec, where).env)
      EXPECT_THAT(entry, Not(HasSubstr("OPENSHELL_UNIT_SECRET"))) << entry;
}

// --- the proxy environment -----------------------------------------------------------

TEST(ContainerSpecProxy, TheVariables) {
  EXPECT_THAT(proxy_env(),
              ElementsAre("HTTP_PROXY=http://127.0.0.1:3128", "HTTPS_PROXY=http://127.0.0.1:3128",
                          "ALL_PROXY=http://127.0.0.1:3128", "http_proxy=http://127.0.0.1:3128",
                          "https_proxy=http://127.0.0.1:3128", "all_proxy=http://127.0.0.1:3128",
                          "NO_PROXY=localhost,127.0.0.1", "no_proxy=localhost,127.0.0.1"));
}

// A gateway's sandbox always has its proxy (its network policy may change
// while it runs); a one-shot one only with network policies.
TEST(ContainerSpecProxy, WhoGetsIt) {
  Gateway g;
  SandboxSpec host;
  const std::string network =
      "[network_policies.x]\nendpoints = [ { host = \"api.example.com\", port = 443 } ]\n";
  struct Case {
    SandboxSpec spec;
    Placement where;
    bool egress;
  } cases[] = {
      {host, g.sandbox(), true},
      {with_policy(host, network), g.sandbox(), true},
      {host, g.one_shot(), false},
      {with_policy(host, "[process]\nrun_as_user = \"1000\"\n"), g.one_shot(), false},
      {with_policy(host, network), g.one_shot(), true},
  };
  for (const auto& [spec, where, egress] : cases) {
    SCOPED_TRACE(spec.policy + (where.one_shot ? " (one-shot)" : " (sandbox)"));
    runtime::ContainerSpec c = container_spec_for(spec, where);
    EXPECT_EQ(c.egress, egress);
    EXPECT_EQ(c.fs.dns_stub, egress);
    for (const auto& entry : proxy_env())
      EXPECT_EQ(std::count(c.env.begin(), c.env.end(), entry), egress ? 1 : 0) << entry;
  }
}

// --- the main process: entrypoint and cmd ------------------------------------------

TEST(ContainerSpecCommand, EntrypointThenTheCallersCommandOrElseCmd) {
  Gateway g;
  struct Case {
    std::vector<std::string> entrypoint, cmd, command, want;
  } cases[] = {
      {{"/ep", "-x"}, {"default"}, {}, {"/ep", "-x", "default"}},
      {{"/ep", "-x"}, {"default"}, {"mine", "1"}, {"/ep", "-x", "mine", "1"}},
      {{}, {"default", "arg"}, {}, {"default", "arg"}},
      {{}, {"default"}, {"mine"}, {"mine"}},
      {{"/ep"}, {}, {}, {"/ep"}},
      {{}, {}, {}, {}},  // no main process: a gateway's sandbox idles
  };
  g.make_layer();
  for (const auto& [entrypoint, cmd, command, want] : cases) {
    SandboxSpec spec;
    spec.from = "example/app";
    spec.command = command;
    image::ImageRecord record;
    record.diff_ids = {kLayer};
    record.config.entrypoint = entrypoint;
    record.config.cmd = cmd;
    resolve_image(&spec, record);
    EXPECT_EQ(spec.command, want);
    EXPECT_EQ(container_spec_for(spec, g.sandbox()).argv, want);
    EXPECT_EQ(container_spec_for(spec, g.one_shot()).argv, want);
  }
}

// --- the user, never root ------------------------------------------------------------

TEST(ContainerSpecUser, PolicyThenImageThenDefault) {
  Gateway g;
  for (const Placement& where : {g.sandbox(), g.one_shot()}) {
    SCOPED_TRACE(where.one_shot ? "one-shot" : "sandbox");
    SandboxSpec spec = g.from_image(kPasswd, kGroup, "app");
    runtime::ContainerSpec c = container_spec_for(spec, where);
    EXPECT_EQ(c.uid, 1500u);
    EXPECT_EQ(c.gid, 1501u);
    // The policy's group replaces the image's.
    c = container_spec_for(with_policy(spec, "[process]\nrun_as_group = \"staff\"\n"), where);
    EXPECT_EQ(c.uid, 1500u);
    EXPECT_EQ(c.gid, 50u);
    // The policy's user wins over the image's.
    c = container_spec_for(with_policy(spec, "[process]\nrun_as_user = \"sandbox\"\n"), where);
    EXPECT_EQ(c.uid, 1000u);
    EXPECT_EQ(c.gid, 1000u);
    // No user anywhere: 1000:1000, or 1000 and the policy's group.
    spec = g.from_image(kPasswd, kGroup);
    c = container_spec_for(spec, where);
    EXPECT_EQ(c.uid, runtime::kDefaultUid);
    EXPECT_EQ(c.gid, runtime::kDefaultGid);
    c = container_spec_for(with_policy(spec, "[process]\nrun_as_group = \"staff\"\n"), where);
    EXPECT_EQ(c.uid, runtime::kDefaultUid);
    EXPECT_EQ(c.gid, 50u);
  }
}

TEST(ContainerSpecUser, AnImageThatNamesRootRunsAsTheDefaultUser) {
  Gateway g;
  for (const char* user : {"root", "0", "toor", "toor:staff", "0:0"})
    for (const Placement& where : {g.sandbox(), g.one_shot()}) {
      SCOPED_TRACE(std::string(user) + (where.one_shot ? " (one-shot)" : " (sandbox)"));
      runtime::ContainerSpec c = container_spec_for(g.from_image(kPasswd, kGroup, user), where);
      EXPECT_EQ(c.uid, runtime::kDefaultUid);
      EXPECT_EQ(c.gid, runtime::kDefaultGid);
    }
}

TEST(ContainerSpecUser, APolicyThatNamesRootIsRefused) {
  Gateway g;
  const SandboxSpec spec = g.from_image(kPasswd, kGroup);
  for (const Placement& where : {g.sandbox(), g.one_shot()}) {
    SCOPED_TRACE(where.one_shot ? "one-shot" : "sandbox");
    EXPECT_EQ(error_of([&] {
                container_spec_for(with_policy(spec, "[process]\nrun_as_user = \"toor\"\n"), where);
              }),
              "p.toml: process.run_as_user: toor is root in the sandbox's /etc/passwd "
              "(process.allow_root = true allows it)");
    EXPECT_EQ(error_of([&] {
                container_spec_for(with_policy(spec,
                                               "[process]\nrun_as_user = \"app\"\nrun_as_group = "
                                               "\"wheel\"\n"),
                                   where);
              }),
              "p.toml: process.run_as_group: wheel is root's group in the sandbox's /etc/group "
              "(process.allow_root = true allows it)");
  }
}

// create --user and exec --user: the same rule as the policy's user, root
// only with process.allow_root.
TEST(ContainerSpecUser, ACreateUserIsRootOnlyWhereThePolicyAllowsIt) {
  Gateway g;
  SandboxSpec spec = g.from_image(kPasswd, kGroup);
  for (const char* user : {"0", "root", "toor", "app:wheel", "0:1000"}) {
    SCOPED_TRACE(user);
    spec.user = user;
    EXPECT_EQ(error_of([&] { container_spec_for(spec, g.sandbox()); }),
              std::string("--user ") + user +
                  ": root in the sandbox needs process.allow_root = true in its policy (it has "
                  "the default one)");
    EXPECT_EQ(error_of([&] { exec_user(spec, g.sandbox(), user); }),
              std::string("--user ") + user +
                  ": root in the sandbox needs process.allow_root = true in its policy (it has "
                  "the default one)");
  }
  SandboxSpec refused = with_policy(spec, "[process]\nrun_as_group = \"staff\"\n");
  refused.user = "0";
  EXPECT_EQ(error_of([&] { container_spec_for(refused, g.sandbox()); }),
            "--user 0: root in the sandbox needs process.allow_root = true in its policy (p.toml)");
  SandboxSpec allowed = with_policy(spec, "[process]\nallow_root = true\n");
  allowed.user = "root";
  runtime::ContainerSpec c = container_spec_for(allowed, g.sandbox());
  EXPECT_EQ(c.uid, 0u);
  EXPECT_EQ(c.gid, 0u);
  EXPECT_TRUE(c.exec_as_others);
  EXPECT_EQ(c.cap_add, 0u);  // root in the sandbox has no capabilities
  EXPECT_TRUE(c.seccomp);
  EXPECT_EQ(exec_user(allowed, g.sandbox(), "0").uid, 0u);
  // A user that is not root needs no permission; the spec's own is the default.
  spec.user = "app";
  EXPECT_EQ(container_spec_for(spec, g.sandbox()).uid, exec_user(spec, g.sandbox(), "").uid);
  EXPECT_EQ(exec_user(spec, g.sandbox(), "sandbox").uid, 1000u);
  EXPECT_EQ(exec_user(spec, g.sandbox(), "4242:4243").gid, 4243u);
  EXPECT_EQ(error_of([&] { exec_user(spec, g.sandbox(), "nobody-here"); }), error_of([&] {
              SandboxSpec other = spec;
              other.user = "nobody-here";
              container_spec_for(other, g.sandbox());
            }));
  EXPECT_NE(error_of([&] { exec_user(spec, g.sandbox(), "nobody-here"); }), "");
}

TEST(ContainerSpecUser, APolicyMayNameRootWithAllowRoot) {
  Gateway g;
  const SandboxSpec spec = with_policy(g.from_image(kPasswd, kGroup),
                                       "[process]\nallow_root = true\nrun_as_user = \"toor\"\n");
  EXPECT_EQ(container_spec_for(spec, g.sandbox()).uid, 0u);
}

// Only openshell run's --user may be root, and it wins over the policy's.
TEST(ContainerSpecUser, OnlyTheOneShotCallerMayChooseRoot) {
  Gateway g;
  const SandboxSpec spec =
      with_policy(g.from_image(kPasswd, kGroup, "app"), "[process]\nrun_as_user = \"sandbox\"\n");
  Placement where = g.one_shot();
  where.one_shot->user = "0";
  runtime::ContainerSpec c = container_spec_for(spec, where);
  EXPECT_EQ(c.uid, 0u);
  EXPECT_EQ(c.gid, 0u);
  EXPECT_THAT(c.env, Contains("HOME=/root"));
  where.one_shot->user = "toor:wheel";
  EXPECT_EQ(container_spec_for(spec, where).uid, 0u);
}

// --- the default filesystem policy --------------------------------------------------

TEST(ContainerSpecFilesystem, AGatewaysSandboxGetsTheDefaultPolicy) {
  Gateway g;
  const policy::FilesystemPolicy defaults = policy::default_policy().filesystem;
  SandboxSpec host;
  for (const SandboxSpec& spec :
       {host, with_policy(host, "[process]\nrun_as_group = \"1000\"\n"),
        with_policy(host,
                    "[network_policies.x]\nendpoints = [ { host = \"a.example.com\", "
                    "port = 443 } ]\n")}) {
    SCOPED_TRACE(spec.policy);
    policy::Policy p = effective_policy(spec, g.sandbox());
    EXPECT_TRUE(p.has_filesystem_policy);
    EXPECT_EQ(p.filesystem, defaults);
    runtime::ContainerSpec c = container_spec_for(spec, g.sandbox());
    EXPECT_FALSE(c.fs.proc_read_only);  // Landlock decides
    EXPECT_FALSE(c.landlock.warn_missing);
    EXPECT_EQ(c.landlock.enabled, runtime::landlock::abi_version() > 0);
  }
  // A policy's own filesystem section replaces the default.
  SandboxSpec own = with_policy(host, "[filesystem_policy]\nread_only = [\"/usr\"]\n");
  policy::Policy p = effective_policy(own, g.sandbox());
  EXPECT_THAT(p.filesystem.read_only, ElementsAre("/usr"));
  EXPECT_THAT(p.filesystem.read_write, IsEmpty());
  EXPECT_TRUE(container_spec_for(own, g.sandbox()).landlock.warn_missing);
}

// A --vm sandbox's guest gets the policy, not the host's plan: it plans
// for its own kernel (supervisor::guest_config).
TEST(ContainerSpecFilesystem, AVmGuestGetsTheFilesystemPolicyToPlanForItsKernel) {
  Gateway g;
  SandboxSpec host;
  // No filesystem section: the default one, its missing paths unsaid.
  runtime::guest::Config defaults = runtime::guest::decode_config(runtime::guest::encode_config(
      supervisor::guest_config(container_spec_for(host, g.sandbox()))));
  policy::Policy p = policy::parse(defaults.landlock_policy, "guest");
  EXPECT_TRUE(p.has_filesystem_policy);
  EXPECT_EQ(p.filesystem, policy::default_policy().filesystem);
  EXPECT_FALSE(defaults.landlock_warn_missing);
  EXPECT_FALSE(defaults.proc_read_only) << "Landlock covers /proc";

  // A policy's own section and compatibility; nothing of its network part.
  SandboxSpec own = with_policy(host,
                                "[filesystem_policy]\nread_only = [\"/usr\"]\n"
                                "read_write = [\"/data\"]\n"
                                "[landlock]\ncompatibility = \"hard_requirement\"\n"
                                "[network_policies.x]\nendpoints = [ { host = \"a.example.com\", "
                                "port = 443 } ]\n");
  runtime::guest::Config config = runtime::guest::decode_config(runtime::guest::encode_config(
      supervisor::guest_config(container_spec_for(own, g.sandbox()))));
  p = policy::parse(config.landlock_policy, "guest");
  EXPECT_THAT(p.filesystem.read_only, ElementsAre("/usr"));
  EXPECT_THAT(p.filesystem.read_write, ElementsAre("/data"));
  EXPECT_EQ(p.landlock, policy::LandlockCompatibility::kHardRequirement);
  EXPECT_THAT(p.network, IsEmpty());
  EXPECT_TRUE(config.landlock_warn_missing);
  // What the guest plans from it: at the guest kernel's ABI 2, the
  // hard_requirement is refused; at 7, the rules, the workdir's included.
  EXPECT_THAT(error_of([&] { runtime::guest::confinement_for(config, 2); }),
              HasSubstr("hard_requirement"));
  std::vector<std::string> paths;
  for (const auto& rule : runtime::guest::confinement_for(config, 7).landlock.rules)
    paths.push_back(rule.path);
  EXPECT_THAT(paths, ElementsAre("/usr", "/data", config.workdir));

  // A one-shot sandbox without a filesystem policy: none, and a read-only
  // /proc instead, as its container.
  const runtime::guest::Config one_shot =
      supervisor::guest_config(container_spec_for(host, g.one_shot()));
  EXPECT_THAT(one_shot.landlock_policy, IsEmpty());
  EXPECT_TRUE(one_shot.proc_read_only);
}

TEST(ContainerSpecFilesystem, AOneShotSandboxGetsNoLandlockButAReadOnlyProc) {
  Gateway g;
  SandboxSpec host;
  for (const SandboxSpec& spec :
       {host, with_policy(host, "[process]\nrun_as_group = \"1000\"\n")}) {
    SCOPED_TRACE(spec.policy);
    EXPECT_FALSE(effective_policy(spec, g.one_shot()).has_filesystem_policy);
    runtime::ContainerSpec c = container_spec_for(spec, g.one_shot());
    EXPECT_FALSE(c.landlock.enabled);
    EXPECT_TRUE(c.fs.proc_read_only);
  }
  SandboxSpec own = with_policy(host, "[filesystem_policy]\nread_only = [\"/usr\", \"/proc\"]\n");
  EXPECT_TRUE(effective_policy(own, g.one_shot()).has_filesystem_policy);
  EXPECT_FALSE(container_spec_for(own, g.one_shot()).fs.proc_read_only);
}

// --- roots, workspace, working directory ---------------------------------------------

TEST(ContainerSpecRoot, AGatewaysSandboxKeepsItsLayerAndWorkspace) {
  Gateway g;
  const std::string dir = g.paths.sandbox("sb-1");
  SandboxSpec host;
  runtime::ContainerSpec c = container_spec_for(host, g.sandbox());
  EXPECT_EQ(c.fs.root, namespaces::RootKind::kHost);
  ASSERT_GE(c.fs.binds.size(), 1u);  // then the CA bundle, over the host's own
  EXPECT_EQ(c.fs.binds[0].source, dir + "/workspace");
  EXPECT_EQ(c.fs.binds[0].target, "/sandbox");
  EXPECT_EQ(c.fs.workdir, "/sandbox");
  EXPECT_EQ(c.fs.home, "/sandbox");
  EXPECT_THAT(c.env, Contains("HOME=/sandbox"));
  EXPECT_EQ(c.hostname, "box");
  EXPECT_EQ(c.cgroup_name, "openshell-sb-1");

  SandboxSpec directory;
  directory.from = g.state / "rootfs";
  write_file(directory.from + "/etc/passwd", kPasswd);
  c = container_spec_for(directory, g.sandbox());
  EXPECT_EQ(c.fs.rootfs, directory.from);
  EXPECT_EQ(c.fs.layer_dir, dir + "/layer");
  directory.storage = "copy";
  write_file(dir + "/rootfs/etc/passwd", kPasswd);
  c = container_spec_for(directory, g.sandbox());
  EXPECT_EQ(c.fs.rootfs, dir + "/rootfs");
  EXPECT_TRUE(c.fs.plain_root);
  EXPECT_THAT(c.fs.layer_dir, IsEmpty());

  SandboxSpec image = g.from_image(kPasswd, kGroup);
  image.image->working_dir = "/app";
  c = container_spec_for(image, g.sandbox());
  EXPECT_THAT(c.fs.layers, ElementsAre(image::Store(g.paths.images()).layer_root(kLayer)));
  EXPECT_EQ(c.fs.layer_dir, dir + "/layer");
  EXPECT_EQ(c.fs.workdir, "/app");
}

// --- the CA bundle --------------------------------------------------------------------

std::vector<std::string> bind_targets(const runtime::ContainerSpec& c, const std::string& source) {
  std::vector<std::string> targets;
  for (const auto& b : c.fs.binds)
    if (b.source == source) {
      EXPECT_TRUE(b.read_only) << b.target;
      targets.push_back(b.target);
    }
  return targets;
}

TEST(ContainerSpecCaBundle, OverEachBundleTheRootHasAndTheVariablesNameTheFirst) {
  Gateway g;
  const std::string bundle = g.paths.sandbox("sb-1") + "/ca-certificates.crt";
  SandboxSpec spec = g.from_image(kPasswd, kGroup);
  const std::string layer = image::Store(g.paths.images()).layer_root(kLayer);
  // An Alpine-like and a Fedora-like bundle, no Debian one.
  write_file(layer + "/etc/ssl/cert.pem", "roots\n");
  write_file(layer + "/etc/pki/tls/certs/ca-bundle.crt", "roots\n");
  runtime::ContainerSpec c = container_spec_for(spec, g.sandbox());
  EXPECT_THAT(bind_targets(c, bundle),
              ElementsAre("/etc/ssl/cert.pem", "/etc/pki/tls/certs/ca-bundle.crt"));
  for (const auto& entry : ca_bundle_env("/etc/ssl/cert.pem")) EXPECT_THAT(c.env, Contains(entry));

  // The image's variables do not win over ours; the caller's do.
  spec.env = {"SSL_CERT_FILE=/mine.pem"};
  c = container_spec_for(spec, g.sandbox());
  EXPECT_THAT(c.env, Contains("SSL_CERT_FILE=/mine.pem"));
  EXPECT_THAT(c.env, Contains("CURL_CA_BUNDLE=/etc/ssl/cert.pem"));

  // No bundle in the root: none mounted, no variables; with --ca-cert, at
  // the Debian path.
  SandboxSpec bare = g.from_image(kPasswd, kGroup);
  ::unlink((layer + "/etc/ssl/cert.pem").c_str());
  ::unlink((layer + "/etc/pki/tls/certs/ca-bundle.crt").c_str());
  c = container_spec_for(bare, g.sandbox());
  EXPECT_THAT(bind_targets(c, bundle), IsEmpty());
  for (const auto& entry : c.env) EXPECT_THAT(entry, Not(StartsWith("SSL_CERT_FILE=")));
  bare.ca_certs = {"x"};
  c = container_spec_for(bare, g.sandbox());
  EXPECT_THAT(bind_targets(c, bundle), ElementsAre("/etc/ssl/certs/ca-certificates.crt"));
  EXPECT_THAT(c.env, Contains("SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"));

  // Neither a one-shot sandbox nor a micro-VM gets one.
  write_file(layer + "/etc/ssl/cert.pem", "roots\n");
  c = container_spec_for(g.from_image(kPasswd, kGroup), g.one_shot());
  for (const auto& b : c.fs.binds) EXPECT_THAT(b.target, Not(HasSubstr("cert")));
}

TEST(ContainerSpecCaBundle, AOneShotSandboxGetsItsFromItsOwnDirectory) {
  Gateway g;
  TempDir run;
  SandboxSpec spec = g.from_image(kPasswd, kGroup);
  const std::string layer = image::Store(g.paths.images()).layer_root(kLayer);
  write_file(layer + "/etc/ssl/cert.pem", "roots\n");
  Placement where = g.one_shot();
  where.one_shot->ca_dir = run.path();
  runtime::ContainerSpec c = container_spec_for(spec, where);
  EXPECT_THAT(bind_targets(c, run.path() + "/ca-certificates.crt"),
              ElementsAre("/etc/ssl/cert.pem"));
  EXPECT_THAT(c.env, Contains("SSL_CERT_FILE=/etc/ssl/cert.pem"));
  // Written where it is mounted from, never into the root.
  write_ca_bundle(spec, run.path(), "RUN CA\n");
  std::string text;
  ASSERT_EQ(files::read_into(run.path() + "/ca-certificates.crt", &text), 0);
  EXPECT_THAT(text, HasSubstr(std::string(kSandboxCaLine) + "\nRUN CA\n"));
  std::string root_bundle;
  ASSERT_EQ(files::read_into(layer + "/etc/ssl/cert.pem", &root_bundle), 0);
  EXPECT_EQ(root_bundle, "roots\n");
  // A directory root: the same, from the root's own bundle paths.
  TempDir dir;
  write_file(dir.path() + "/etc/passwd", kPasswd);
  write_file(dir.path() + "/etc/group", kGroup);
  write_file(dir.path() + "/etc/pki/tls/certs/ca-bundle.crt", "roots\n");
  SandboxSpec from_dir;
  from_dir.from = dir.path();
  from_dir.command = {"true"};
  c = container_spec_for(from_dir, where);
  EXPECT_THAT(bind_targets(c, run.path() + "/ca-certificates.crt"),
              ElementsAre("/etc/pki/tls/certs/ca-bundle.crt"));
}

TEST(ContainerSpecCaBundle, OnlyAnInspectedEndpointNeedsTheSandboxsCa) {
  auto policy = [](const std::string& endpoint) {
    return policy::parse(
        "version = 1\n[network_policies.x]\nendpoints = [ { host = "
        "\"api.example.com\", port = 443" +
            endpoint + " } ]\n",
        "test");
  };
  EXPECT_FALSE(inspects_traffic(policy::Policy{}));
  EXPECT_FALSE(inspects_traffic(policy("")));
  EXPECT_TRUE(inspects_traffic(policy(", protocol = \"rest\"")));
  EXPECT_TRUE(inspects_traffic(policy(", protocol = \"websocket\"")));
  EXPECT_FALSE(inspects_traffic(policy(", protocol = \"rest\", tls = \"skip\"")));
}

TEST(ContainerSpecCaBundle, ItHoldsTheHostsRootsAndTheSandboxsCa) {
  Gateway g;
  const std::string bundle = g.paths.sandbox("sb-1") + "/ca-certificates.crt";
  SandboxSpec spec = g.from_image(kPasswd, kGroup);
  write_file(g.paths.sandbox("sb-1") + "/.keep", "");
  const auto start = std::chrono::steady_clock::now();
  write_ca_bundle(spec, g.paths.sandbox("sb-1"), "SANDBOX CA PEM\n");
  std::printf(
      "write_ca_bundle with the host's roots: %.1f us\n",
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count());
  std::string text;
  ASSERT_EQ(files::read_into(bundle, &text), 0);
  EXPECT_THAT(text, HasSubstr(std::string(kSandboxCaLine) + "\nSANDBOX CA PEM\n"));
  const std::string host = ca_bundles::host_path();
  if (!host.empty()) {
    std::string roots;
    ASSERT_EQ(files::read_into(host, &roots), 0);
    EXPECT_EQ(text.substr(0, roots.size()), roots);
  }
  // A new start, a new CA: the file is written afresh.
  write_ca_bundle(spec, g.paths.sandbox("sb-1"), "ANOTHER CA\n");
  text.clear();  // read_into appends
  ASSERT_EQ(files::read_into(bundle, &text), 0);
  EXPECT_EQ(text.find("SANDBOX CA PEM"), std::string::npos);
  EXPECT_NE(text.find(std::string(kSandboxCaLine) + "\nANOTHER CA\n"), std::string::npos);
  // A micro-VM gets none.
  ::unlink(bundle.c_str());
  spec.vm.emplace();
  write_ca_bundle(spec, g.paths.sandbox("sb-1"), "SANDBOX CA PEM\n");
  EXPECT_FALSE(files::exists(bundle));
}

TEST(ContainerSpecRoot, AOneShotSandboxThrowsItsLayerAway) {
  Gateway g;
  SandboxSpec image = g.from_image(kPasswd, kGroup);
  Placement where = g.one_shot();
  where.one_shot->read_only = true;
  where.one_shot->binds = {{"/src", "/dst", true}};
  runtime::ContainerSpec c = container_spec_for(image, where);
  EXPECT_THAT(c.fs.layer_dir, IsEmpty());
  EXPECT_TRUE(c.fs.read_only);
  ASSERT_EQ(c.fs.binds.size(), 1u);
  EXPECT_EQ(c.fs.binds[0].target, "/dst");
  EXPECT_EQ(c.fs.workdir, "/");
  EXPECT_THAT(c.fs.home, IsEmpty());
  EXPECT_EQ(c.cgroup_name, "openshell-run-1");
  image.image->working_dir = "/app";
  EXPECT_EQ(container_spec_for(image, where).fs.workdir, "/app");
  where.one_shot->workdir = "/work";
  EXPECT_EQ(container_spec_for(image, where).fs.workdir, "/work");
}

// --- limits ----------------------------------------------------------------------------

TEST(ContainerSpecLimits, DefaultsAndCoreDumps) {
  Gateway g;
  SandboxSpec spec;
  spec.memory_bytes = 64u << 20;
  for (const Placement& where : {g.sandbox(), g.one_shot()}) {
    runtime::ContainerSpec c = container_spec_for(spec, where);
    EXPECT_EQ(c.limits.pids, limits::kDefaultPids);
    EXPECT_EQ(c.fs.tmp_size, 64u << 20);
    EXPECT_EQ(c.fs.shm_size, 32u << 20);
    ASSERT_EQ(c.rlimits.size(), 1u);
    EXPECT_EQ(c.rlimits[0].resource, RLIMIT_CORE);
    EXPECT_EQ(c.rlimits[0].hard, 0u);
  }
  spec.pids = 0;
  EXPECT_FALSE(container_spec_for(spec, g.sandbox()).limits.pids);
}

}  // namespace
}  // namespace openshell::spec

namespace openshell::spec {
namespace {

// create --user travels in the spec (the launch file signs it) and is
// checked for its shape before the gateway sees it.
TEST(SandboxSpecUser, KeptThroughJsonAndCheckedForItsShape) {
  SandboxSpec spec;
  EXPECT_EQ(SandboxSpec::from_json(spec.to_json()).user, "");
  EXPECT_EQ(spec.to_json().find("\"user\""), std::string::npos) << "left out when unset";
  spec.user = "1234:55";
  EXPECT_EQ(SandboxSpec::from_json(spec.to_json()).user, "1234:55");
  for (const std::string bad : {":", ":55", "1234:", "a\nb"}) {
    SandboxSpec s;
    s.user = bad;
    EXPECT_EQ(error_of([&] { s.validate(); }),
              "--user " + s.user + ": expected UID[:GID] or NAME[:GROUP]");
  }
  for (const char* good : {"0", "root", "sandbox:staff", "1000:0"}) {
    SandboxSpec s;
    s.user = good;
    EXPECT_NO_THROW(s.validate()) << good;
  }
}

// create --bind: kept in the spec's JSON, mounted at every launch, and
// reachable through the filesystem policy's Landlock rules as bound; the
// sandbox's root has an /etc/hosts naming its own host name.
TEST(ContainerSpecBinds, StoredMountedAndReachable) {
  Gateway g;
  SandboxSpec spec;
  spec.from = "example/app";
  spec.binds = {{"/srv/data", "/data", false}, {"/srv/ref", "/ref", true}};
  SandboxSpec back = SandboxSpec::from_json(spec.to_json());
  EXPECT_EQ(back.binds, spec.binds);
  g.make_layer();
  image::ImageRecord record;
  record.name = "localhost/example/app:latest";
  record.diff_ids = {kLayer};
  resolve_image(&back, record);
  runtime::ContainerSpec c = container_spec_for(back, g.sandbox());
  ASSERT_EQ(c.fs.binds.size(), 2u);
  EXPECT_EQ(c.fs.binds[0].source, "/srv/data");
  EXPECT_EQ(c.fs.binds[0].target, "/data");
  EXPECT_FALSE(c.fs.binds[0].read_only);
  EXPECT_TRUE(c.fs.binds[1].read_only);
  EXPECT_EQ(c.fs.hosts_name, "box");
  std::string rules;
  for (const auto& rule : c.landlock.rules) rules += rule.path + " ";
  EXPECT_THAT(rules, HasSubstr("/data "));
  EXPECT_THAT(rules, HasSubstr("/ref "));
  SandboxSpec relative = spec;
  relative.binds = {{"srv", "/data", false}};
  EXPECT_THROW(relative.validate(), Error);
}

}  // namespace
}  // namespace openshell::spec
