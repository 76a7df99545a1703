// CDI specs (runtime/cdi.h) as hostile input, the GPU plan built from them
// and from discovery (runtime/gpu.h) against fake device nodes, the device
// groups' id map and the cgroup's device rules.
#include "runtime/cdi.h"

#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstring>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "namespaces/userns.h"
#include "runtime/cgroup.h"
#include "runtime/gpu.h"
#include "test_util.h"

namespace openshell::runtime {
namespace {

using openshell::testing::error_of;
using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::HasSubstr;

// What `nvidia-ctk cdi generate` writes, in its YAML shape.
constexpr const char* kNvidiaYaml = R"(---
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: all
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
    hostPath: /dev/nvidiactl
    type: c
    major: 195
    minor: 255
    permissions: rw
    fileMode: 0o666
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-cdi-hook
    args:
    - nvidia-cdi-hook
    - update-ldcache
    - --folder
    - /usr/lib/x86_64-linux-gnu
    env:
    - NVIDIA_CTK_DEBUG=false
    timeout: 10
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14
    options:
    - ro
    - nosuid
    - nodev
    - bind
  additionalGids: [44]
)";

TEST(CdiParse, ReadsNvidiaCtksYaml) {
  cdi::Spec spec = cdi::parse(kNvidiaYaml, "nvidia.yaml", true);
  EXPECT_EQ(spec.version, "0.5.0");
  EXPECT_EQ(spec.kind, "nvidia.com/gpu");
  ASSERT_EQ(spec.devices.size(), 2u);
  EXPECT_EQ(spec.devices[0].name, "0");  // a quoted number stays a name
  ASSERT_NE(spec.find("all"), nullptr);
  EXPECT_EQ(spec.find("all")->edits.device_nodes[0].path, "/dev/nvidia0");
  ASSERT_EQ(spec.edits.device_nodes.size(), 1u);
  const cdi::DeviceNode& ctl = spec.edits.device_nodes[0];
  EXPECT_EQ(ctl.type, 'c');
  EXPECT_EQ(ctl.major, 195);
  EXPECT_EQ(ctl.minor, 255);
  EXPECT_EQ(ctl.permissions, "rw");
  EXPECT_EQ(ctl.file_mode, 0666u);
  ASSERT_EQ(spec.edits.hooks.size(), 1u);
  EXPECT_EQ(spec.edits.hooks[0].stage, HookStage::kCreateContainer);
  EXPECT_EQ(spec.edits.hooks[0].args.size(), 4u);
  EXPECT_EQ(spec.edits.hooks[0].env, std::vector<std::string>{"NVIDIA_CTK_DEBUG=false"});
  EXPECT_EQ(spec.edits.hooks[0].timeout_s, 10);
  ASSERT_EQ(spec.edits.mounts.size(), 1u);
  EXPECT_EQ(spec.edits.mounts[0].options.size(), 4u);
  EXPECT_EQ(spec.edits.env, std::vector<std::string>{"NVIDIA_VISIBLE_DEVICES=void"});
  EXPECT_EQ(spec.edits.additional_gids, std::vector<uint32_t>{44});
}

TEST(CdiParse, ReadsJson) {
  cdi::Spec spec = cdi::parse(
      R"({"cdiVersion":"0.8.0","kind":"nvidia.com/gpu","devices":[{"name":"1",
          "containerEdits":{"deviceNodes":[{"path":"/dev/nvidia1","hostPath":"/dev//nvidia1"}],
          "hooks":[{"hookName":"prestart","path":"/bin/true"}]}}]})",
      "nvidia.json", false);
  ASSERT_EQ(spec.devices.size(), 1u);
  EXPECT_EQ(spec.devices[0].edits.device_nodes[0].host_path, "/dev/nvidia1");  // normalised
  EXPECT_EQ(spec.devices[0].edits.hooks[0].stage, HookStage::kCreateRuntime);
}

// Each bad file's error names the file and the field.
TEST(CdiParse, RefusesBadFilesNamingTheField) {
  auto error = [](const std::string& text, bool yaml = false) {
    return error_of([&] { cdi::parse(text, "/etc/cdi/x.json", yaml); });
  };
  const std::string head = R"({"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":)";
  auto with_node = [&](const std::string& node) {
    return error(head + R"([{"name":"0","containerEdits":{"deviceNodes":[)" + node + "]}}]}");
  };
  EXPECT_EQ(error("[]"), "/etc/cdi/x.json: not a CDI spec (expected a mapping at the top)");
  EXPECT_THAT(error("{"), HasSubstr("/etc/cdi/x.json: not JSON"));
  EXPECT_EQ(error(R"({"cdiVersion":"1.0.0","kind":"a.example/b","devices":[]})"),
            "/etc/cdi/x.json: cdiVersion: '1.0.0' is not supported (0.3.0 to 0.8.0 are)");
  EXPECT_EQ(error(R"({"cdiVersion":"0.2.0","kind":"a.example/b","devices":[]})"),
            "/etc/cdi/x.json: cdiVersion: '0.2.0' is not supported (0.3.0 to 0.8.0 are)");
  EXPECT_EQ(error(R"({"cdiVersion":"0.6.0","devices":[]})"), "/etc/cdi/x.json: kind: missing");
  EXPECT_EQ(error(R"({"cdiVersion":"0.6.0","kind":"nogpu","devices":[]})"),
            "/etc/cdi/x.json: kind: 'nogpu': expected VENDOR/CLASS, a vendor's domain and a device "
            "class");
  EXPECT_EQ(error(R"({"cdiVersion":"0.6.0","kind":"a.example/b"})"),
            "/etc/cdi/x.json: devices: missing");
  EXPECT_EQ(error(head + R"({"name":"0"}})"), "/etc/cdi/x.json: devices: must be a list");
  EXPECT_EQ(error(head + R"([{"name":"../x","containerEdits":{}}]})"),
            "/etc/cdi/x.json: devices[0].name: '../x': letters, digits, '_', '-', '.' and ':'");
  EXPECT_EQ(error(head + R"([{"name":"0","containerEdits":{}},{"name":"0","containerEdits":{}}]})"),
            "/etc/cdi/x.json: devices[1].name: '0' is given twice");
  EXPECT_EQ(error(head + R"([{"name":"0"}]})"),
            "/etc/cdi/x.json: devices[0].containerEdits: missing");
  EXPECT_EQ(with_node(R"({"path":"dev/nvidia0"})"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].path: must be an absolute "
            "path");
  EXPECT_EQ(
      with_node(R"({"path":"/dev/../etc/shadow"})"),
      "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].path: must not contain '..'");
  EXPECT_EQ(with_node(R"({"path":"/dev/a","major":-1})"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].major: must be between 0 "
            "and 4095");
  EXPECT_EQ(with_node(R"({"path":"/dev/a","major":"195"})"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].major: must be a whole "
            "number");
  EXPECT_EQ(with_node(R"({"path":"/dev/a","minor":18446744073709551615})"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].minor: above 1048575");
  EXPECT_EQ(with_node(R"({"path":"/dev/a","type":"x"})"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].type: must be c, b, u or "
            "p, not 'x'");
  EXPECT_EQ(with_node(R"({"path":"/dev/a","permissions":"rwx"})"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].permissions: must be made "
            "of r, w and m, not 'rwx'");
  EXPECT_EQ(with_node(R"({"path":"/dev/a\u0000b"})"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0].path: holds a NUL byte");
  EXPECT_EQ(with_node(R"("/dev/a")"),
            "/etc/cdi/x.json: devices[0].containerEdits.deviceNodes[0]: must be a mapping");
  EXPECT_EQ(error(head + R"([],"containerEdits":{"env":["NOEQUALS"]}})"),
            "/etc/cdi/x.json: containerEdits.env[0]: expected KEY=VALUE, got 'NOEQUALS'");
  EXPECT_EQ(error(head + R"([],"containerEdits":{"hooks":[{"hookName":"later","path":"/x"}]}})"),
            "/etc/cdi/x.json: containerEdits.hooks[0].hookName: 'later': expected createRuntime, "
            "createContainer, startContainer, poststart or poststop");
  EXPECT_EQ(error(head + R"([],"containerEdits":{"hooks":[{"hookName":"poststop"}]}})"),
            "/etc/cdi/x.json: containerEdits.hooks[0].path: missing");
  EXPECT_EQ(
      error(head +
            R"([],"containerEdits":{"hooks":[{"hookName":"poststop","path":"/x","timeout":0}]}})"),
      "/etc/cdi/x.json: containerEdits.hooks[0].timeout: must be between 1 and 3600");
  EXPECT_EQ(error(head + R"([],"containerEdits":{"mounts":[{"hostPath":"/a","containerPath":"/b",
             "type":"tmpfs"}]}})"),
            "/etc/cdi/x.json: containerEdits.mounts[0].type: 'tmpfs': only bind mounts are "
            "supported");
  EXPECT_EQ(error(head + R"([],"containerEdits":{"mounts":[{"hostPath":"/a"}]}})"),
            "/etc/cdi/x.json: containerEdits.mounts[0].containerPath: missing");
  EXPECT_EQ(error(head + R"([],"containerEdits":{"additionalGids":[-5]}})"),
            "/etc/cdi/x.json: containerEdits.additionalGids[0]: must be a group id (a whole "
            "number below 4294967295)");
  EXPECT_EQ(error(std::string(100, '[') + std::string(100, ']')),
            "/etc/cdi/x.json: nested too deeply");
  EXPECT_EQ(error(std::string(cdi::kMaxFileBytes + 1, ' ')), "/etc/cdi/x.json: larger than 4 MiB");
}

TEST(CdiParse, RefusesBadYamlNamingTheLine) {
  auto error = [](const std::string& text) {
    return error_of([&] { cdi::parse(text, "/etc/cdi/x.yaml", true); });
  };
  EXPECT_THAT(error("cdiVersion: 0.5.0\nkind: [unclosed\n"), HasSubstr("/etc/cdi/x.yaml:"));
  EXPECT_EQ(error("a: 1\n---\nb: 2\n"), "/etc/cdi/x.yaml: more than one YAML document");
  EXPECT_EQ(error("cdiVersion: 0.5.0\ncdiVersion: 0.6.0\n"),
            "/etc/cdi/x.yaml:2: cdiVersion: the key is given twice");
  // A plain number is not a string: cdiVersion must be quoted or dotted.
  EXPECT_EQ(error("cdiVersion: 5\nkind: a.example/b\ndevices: []\n"),
            "/etc/cdi/x.yaml: cdiVersion: must be a string");
  // Aliases that repeat a subtree exponentially are bounded.
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char c = 'b'; c <= 'k'; ++c)
    bomb += std::string(1, c) + ": &" + c + " [*" + static_cast<char>(c - 1) + ", *" +
            static_cast<char>(c - 1) + ", *" + static_cast<char>(c - 1) + ", *" +
            static_cast<char>(c - 1) + "]\n";
  EXPECT_THAT(error(bomb), HasSubstr("too many nodes"));
}

TEST(CdiLoad, RefusesFilesOthersMayWriteAndPrefersTheLaterDirectory) {
  TempDir dir;
  const std::string spec = R"({"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","devices":[
      {"name":"0","containerEdits":{"env":["FROM=WHERE"]}}]})";
  auto with = [&](const std::string& where) {
    std::string s = spec;
    s.replace(s.find("WHERE"), 5, where);
    return s;
  };
  write_file(dir / "etc/nvidia.json", with("etc"));
  write_file(dir / "run/nvidia.json", with("run"));
  write_file(dir / "run/other.json",
             R"({"cdiVersion":"0.6.0","kind":"vendor.example/fpga","devices":[]})");
  write_file(dir / "run/bad.yaml", "cdiVersion: [");
  write_file(dir / "run/notes.txt", "not a spec");
  std::vector<std::string> skipped;
  auto specs =
      cdi::load_kind({dir / "etc", dir / "run", dir / "missing"}, "nvidia.com/gpu", &skipped);
  ASSERT_EQ(specs.size(), 2u);
  EXPECT_EQ(specs[0].devices[0].edits.env[0], "FROM=run");
  EXPECT_EQ(specs[1].devices[0].edits.env[0], "FROM=etc");
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_THAT(skipped[0], HasSubstr(dir / "run/bad.yaml"));

  ::chmod((dir / "etc/nvidia.json").c_str(), 0666);
  EXPECT_EQ(error_of([&] { cdi::load_file(dir / "etc/nvidia.json"); }),
            dir / "etc/nvidia.json" +
                ": writable by its group or others (a CDI spec names programs to run)");
  ::symlink((dir / "run/nvidia.json").c_str(), (dir / "etc/link.json").c_str());
  EXPECT_THAT(error_of([&] { cdi::load_file(dir / "etc/link.json"); }),
              HasSubstr("open the CDI spec " + dir / "etc/link.json"));
}

TEST(GpuRequest, ParsesAllAndCounts) {
  EXPECT_FALSE(gpu::parse_request(""));
  EXPECT_TRUE(gpu::parse_request("all")->all);
  EXPECT_EQ(gpu::parse_request("2")->count, 2u);
  EXPECT_FALSE(gpu::parse_request("2")->all);
  for (const char* bad : {"0", "-1", "two", "1025", "1.5"})
    EXPECT_EQ(error_of([&] { gpu::parse_request(bad); }),
              std::string("--gpu ") + bad + ": expected a number of GPUs (1 to 1024) or 'all'");
}

TEST(GpuLdCache, ReadsGlibcsFormat) {
  // Header (48 bytes), two entries (24 each), then the strings.
  std::string cache = "ld.so-1.7.0";  // the old format's magic before the new one
  std::string data(48 + 2 * 24, '\0');
  std::memcpy(data.data(), "glibc-ld.so.cache1.1", 20);
  const uint32_t count = 2;
  std::memcpy(data.data() + 20, &count, 4);
  std::string strings;
  auto add = [&](int i, const std::string& key, const std::string& value) {
    uint32_t key_at = static_cast<uint32_t>(data.size() + strings.size());
    strings += key + '\0';
    uint32_t value_at = static_cast<uint32_t>(data.size() + strings.size());
    strings += value + '\0';
    std::memcpy(data.data() + 48 + i * 24 + 4, &key_at, 4);
    std::memcpy(data.data() + 48 + i * 24 + 8, &value_at, 4);
  };
  add(0, "libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  add(1, "libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6");
  cache += data + strings;
  EXPECT_EQ(gpu::ld_cache_paths(cache),
            (std::vector<std::string>{"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                                      "/lib/x86_64-linux-gnu/libc.so.6"}));
  EXPECT_TRUE(gpu::ld_cache_paths("garbage").empty());
  // A count beyond the file is not believed.
  std::string lying = cache;
  const uint32_t many = 1u << 30;
  std::memcpy(lying.data() + 11 + 20, &many, 4);
  EXPECT_TRUE(gpu::ld_cache_paths(lying).empty());
}

// Fake device nodes need mknod: root only.
class GpuPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::geteuid() != 0) GTEST_SKIP() << "fake device nodes need mknod (root)";
    for (const char* name : {"nvidia0", "nvidia1", "nvidiactl", "nvidia-caps/nvidia-cap1"}) {
      const std::string path = root_ / ("dev/" + std::string(name));
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      ASSERT_EQ(::mknod(path.c_str(), S_IFCHR | 0660, makedev(1, 3)), 0) << path;
      ASSERT_EQ(::chown(path.c_str(), 0, 4242), 0);
    }
    write_file(root_ / "usr/lib/x86_64-linux-gnu/libcuda.so.1", "fake");
    write_file(root_ / "usr/lib/x86_64-linux-gnu/libc.so.6", "not nvidia's");
    write_file(root_ / "usr/bin/nvidia-smi", "#!/bin/sh\n");
    write_file(root_ / "notes", "x");
    host_.cdi_dirs = {root_ / "cdi"};
    host_.root = root_.path();
  }
  TempDir root_;
  gpu::Host host_;
};

TEST_F(GpuPlan, DiscoveryTakesTheFirstGpusControlNodesLibrariesAndNvidiaSmi) {
  gpu::Plan plan = gpu::plan(*gpu::parse_request("1"), host_);
  std::vector<std::string> paths;
  for (const auto& n : plan.nodes) paths.push_back(n.path);
  EXPECT_EQ(paths, (std::vector<std::string>{"/dev/nvidia0", "/dev/nvidiactl",
                                             "/dev/nvidia-caps/nvidia-cap1"}));
  EXPECT_EQ(plan.nodes[0].major, 1u);
  EXPECT_EQ(plan.nodes[0].minor, 3u);
  EXPECT_EQ(plan.groups, std::vector<uint32_t>{4242});
  ASSERT_EQ(plan.mounts.size(), 2u);
  EXPECT_EQ(plan.mounts[0].target, "/usr/lib/x86_64-linux-gnu/libcuda.so.1");
  EXPECT_EQ(plan.mounts[0].source, root_ / "usr/lib/x86_64-linux-gnu/libcuda.so.1");
  EXPECT_TRUE(plan.mounts[0].read_only);
  EXPECT_EQ(plan.mounts[1].target, "/usr/bin/nvidia-smi");
  EXPECT_EQ(gpu::plan(gpu::Request{}, host_).devices,
            (std::vector<std::string>{"/dev/nvidia0", "/dev/nvidia1"}));
  EXPECT_EQ(error_of([&] { gpu::plan(*gpu::parse_request("3"), host_); }),
            "--gpu 3: this host has 2 NVIDIA GPUs (" + root_ / "dev/nvidia*)");
  host_.root = root_ / "usr";
  EXPECT_THAT(error_of([&] { gpu::plan(gpu::Request{}, host_); }),
              HasSubstr("--gpu all: no NVIDIA GPU here: no CDI spec of kind nvidia.com/gpu in "));
}

TEST_F(GpuPlan, CdiSpecsEditsAndTheirErrors) {
  const std::string dev = root_ / "dev";
  auto spec = [&](const std::string& devices, const std::string& edits = "{}") {
    write_file(root_ / "cdi/nvidia.json",
               R"({"cdiVersion":"0.6.0","kind":"nvidia.com/gpu","containerEdits":)" + edits +
                   R"(,"devices":)" + devices + "}");
  };
  auto node = [&](const std::string& name) {
    return R"({"name":")" + name + R"(","containerEdits":{"env":["GPU)" + name +
           R"(=1"],"deviceNodes":[{"path":"/dev/nvidia)" + name + R"(","hostPath":")" + dev +
           "/nvidia" + name + R"("}]}})";
  };
  spec("[" + node("0") + "," + node("1") + "]",
       R"({"env":["TOP=1"],"deviceNodes":[{"path":"/dev/nvidiactl","hostPath":")" + dev +
           R"(/nvidiactl","permissions":"rw"}],"mounts":[{"hostPath":")" +
           root_ / "usr/lib/x86_64-linux-gnu/libcuda.so.1" +
           R"(","containerPath":"/usr/lib/libcuda.so.1","options":["rw","bind"]}],)"
           R"("hooks":[{"hookName":"createContainer","path":"/bin/true"}]})");
  gpu::Plan plan = gpu::plan(*gpu::parse_request("1"), host_);
  EXPECT_EQ(plan.source, "CDI spec " + root_ / "cdi/nvidia.json");
  EXPECT_EQ(plan.devices, std::vector<std::string>{"nvidia.com/gpu=0"});
  EXPECT_EQ(plan.env, (std::vector<std::string>{"TOP=1", "GPU0=1"}));
  ASSERT_EQ(plan.nodes.size(), 2u);
  EXPECT_EQ(plan.nodes[0].path, "/dev/nvidiactl");
  EXPECT_EQ(plan.nodes[0].access, "rw");
  EXPECT_EQ(plan.nodes[1].access, "rwm");  // CDI's default
  ASSERT_EQ(plan.mounts.size(), 1u);
  EXPECT_FALSE(plan.mounts[0].read_only);  // the spec said rw
  EXPECT_EQ(plan.hooks.size(), 1u);
  EXPECT_EQ(gpu::plan(gpu::Request{}, host_).devices,
            (std::vector<std::string>{"nvidia.com/gpu=0", "nvidia.com/gpu=1"}));
  EXPECT_EQ(error_of([&] { gpu::plan(*gpu::parse_request("3"), host_); }),
            "--gpu 3: the CDI specs of nvidia.com/gpu (" + root_ / "cdi/nvidia.json" +
                ") name GPUs 0, 1 only");

  const std::string shown = root_ / "cdi/nvidia.json" + ": device 0: ";
  auto bad_node = [&](const std::string& fields) {
    spec(R"([{"name":"0","containerEdits":{"deviceNodes":[{)" + fields + "}]}}]");
    return error_of([&] { gpu::plan(*gpu::parse_request("1"), host_); });
  };
  EXPECT_EQ(bad_node(R"("path":"/dev/nvidia0","hostPath":")" + root_ / "notes" + "\""),
            shown + root_ / "notes" + ": not a device node");
  EXPECT_EQ(bad_node(R"("path":"/dev/nvidia0","hostPath":")" + dev + "/gone\""),
            shown + "the device node " + dev + "/gone: No such file or directory");
  EXPECT_EQ(bad_node(R"("path":"/etc/nvidia0","hostPath":")" + dev + "/nvidia0\""),
            shown + "/etc/nvidia0: only device nodes below /dev are supported");
  EXPECT_EQ(bad_node(R"("path":"/dev/null","hostPath":")" + dev + "/nvidia0\""),
            shown + "/dev/null: openshell's own /dev has it");
  EXPECT_EQ(bad_node(R"("path":"/dev/nvidia0","hostPath":")" + dev + R"(/nvidia0","major":195)"),
            shown + dev + "/nvidia0: 195:3 given, the node is 1:3");
  EXPECT_EQ(bad_node(R"("path":"/dev/nvidia0","hostPath":")" + dev + R"(/nvidia0","type":"b")"),
            shown + dev + "/nvidia0: type b given, the node is c");
}

TEST(GpuGroups, MappedAtTheirOwnNumbersOutOfTheRange) {
  namespaces::IdMap map;
  map.gid = {{0, 0x70000000, 65536}};
  EXPECT_EQ(namespaces::map_host_groups(&map, {44, 0, 44, 105}), (std::vector<uint32_t>{44, 105}));
  EXPECT_EQ(map.gid, (std::vector<namespaces::IdRange>{{0, 0x70000000, 44},
                                                       {45, 0x70000000 + 45, 60},
                                                       {106, 0x70000000 + 106, 65430},
                                                       {44, 44, 1},
                                                       {105, 105, 1}}));
  EXPECT_EQ(map.host_gid(44), 44u);
  EXPECT_EQ(map.host_gid(43), 0x70000000u + 43);
  EXPECT_EQ(map.host_gid(65535), 0x70000000u + 65535);
}

TEST(GpuCgroup, DeviceRulesDenyAllThenAllowEachOnV1) {
  TempDir root;
  std::filesystem::create_directories(root / "devices/parent");
  CgroupLayout layout;
  layout.controllers["devices"] = {root / "devices/parent"};
  Limits limits;
  limits.devices = default_device_rules();
  limits.devices->push_back({'c', 195, 0, "rwm"});
  std::vector<std::string> not_enforced;
  {
    CgroupSet set = CgroupSet::create(layout, "openshell-test", limits, &not_enforced);
    EXPECT_TRUE(not_enforced.empty());
    // A regular file in the fake tree shows the last write over the others.
    EXPECT_EQ(openshell::testing::read_file(root / "devices/parent/openshell-test/devices.deny"),
              "a");
    EXPECT_EQ(openshell::testing::read_file(root / "devices/parent/openshell-test/devices.allow"),
              "c 195:0 rwm");
    // A fake tree's cgroup is a plain directory: emptied for its removal.
    for (const char* knob : {"devices.deny", "devices.allow"})
      ::unlink((root / ("devices/parent/openshell-test/" + std::string(knob))).c_str());
  }
  EXPECT_EQ(DeviceRule({'c', 136, std::nullopt, "rwm"}).text(), "c 136:* rwm");
  Limits none;
  none.devices = std::vector<DeviceRule>{};
  CgroupLayout v2_only;
  CgroupSet set = CgroupSet::create(v2_only, "x", none, &not_enforced);
  ASSERT_EQ(not_enforced.size(), 1u);
  EXPECT_EQ(not_enforced[0],
            "--gpu: no cgroup hierarchy has the devices controller (cgroup v2's device filter is "
            "a BPF program, not loaded)");
}

TEST(Hooks, RunWithTheStateOnStdinAndReportFailures) {
  TempDir dir;
  write_file(dir / "hook", "#!/bin/sh\n/bin/cat > \"$OUT/$1\"\nexit $2\n");
  ::chmod((dir / "hook").c_str(), 0755);
  const std::string out = "OUT=" + dir.path();
  std::vector<Hook> hooks = {
      {HookStage::kPoststart, dir / "hook", {"hook", "first", "0"}, {out}, std::nullopt},
      {HookStage::kPoststop, dir / "hook", {"hook", "stop", "0"}, {out}, std::nullopt},
      {HookStage::kPoststart, dir / "hook", {"hook", "second", "3"}, {out}, std::nullopt},
      {HookStage::kPoststart, dir / "hook", {"hook", "third", "0"}, {out}, std::nullopt}};
  const std::string state = hook_state_json("id1", "running", 42, "/b");
  EXPECT_EQ(run_hooks(hooks, HookStage::kPoststart, state),
            "poststart hook " + dir / "hook" + ": exited with 3");
  EXPECT_EQ(openshell::testing::read_file(dir / "first"), state);
  EXPECT_THAT(state, HasSubstr(R"("pid":42)"));
  EXPECT_THAT(state, HasSubstr(R"("status":"running")"));
  EXPECT_FALSE(openshell::testing::path_exists(dir / "third"));  // not after a failure
  EXPECT_FALSE(openshell::testing::path_exists(dir / "stop"));   // another stage
  std::vector<Hook> slow = {{HookStage::kPoststop, "/bin/sleep", {"sleep", "30"}, {}, 1}};
  EXPECT_EQ(run_hooks(slow, HookStage::kPoststop, state),
            "poststop hook /bin/sleep: still running after 1 s, killed");
  std::vector<Hook> missing = {{HookStage::kPoststop, dir / "none", {}, {}, std::nullopt}};
  EXPECT_EQ(run_hooks(missing, HookStage::kPoststop, state),
            "poststop hook " + dir / "none" + ": start: No such file or directory");
}

}  // namespace
}  // namespace openshell::runtime
