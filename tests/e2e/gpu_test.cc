// GPUs (--gpu; docs/gpu.md) against a fake host: device nodes made with
// mknod in the test's own directory (copies of /dev/null and /dev/zero,
// named nvidia0, nvidia1 and nvidiactl, group kGpuGroup, mode 0660), a fake
// driver library and nvidia-smi, a CDI spec naming them, and a hook that
// leaves the state it was given. As root and rootless (the rootless users
// are put in kGpuGroup, as a host's video group holds its GPU users).
//
// GpuHardware runs nvidia-smi and a small CUDA program in a sandbox where
// the host has a real NVIDIA GPU, and skips elsewhere.
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <gmock/gmock.h>

#include "harness.h"

using testing::HasSubstr;
using testing::Not;

namespace e2e {
namespace {

// A group no test user has: the nodes' group.
constexpr gid_t kGpuGroup = 4242;

class Gpu : public GatewayTest {
 protected:
  Gpu() : GatewayTest("gpu") {}

  void SetUp() override {
    GatewayTest::SetUp();
    if (IsSkipped()) return;
    static int counter = 0;
    host_ = scratch() + "/gpu-host-" + mode_name(mode()) + "-" + std::to_string(++counter);
    std::filesystem::remove_all(host_);
    struct Node {
      const char* name;
      unsigned minor;
    };
    for (Node n : {Node{"nvidia0", 3}, Node{"nvidia1", 5}, Node{"nvidiactl", 5},
                   Node{"nvidia-caps/nvidia-cap1", 3}}) {
      const std::string path = host_ + "/dev/" + n.name;
      std::filesystem::create_directories(std::filesystem::path(path).parent_path());
      ASSERT_EQ(::mknod(path.c_str(), S_IFCHR | 0660, makedev(1, n.minor)), 0) << path;
      ASSERT_EQ(::chown(path.c_str(), 0, kGpuGroup), 0);
      ASSERT_EQ(::chmod(path.c_str(), 0660), 0);
    }
    std::filesystem::create_directories(host_ + "/usr/lib/x86_64-linux-gnu");
    std::filesystem::create_directories(host_ + "/usr/bin");
    write_file(host_ + "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "fake libcuda\n");
    write_file(host_ + "/usr/bin/nvidia-smi", "#!/bin/sh\necho fake nvidia-smi\n", 0755);
    // The hook leaves its stdin (the state) in marks/ARG.json.
    marks_ = make_dir(mode(), "gpu-marks-" + mode_name(mode()) + "-" + std::to_string(counter));
    write_file(host_ + "/hook", "#!/bin/sh\n/bin/cat > \"$MARKS/$1.json\"\n", 0755);
    std::filesystem::create_directories(host_ + "/cdi");
    const std::string dev = host_ + "/dev";
    auto node = [&](const std::string& name) {
      return "    - path: /dev/" + name + "\n      hostPath: " + dev + "/" + name + "\n";
    };
    write_file(host_ + "/cdi/nvidia.yaml",
               "---\n"
               "cdiVersion: 0.6.0\n"
               "kind: nvidia.com/gpu\n"
               "devices:\n"
               "- name: \"0\"\n"
               "  containerEdits:\n"
               "    env: [OSH_GPU0=yes]\n"
               "    deviceNodes:\n" +
                   node("nvidia0") +
                   "- name: \"1\"\n"
                   "  containerEdits:\n"
                   "    deviceNodes:\n" +
                   node("nvidia1") +
                   "- name: all\n"
                   "  containerEdits:\n"
                   "    deviceNodes:\n" +
                   node("nvidia0") + node("nvidia1") +
                   "containerEdits:\n"
                   "  env:\n"
                   "  - OSH_GPU_TEST=from-cdi\n"
                   "  deviceNodes:\n" +
                   node("nvidiactl") +
                   "  mounts:\n"
                   "  - hostPath: " +
                   host_ +
                   "/usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
                   "    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.1\n"
                   "    options: [ro, nosuid, nodev, bind]\n"
                   "  hooks:\n"
                   "  - hookName: createContainer\n"
                   "    path: " +
                   host_ +
                   "/hook\n"
                   "    args: [hook, created]\n"
                   "    env: [MARKS=" +
                   marks_ +
                   "]\n"
                   "  - hookName: poststop\n"
                   "    path: " +
                   host_ +
                   "/hook\n"
                   "    args: [hook, stopped]\n"
                   "    env: [MARKS=" +
                   marks_ + "]\n");
    // A hostile neighbour: skipped with a warning, never fatal.
    write_file(host_ + "/cdi/broken.json", "{\"cdiVersion\": [");
  }

  // The fake host's CDI spec, and the rootless user in the nodes' group.
  Options gpu_host(Options o = {}) const {
    o.env.push_back("OPENSHELL_CDI_DIRS=" + host_ + "/cdi");
    if (is_rootless(mode())) o.groups = {kGpuGroup};
    return o;
  }
  // No CDI spec: discovery under the fake host's root.
  Options discovery_host() const {
    Options o;
    o.env = {"OPENSHELL_CDI_DIRS=", "OPENSHELL_GPU_ROOT=" + host_};
    if (is_rootless(mode())) o.groups = {kGpuGroup};
    return o;
  }

  std::string host_, marks_;
};

constexpr const char* kOpened = "ok: opened read-write, wrote 1 byte, ioctl ENOTTY";

TEST_P(Gpu, RunGetsTheCdiSpecsNodesEnvMountsAndHooks) {
  Result r = sandbox(mode(), {"--gpu"},
                     {"sh", "-c",
                      "ls /dev/nvidia0 /dev/nvidia1 /dev/nvidiactl; "
                      "osh-probe open-device /dev/nvidia0; osh-probe open-device /dev/nvidiactl; "
                      "echo env=$OSH_GPU_TEST,$OSH_GPU0; "
                      "cat /usr/lib/x86_64-linux-gnu/libcuda.so.1; "
                      "osh-probe write /usr/lib/x86_64-linux-gnu/libcuda.so.1; true"},
                     gpu_host());
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("/dev/nvidia0\n/dev/nvidia1\n/dev/nvidiactl\n"));
  // The sandbox's user (1000, not the nodes' owner) opens them through
  // their group, writes, and its ioctl reaches the driver (seccomp lets it).
  EXPECT_THAT(r.out, HasSubstr(std::string(kOpened) + "\n" + kOpened + "\n"));
  // "all" is the spec's own device of that name, not device 0.
  EXPECT_THAT(r.out, HasSubstr("env=from-cdi,\n"));
  EXPECT_THAT(r.out, HasSubstr("fake libcuda\ndenied: EROFS"));
  EXPECT_THAT(r.err, HasSubstr("CDI spec skipped: " + host_ + "/cdi/broken.json"));
  // The hooks ran with the state: createContainer before the command,
  // poststop after it.
  const std::string created = file_contents(marks_ + "/created.json");
  EXPECT_THAT(created, HasSubstr("\"status\":\"created\""));
  EXPECT_THAT(created, HasSubstr("\"pid\":"));
  EXPECT_THAT(created, HasSubstr("\"bundle\":\"/"));
  EXPECT_THAT(file_contents(marks_ + "/stopped.json"), HasSubstr("\"status\":\"stopped\""));
}

// Without the nodes' group the user cannot open them: the group kept is
// what lets it (rootless: the caller's own supplementary groups).
TEST_P(Gpu, WithoutTheNodesGroupTheyCannotBeOpened) {
  if (!is_rootless(mode())) GTEST_SKIP() << "root maps the nodes' group into the sandbox itself";
  Options o = gpu_host();
  o.groups.clear();
  Result r = sandbox(mode(), {"--gpu", "1"}, {"osh-probe", "open-device", "/dev/nvidia0"}, o);
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.out, HasSubstr("denied: EACCES"));
  EXPECT_THAT(r.err, HasSubstr("you are not in that group"));
}

TEST_P(Gpu, GpuOneTakesOnlyTheFirstAndNoOtherNodeCanBeReached) {
  Result r = sandbox(mode(), {"--gpu", "1", "--bind", host_ + "/dev/nvidia1:/mnt/nvidia1"},
                     {"sh", "-c",
                      "ls /dev; osh-probe open-device /dev/nvidia0; "
                      "osh-probe open-device /dev/nvidia1; osh-probe open-device /mnt/nvidia1; "
                      "osh-probe mknod /tmp/nvidia1; echo env=$OSH_GPU0"},
                     gpu_host());
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("nvidia0\n"));
  EXPECT_THAT(r.out, HasSubstr("nvidiactl\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("nvidia1\n")));
  EXPECT_THAT(r.out, HasSubstr(std::string(kOpened) + "\ndenied: ENOENT"));
  // The node not granted, bound in another way: no device access there
  // (a bind mount is nodev), and none can be made.
  EXPECT_THAT(r.out, HasSubstr("ENOENT (No such file or directory)\ndenied: EACCES"));
  EXPECT_THAT(r.out, HasSubstr("\ndenied: EPERM"));
  EXPECT_THAT(r.out, HasSubstr("env=yes\n"));
}

TEST_P(Gpu, NoNodeWithoutGpu) {
  Result r = sandbox(mode(), {}, {"sh", "-c", "ls /dev; ls /usr/lib/x86_64-linux-gnu 2>&1; true"},
                     gpu_host());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, Not(HasSubstr("nvidia")));
  EXPECT_THAT(r.out, Not(HasSubstr("libcuda")));
  EXPECT_TRUE(file_contents(marks_ + "/created.json").empty());
}

TEST_P(Gpu, DiscoveryWithoutCdiFindsNodesLibrariesAndNvidiaSmi) {
  Result r = sandbox(mode(), {"--gpu", "1"},
                     {"sh", "-c",
                      "ls /dev /dev/nvidia-caps; osh-probe open-device /dev/nvidia0; "
                      "cat /usr/lib/x86_64-linux-gnu/libcuda.so.1; nvidia-smi; "
                      "osh-probe write /usr/bin/nvidia-smi; true"},
                     discovery_host());
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("nvidia0\n"));
  EXPECT_THAT(r.out, HasSubstr("nvidiactl\n"));
  EXPECT_THAT(r.out, HasSubstr("nvidia-cap1\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("nvidia1\n")));
  EXPECT_THAT(r.out,
              HasSubstr(std::string(kOpened) + "\nfake libcuda\nfake nvidia-smi\ndenied: EROFS"));
  EXPECT_TRUE(file_contents(marks_ + "/created.json").empty());  // no CDI, no hook
}

TEST_P(Gpu, BadValuesAreRefusedInOneLine) {
  Result zero = sandbox(mode(), {"--gpu", "0"}, {"true"}, gpu_host());
  EXPECT_EQ(zero.status, 125);
  EXPECT_EQ(zero.err, "openshell: --gpu 0: expected a number of GPUs (1 to 1024) or 'all'\n");
  Result three = sandbox(mode(), {"--gpu", "3"}, {"true"}, gpu_host());
  EXPECT_EQ(three.status, 125);
  EXPECT_THAT(three.err, HasSubstr("--gpu 3: the CDI specs of nvidia.com/gpu (" + host_ +
                                   "/cdi/nvidia.yaml) name GPUs 0, 1 only\n"));
  Options no_gpu;
  no_gpu.env = {"OPENSHELL_CDI_DIRS=", "OPENSHELL_GPU_ROOT=" + marks_};
  Result none = sandbox(mode(), {"--gpu"}, {"true"}, no_gpu);
  EXPECT_EQ(none.status, 125);
  EXPECT_THAT(none.err, HasSubstr("--gpu all: no NVIDIA GPU here"));
  Result vm = openshell(mode(), {"run", "--vm", "--gpu", "--", "true"}, gpu_host());
  EXPECT_EQ(vm.status, 125);
  EXPECT_THAT(vm.err, HasSubstr("--gpu: not with --vm (a micro-VM has no device passthrough)"));
  Result created = os({"sandbox", "create", "--from", rootfs(), "--gpu", "x", "--", "true"});
  EXPECT_EQ(created.status, 125);
  EXPECT_THAT(created.err, HasSubstr("--gpu x: expected a number of GPUs (1 to 1024) or 'all'"));
}

// A gateway's sandbox: its supervisor resolves the GPUs at each launch,
// under the default policy's Landlock rules.
TEST_P(Gpu, SandboxCreateGetsTheGpus) {
  Result r =
      os({"sandbox", "create", "--name", "gpu", "--from", rootfs(), "--gpu", "1", "--no-keep", "--",
          "sh", "-c",
          "ls /dev; osh-probe open-device /dev/nvidia0; osh-probe open-device "
          "/dev/nvidiactl; echo env=$OSH_GPU_TEST; cat /usr/lib/x86_64-linux-gnu/libcuda.so.1; "
          "osh-probe write /usr/lib/x86_64-linux-gnu/libcuda.so.1; true"},
         gpu_host());
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("nvidia0\n"));
  EXPECT_THAT(r.out, Not(HasSubstr("nvidia1\n")));
  EXPECT_THAT(r.out, HasSubstr(std::string(kOpened) + "\n" + kOpened + "\n"));
  EXPECT_THAT(r.out, HasSubstr("env=from-cdi\nfake libcuda\ndenied: EROFS"));
  EXPECT_THAT(file_contents(marks_ + "/created.json"), HasSubstr("\"status\":\"created\""));
}

E2E_ALL_MODES(Gpu);

// On a host with an NVIDIA GPU: nvidia-smi and a CUDA program in a sandbox
// on the host's root (its libraries), with --gpu from the host's CDI specs
// or discovery.
class GpuHardware : public ModeTest {};

TEST_P(GpuHardware, NvidiaSmiAndCudaRunInASandbox) {
  if (::access("/dev/nvidia0", F_OK) != 0) GTEST_SKIP() << "no NVIDIA GPU here (no /dev/nvidia0)";
  if (std::system("nvidia-smi -L >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "nvidia-smi does not run on the host";
  const std::string dir = make_dir(mode(), "cuda-" + mode_name(mode()));
  // A CUDA program: a kernel through nvcc where there is one, else the
  // driver API through dlopen (no CUDA toolkit needed).
  std::string build;
  if (std::system("command -v nvcc >/dev/null 2>&1") == 0) {
    write_file(dir + "/probe.cu",
               "#include <cstdio>\n"
               "__global__ void add(int* x) { *x += 40; }\n"
               "int main() {\n"
               "  int* d; int h = 2;\n"
               "  if (cudaMalloc(&d, sizeof h) != cudaSuccess) { puts(\"cudaMalloc failed\"); "
               "return 1; }\n"
               "  cudaMemcpy(d, &h, sizeof h, cudaMemcpyHostToDevice);\n"
               "  add<<<1, 1>>>(d);\n"
               "  cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost);\n"
               "  printf(\"cuda result %d\\n\", h);\n"
               "  return h == 42 ? 0 : 1;\n"
               "}\n");
    build = "nvcc -o " + dir + "/probe " + dir + "/probe.cu";
  } else if (std::system("command -v cc >/dev/null 2>&1") == 0) {
    write_file(dir + "/probe.c",
               "#include <dlfcn.h>\n#include <stdio.h>\n"
               "int main(void) {\n"
               "  void* cuda = dlopen(\"libcuda.so.1\", RTLD_NOW);\n"
               "  if (!cuda) { printf(\"dlopen: %s\\n\", dlerror()); return 1; }\n"
               "  int (*init)(unsigned) = (int (*)(unsigned))dlsym(cuda, \"cuInit\");\n"
               "  int (*count)(int*) = (int (*)(int*))dlsym(cuda, \"cuDeviceGetCount\");\n"
               "  int (*name)(char*, int, int) = (int (*)(char*, int, int))dlsym(cuda, "
               "\"cuDeviceGetName\");\n"
               "  if (!init || !count || !name) { puts(\"missing symbols\"); return 1; }\n"
               "  int rc = init(0), n = 0; char buf[256] = \"\";\n"
               "  if (rc) { printf(\"cuInit: %d\\n\", rc); return 1; }\n"
               "  if ((rc = count(&n)) || n < 1) { printf(\"cuDeviceGetCount: %d %d\\n\", rc, n); "
               "return 1; }\n"
               "  name(buf, sizeof buf, 0);\n"
               "  printf(\"cuda result 42 devices %d: %s\\n\", n, buf);\n"
               "  return 0;\n"
               "}\n");
    build = "cc -o " + dir + "/probe " + dir + "/probe.c -ldl";
  } else {
    GTEST_SKIP() << "neither nvcc nor cc to build the CUDA program";
  }
  ASSERT_EQ(std::system(build.c_str()), 0) << build;
  Options slow;
  slow.timeout_s = 120;
  Result r = openshell(
      mode(),
      {"run", "--gpu", "--bind", dir + ":/work", "--", "sh", "-c", "nvidia-smi -L && /work/probe"},
      slow);
  ASSERT_EQ(r.status, 0) << r.err << r.out;
  EXPECT_THAT(r.out, HasSubstr("GPU 0: "));
  EXPECT_THAT(r.out, HasSubstr("cuda result 42"));
}

E2E_ALL_MODES(GpuHardware);

}  // namespace
}  // namespace e2e
