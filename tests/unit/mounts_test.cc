#include "namespaces/mounts.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "base/error.h"
#include "base/files.h"
#include "base/unique_fd.h"
#include "runtime/container.h"
#include "runtime/spec.h"
#include "test_util.h"

namespace openshell::namespaces {
namespace {

using openshell::testing::TempDir;
using openshell::testing::write_file;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string error_of(const FilesystemSpec& spec) {
  try {
    MountPlan plan(spec);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "MountPlan accepted the spec";
  return "";
}

class MountPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::create_directories(tmp_ / "rootfs");
    std::filesystem::create_directories(tmp_ / "data");
  }
  FilesystemSpec directory_root() const {
    FilesystemSpec spec;
    spec.root = RootKind::kDirectory;
    spec.rootfs = tmp_ / "rootfs";
    return spec;
  }
  static BindSpec bind(const std::string& source, const std::string& target) {
    BindSpec b;
    b.source = source;
    b.target = target;
    return b;
  }
  TempDir tmp_;
};

TEST_F(MountPlanTest, ValidSpecIsCanonicalised) {
  std::filesystem::create_symlink(tmp_ / "rootfs", tmp_ / "link");
  FilesystemSpec spec = directory_root();
  spec.rootfs = tmp_ / "data/../link/.";
  spec.binds = {bind(tmp_ / "data", "/data")};
  spec.workdir = "/work";
  MountPlan plan(spec);
  EXPECT_EQ(plan.spec().rootfs, std::filesystem::canonical(tmp_.path()).string() + "/rootfs");
  EXPECT_EQ(plan.spec().workdir, "/work");
}

TEST_F(MountPlanTest, HostRootNeedsNoRootfs) {
  FilesystemSpec spec;
  spec.root = RootKind::kHost;
  spec.rootfs = tmp_ / "missing";  // not used for the host root
  MountPlan plan(spec);
  EXPECT_EQ(plan.spec().root, RootKind::kHost);
}

TEST_F(MountPlanTest, MissingRootfs) {
  FilesystemSpec spec = directory_root();
  spec.rootfs = tmp_ / "missing";
  EXPECT_EQ(error_of(spec), "--rootfs " + (tmp_ / "missing") + ": No such file or directory");
  spec.rootfs = "";
  EXPECT_EQ(error_of(spec), "--rootfs: no directory given");
}

TEST_F(MountPlanTest, RootfsThatIsAFile) {
  write_file(tmp_ / "file", "");
  FilesystemSpec spec = directory_root();
  spec.rootfs = tmp_ / "file";
  EXPECT_EQ(error_of(spec), "--rootfs " + (tmp_ / "file") + ": not a directory");
}

TEST_F(MountPlanTest, MissingWritableLayer) {
  FilesystemSpec spec = directory_root();
  spec.layer_dir = tmp_ / "no-layer";
  EXPECT_EQ(error_of(spec),
            "writable layer " + (tmp_ / "no-layer") + ": No such file or directory");
}

TEST_F(MountPlanTest, BindOverTheRoot) {
  FilesystemSpec spec = directory_root();
  spec.binds = {bind(tmp_ / "data", "/")};
  EXPECT_EQ(error_of(spec), "--bind " + (tmp_ / "data") + ":/: cannot replace the root");
}

// Regression (fixed): only the exact string "/" is refused; "//" and "/." name the root too
// and the bind then lands on the new root itself (relative target "" or ".").
TEST_F(MountPlanTest, BindOverTheRootWhateverItsSpelling) {
  for (const char* root : {"//", "/.", "/./"}) {
    FilesystemSpec spec = directory_root();
    spec.binds = {bind(tmp_ / "data", root)};
    EXPECT_EQ(error_of(spec),
              "--bind " + (tmp_ / "data") + ":" + root + ": cannot replace the root")
        << root;
  }
}

TEST_F(MountPlanTest, BindDestinationMustBeAbsoluteWithoutDotDot) {
  FilesystemSpec spec = directory_root();
  spec.binds = {bind(tmp_ / "data", "data")};
  EXPECT_EQ(error_of(spec),
            "--bind " + (tmp_ / "data") + ":data: destination must be an absolute path");
  spec.binds = {bind(tmp_ / "data", "/a/../etc")};
  EXPECT_EQ(error_of(spec),
            "--bind " + (tmp_ / "data") + ":/a/../etc: destination must not contain '..'");
  spec.binds = {bind(tmp_ / "data", "")};
  EXPECT_EQ(error_of(spec), "--bind " + (tmp_ / "data") + ":: destination must not be empty");
}

TEST_F(MountPlanTest, MissingBindSourceIsNamed) {
  FilesystemSpec spec = directory_root();
  spec.binds = {bind(tmp_ / "data", "/ok"), bind(tmp_ / "gone", "/gone")};
  EXPECT_EQ(error_of(spec), "--bind source " + (tmp_ / "gone") + ": No such file or directory");
}

TEST_F(MountPlanTest, WorkdirMustBeAbsolute) {
  FilesystemSpec spec = directory_root();
  spec.workdir = "work";
  EXPECT_EQ(error_of(spec), "--workdir work: must be an absolute path");
  spec.workdir = "/a/../b";
  EXPECT_EQ(error_of(spec), "--workdir /a/../b: must not contain '..'");
  spec.workdir = "";
  EXPECT_EQ(error_of(spec), "--workdir : must not be empty");
}

FsMount fs_mount(const std::string& type, const std::string& target, const std::string& data = "") {
  FsMount m;
  m.type = type;
  m.target = target;
  m.data = data;
  return m;
}

TEST_F(MountPlanTest, FsMountsSysctlsAndPathsAreAccepted) {
  FilesystemSpec spec = directory_root();
  spec.fs_mounts = {fs_mount("tmpfs", "/run", "size=65536k,mode=755,noswap"),
                    fs_mount("mqueue", "/dev/mqueue"), fs_mount("tmpfs", "//srv/./cache/")};
  spec.masked_paths = {"/proc/cpuinfo", "/etc/secret"};
  spec.read_only_paths = {"/proc/sysrq-trigger", "/data/"};
  spec.sysctls = {{"net.ipv4.ip_forward", "1"},
                  {"net/ipv4/conf/all/forwarding", "1"},
                  {"kernel.shm_rmid_forced", "0"},
                  {"net.ipv4.ping_group_range", "0 2147483647"}};
  spec.private_tmp = false;
  MountPlan plan(spec);
  EXPECT_EQ(plan.spec().fs_mounts.size(), 3u);
  EXPECT_FALSE(plan.spec().private_tmp);
}

TEST_F(MountPlanTest, FsMountOfAnotherTypeIsRefused) {
  FilesystemSpec spec = directory_root();
  spec.fs_mounts = {fs_mount("tmpfs", "/tmp/a"), fs_mount("nfs", "/run")};
  EXPECT_EQ(error_of(spec), "mount /run: type \"nfs\" is not supported (tmpfs, mqueue)");
  spec.fs_mounts = {fs_mount("", "/run")};
  EXPECT_EQ(error_of(spec), "mount /run: type \"\" is not supported (tmpfs, mqueue)");
}

TEST_F(MountPlanTest, FsMountTargetMustBeAbsolute) {
  FilesystemSpec spec = directory_root();
  spec.fs_mounts = {fs_mount("tmpfs", "run")};
  EXPECT_EQ(error_of(spec), "mount run: destination must be an absolute path");
  spec.fs_mounts = {fs_mount("tmpfs", "")};
  EXPECT_EQ(error_of(spec), "mount : destination must not be empty");
}

TEST_F(MountPlanTest, FsMountTargetMustNotClimb) {
  FilesystemSpec spec = directory_root();
  spec.fs_mounts = {fs_mount("tmpfs", "/run/../../etc")};
  EXPECT_EQ(error_of(spec), "mount /run/../../etc: destination must not contain '..'");
}

TEST_F(MountPlanTest, FsMountMayNotReplaceTheRootOrDev) {
  FilesystemSpec spec = directory_root();
  spec.fs_mounts = {fs_mount("tmpfs", "/./")};
  EXPECT_EQ(error_of(spec), "mount /./: cannot replace the root");
  spec.fs_mounts = {fs_mount("tmpfs", "/dev/", "mode=755")};
  EXPECT_EQ(error_of(spec), "mount /dev/: the sandbox's /dev is its own");
}

TEST_F(MountPlanTest, FsMountOptionsMustBeWellFormed) {
  FilesystemSpec spec = directory_root();
  spec.fs_mounts = {fs_mount("tmpfs", "/run", "size=1m,,mode=755")};
  EXPECT_EQ(error_of(spec), "mount /run: an empty option in \"size=1m,,mode=755\"");
  spec.fs_mounts = {fs_mount("tmpfs", "/run", "size=1m,")};
  EXPECT_EQ(error_of(spec), "mount /run: an empty option in \"size=1m,\"");
  spec.fs_mounts = {fs_mount("tmpfs", "/run", "=1m")};
  EXPECT_EQ(error_of(spec), "mount /run: option \"=1m\" has no name");
  spec.fs_mounts = {fs_mount("tmpfs", "/run", "size=" + std::string(300, '1'))};
  EXPECT_THAT(error_of(spec), StartsWith("mount /run: option \"size=111"));
  EXPECT_THAT(error_of(spec), HasSubstr("is too long"));
}

TEST_F(MountPlanTest, MqueueTakesNoOptions) {
  FilesystemSpec spec = directory_root();
  spec.fs_mounts = {fs_mount("mqueue", "/dev/mqueue", "size=1m")};
  EXPECT_EQ(error_of(spec), "mount /dev/mqueue: mqueue takes no options (\"size=1m\")");
}

TEST_F(MountPlanTest, TooManyFsMountOptions) {
  FilesystemSpec spec = directory_root();
  std::string data = "mode=755";
  for (int i = 0; i < 40; ++i) data += ",noswap";
  spec.fs_mounts = {fs_mount("tmpfs", "/run", data)};
  EXPECT_EQ(error_of(spec), "mount /run: more than 32 options");
}

TEST_F(MountPlanTest, TooManyFsMounts) {
  FilesystemSpec spec = directory_root();
  for (int i = 0; i < 65; ++i)
    spec.fs_mounts.push_back(fs_mount("tmpfs", "/m" + std::to_string(i)));
  EXPECT_EQ(error_of(spec), "more than 64 file system mounts");
}

TEST_F(MountPlanTest, MaskedPathMustBeAbsolute) {
  FilesystemSpec spec = directory_root();
  spec.masked_paths = {"/proc/kcore", "proc/cpuinfo"};
  EXPECT_EQ(error_of(spec), "masked path proc/cpuinfo: must be an absolute path");
  spec.masked_paths = {"/proc/../etc"};
  EXPECT_EQ(error_of(spec), "masked path /proc/../etc: must not contain '..'");
  spec.masked_paths = {"//"};
  EXPECT_EQ(error_of(spec), "masked path //: cannot be the root");
}

TEST_F(MountPlanTest, ReadOnlyPathMustBeAbsolute) {
  FilesystemSpec spec = directory_root();
  spec.read_only_paths = {"proc/sys"};
  EXPECT_EQ(error_of(spec), "read-only path proc/sys: must be an absolute path");
  spec.read_only_paths = {""};
  EXPECT_EQ(error_of(spec), "read-only path : must not be empty");
  spec.read_only_paths = {"/"};
  EXPECT_EQ(error_of(spec), "read-only path /: cannot be the root");
}

TEST_F(MountPlanTest, SysctlKeyMustNotBeEmpty) {
  FilesystemSpec spec = directory_root();
  spec.sysctls = {{"", "1"}};
  EXPECT_EQ(error_of(spec), "sysctl: an empty key");
}

TEST_F(MountPlanTest, SysctlKeyHoldsOnlyNameCharacters) {
  FilesystemSpec spec = directory_root();
  for (const char* key : {"net.ipv4.ip forward", "kernel.x\n", "net:ipv4", "kernel.*"}) {
    spec.sysctls = {{key, "1"}};
    EXPECT_EQ(error_of(spec),
              "sysctl \"" + std::string(key) + "\": a key holds only letters, digits and _ . - /")
        << key;
  }
}

TEST_F(MountPlanTest, SysctlKeyMustNotClimb) {
  FilesystemSpec spec = directory_root();
  spec.sysctls = {{"net/../../self/mem", "1"}};
  EXPECT_EQ(error_of(spec), "sysctl \"net/../../self/mem\": a key must not contain \"..\"");
}

TEST_F(MountPlanTest, SysctlKeyMustNotStartWithASlash) {
  FilesystemSpec spec = directory_root();
  spec.sysctls = {{"/proc/sys/kernel/shmmax", "1"}};
  EXPECT_EQ(error_of(spec), "sysctl \"/proc/sys/kernel/shmmax\": a key must not start with '/'");
}

TEST_F(MountPlanTest, SysctlKeyHasNoEmptyPart) {
  FilesystemSpec spec = directory_root();
  for (const char* key : {".net.ipv4", "net.ipv4.", "net//ipv4", "net./ipv4"}) {
    spec.sysctls = {{key, "1"}};
    EXPECT_EQ(error_of(spec), "sysctl \"" + std::string(key) + "\": the key has an empty part")
        << key;
  }
}

TEST_F(MountPlanTest, HostRootKeepsItsPrivateTmp) {
  FilesystemSpec spec;
  spec.root = RootKind::kHost;
  spec.private_tmp = false;
  EXPECT_THAT(error_of(spec), StartsWith("the host's root always has a private /tmp"));
}

// The plan applied in a real sandbox (runtime::Container, with this binary
// as its init): a busybox root with the caller's file systems, paths,
// kernel parameter, the image's own /tmp and noexec binds. One sandbox for
// the suite, each test reading its part of what it printed (and one more
// whose start fails).
class MountPlanInSandbox : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = new std::string;
    spec_ = new runtime::ContainerSpec;
    output_ = new std::string;
    dir_ = new TempDir;
    if (!std::filesystem::exists("/bin/busybox")) {
      *skip_ = "no /bin/busybox (apt-get install busybox-static)";
      return;
    }
    auto probe = openshell::testing::run_in_child([](openshell::testing::ChildWriter& out) {
      out.result("unshare", ::unshare(CLONE_NEWUSER), errno);
    });
    if (probe.results["unshare"].ret != 0) {
      *skip_ = std::string("this machine makes no user namespace: ") +
               std::strerror(probe.results["unshare"].err);
      return;
    }
    // The sandbox's root is no host root: the sources it binds must be
    // reachable by others.
    ::chmod(dir_->path().c_str(), 0755);
    const std::string root = dir_->path() + "/rootfs";
    const std::string exec_dir = dir_->path() + "/exec";
    for (const auto& d : {root + "/bin", root + "/etc", root + "/tmp", root + "/srv", exec_dir})
      std::filesystem::create_directories(d);
    std::filesystem::copy_file("/bin/busybox", root + "/bin/busybox");
    std::filesystem::copy_file("/bin/busybox", exec_dir + "/busybox");
    std::filesystem::create_symlink("busybox", root + "/bin/sh");
    // The init is this binary, linked dynamically (the openshell binary is
    // static): its loader and libraries go into the root, where ldd finds them.
    const std::string exe = std::filesystem::read_symlink("/proc/self/exe");
    if (FILE* ldd = ::popen(("ldd " + exe + " 2>/dev/null").c_str(), "r")) {
      char text[4096];
      while (std::fgets(text, sizeof text, ldd)) {
        std::istringstream words(text);
        for (std::string word; words >> word;)
          if (word[0] == '/') {
            std::filesystem::create_directories(root +
                                                std::filesystem::path(word).parent_path().string());
            std::filesystem::copy_file(word, root + word,
                                       std::filesystem::copy_options::skip_existing);
            break;
          }
      }
      ::pclose(ldd);
    }
    write_file(root + "/tmp/from-image", "kept\n");
    write_file(root + "/etc/secret", "secret\n");
    ::chmod((root + "/tmp").c_str(), 01777);
    ::chmod((root + "/srv").c_str(), 0777);

    runtime::ContainerSpec spec;
    spec.uid = 0;
    spec.gid = 0;
    spec.fs.root = RootKind::kDirectory;
    spec.fs.rootfs = root;
    spec.fs.fs_mounts = {fs_mount("tmpfs", "/run", "size=1m,mode=755"),
                         fs_mount("mqueue", "/dev/mqueue")};
    // As root, a bind source owned by another user becomes an idmapped tree
    // that the parent prepares (MountPlan::idmapped_trees); one owned by
    // root is bound by the child.
    const std::string owned_dir = dir_->path() + "/owned";
    std::filesystem::create_directories(owned_dir);
    std::filesystem::copy_file("/bin/busybox", owned_dir + "/busybox");
    if (::geteuid() == 0 && (::chown(owned_dir.c_str(), 4242, 4242) != 0 ||
                             ::chown((owned_dir + "/busybox").c_str(), 4242, 4242) != 0))
      ADD_FAILURE() << "chown " << owned_dir << ": " << std::strerror(errno);
    BindSpec no_exec;
    no_exec.source = exec_dir;
    no_exec.target = "/opt/noexec";
    no_exec.no_exec = true;
    BindSpec owned_no_exec = no_exec;
    owned_no_exec.source = owned_dir;
    owned_no_exec.target = "/opt/owned";
    spec.fs.binds = {no_exec, owned_no_exec};
    spec.fs.masked_paths = {"/etc/secret"};
    spec.fs.read_only_paths = {"/srv"};
    spec.fs.sysctls = {{"net.ipv4.ip_forward", "1"}};
    spec.fs.private_tmp = false;
    spec.cgroup_name = "openshell-unit-mounts-" + std::to_string(::getpid());
    spec.env = {"PATH=/bin"};
    spec.argv = {"/bin/busybox", "sh", "-c",
                 "bb=/bin/busybox\n"
                 "echo \"run: $($bb grep ' /run ' /proc/self/mountinfo)\"\n"
                 "echo \"mqueue: $($bb grep ' /dev/mqueue ' /proc/self/mountinfo)\"\n"
                 "echo \"masked: [$($bb cat /etc/secret 2>&1)]\"\n"
                 "echo \"read-only: $( { echo x > /srv/f; } 2>&1)\"\n"
                 "echo \"sysctl: $($bb cat /proc/sys/net/ipv4/ip_forward)\"\n"
                 "echo \"tmp: $($bb cat /tmp/from-image 2>&1)\"\n"
                 "r=$(/opt/noexec/busybox true 2>&1); echo \"noexec: status $? $r\"\n"
                 "r=$(/bin/busybox true 2>&1); echo \"exec: status $? $r\"\n"
                 "r=$(/opt/owned/busybox true 2>&1); echo \"owned: status $? $r\"\n"
                 "echo \"owner: $($bb stat -c %u /opt/owned/busybox)\"\n"};
    const std::string log = dir_->path() + "/out";
    UniqueFd out(::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    UniqueFd null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    spec.stdin_fd = null.get();
    spec.stdout_fd = spec.stderr_fd = out.get();
    *spec_ = spec;
    try {
      auto container = runtime::Container::start(spec);
      status_ = container->wait();
    } catch (const Error& e) {
      *output_ = std::string("start failed: ") + e.what();
      return;
    }
    *output_ = files::try_read(log).value_or("");
  }
  static void TearDownTestSuite() {
    delete skip_;
    delete spec_;
    delete output_;
    delete dir_;
  }
  void SetUp() override {
    if (!skip_->empty()) GTEST_SKIP() << *skip_;
    ASSERT_EQ(status_, 0) << *output_;
  }
  // The line the sandbox printed for `what`, without its label.
  static std::string line(const std::string& what) {
    std::istringstream lines(*output_);
    for (std::string l; std::getline(lines, l);)
      if (l.rfind(what + ": ", 0) == 0) return l.substr(what.size() + 2);
    ADD_FAILURE() << "no line for " << what << " in:\n" << *output_;
    return "";
  }
  static std::string* skip_;
  static runtime::ContainerSpec* spec_;  // the suite's sandbox
  static std::string* output_;
  static TempDir* dir_;
  static int status_;
};

std::string* MountPlanInSandbox::skip_;
runtime::ContainerSpec* MountPlanInSandbox::spec_;
std::string* MountPlanInSandbox::output_;
TempDir* MountPlanInSandbox::dir_;
int MountPlanInSandbox::status_ = -1;

TEST_F(MountPlanInSandbox, TmpfsWithItsOptions) {
  EXPECT_THAT(line("run"), HasSubstr(" - tmpfs "));
  EXPECT_THAT(line("run"), HasSubstr("size=1024k"));
  EXPECT_THAT(line("run"), HasSubstr("mode=755"));
  EXPECT_THAT(line("run"), HasSubstr("nosuid,nodev"));
}

TEST_F(MountPlanInSandbox, MqueueInTheSandboxesDev) {
  EXPECT_THAT(line("mqueue"), HasSubstr(" - mqueue "));
}

TEST_F(MountPlanInSandbox, MaskedPathReadsNothing) { EXPECT_EQ(line("masked"), "[]"); }

TEST_F(MountPlanInSandbox, ReadOnlyPathRefusesWrites) {
  EXPECT_THAT(line("read-only"), HasSubstr("Read-only file system"));
}

TEST_F(MountPlanInSandbox, SysctlIsWritten) { EXPECT_EQ(line("sysctl"), "1"); }

TEST_F(MountPlanInSandbox, ImageKeepsItsTmp) { EXPECT_EQ(line("tmp"), "kept"); }

TEST_F(MountPlanInSandbox, NoExecBindRefusesExec) {
  EXPECT_THAT(line("noexec"), HasSubstr("Permission denied"));
  EXPECT_THAT(line("noexec"), StartsWith("status 126 "));
  // The same binary runs from the root.
  EXPECT_EQ(line("exec"), "status 0 ");
}

TEST_F(MountPlanInSandbox, FailingSysctlStopsTheStartNamingIt) {
  runtime::ContainerSpec spec = *spec_;
  spec.fs.sysctls = {{"net.ipv4.ip_forward", "1"}, {"net.ipv4.no_such_parameter", "1"}};
  UniqueFd null(::open("/dev/null", O_RDWR | O_CLOEXEC));
  spec.stdin_fd = spec.stdout_fd = spec.stderr_fd = null.get();
  EXPECT_EQ(openshell::testing::error_of([&] { runtime::Container::start(spec); }),
            "sysctl net.ipv4.no_such_parameter: No such file or directory");
}

TEST_F(MountPlanInSandbox, NoExecIdmappedBindRefusesExec) {
  if (::geteuid() != 0) GTEST_SKIP() << "idmapped binds are made as root";
  // Idmapped: the owner's files are the sandbox user's (root inside here), not nobody's.
  ASSERT_EQ(line("owner"), "0") << "the bind was not idmapped";
  EXPECT_THAT(line("owned"), HasSubstr("Permission denied"));
  EXPECT_THAT(line("owned"), StartsWith("status 126 "));
}

}  // namespace
}  // namespace openshell::namespaces

// The "lowerdir" list of kernels before 6.8 (no "lowerdir+"), the fallback
// of both the sandbox's root and the overlay probe.
TEST(OverlayLowerdirList, JoinsTopFirstAndEscapesSeparators) {
  EXPECT_EQ(openshell::namespaces::overlay_lowerdir_list({"/a", "/b/c"}), "/a:/b/c");
  EXPECT_EQ(openshell::namespaces::overlay_lowerdir_list({"/x:y", "/p,q", "/back\\slash"}),
            "/x\\:y:/p\\,q:/back\\\\slash");
  EXPECT_EQ(openshell::namespaces::overlay_lowerdir_list({}), "");
}

TEST(OverlayListOptions, EscapesUpperAndWorkAndStopsWhenFull) {
  char out[128];
  ASSERT_TRUE(openshell::namespaces::overlay_list_options(out, sizeof out, "/l0:/l1", "/s,1/upper",
                                                          "/s,1/work"));
  EXPECT_STREQ(out, "lowerdir=/l0:/l1,upperdir=/s\\,1/upper,workdir=/s\\,1/work,userxattr");
  char small[40];
  EXPECT_FALSE(openshell::namespaces::overlay_list_options(small, sizeof small, "/l0:/l1", "/upper",
                                                           "/work"));
}

// The list form through mount(2) takes more than fsconfig()'s 256 bytes:
// six layers with long paths stack (this kernel has "lowerdir+" too; the
// probe is told to try only what kernels before 6.8 get).
TEST(OverlayProbe, ListFormStacksManyLayersWithLongPaths) {
  openshell::testing::TempDir dir;
  std::vector<std::string> lowers;
  for (int i = 0; i < 6; ++i) {
    std::string layer = dir.path() + "/layers/" + std::string(60, 'a' + i) + "/root";
    std::filesystem::create_directories(layer);
    openshell::testing::write_file(layer + "/file" + std::to_string(i), "x");
    lowers.push_back(layer);
  }
  std::filesystem::create_directories(dir.path() + "/scratch");
  size_t total = 0;
  for (const auto& l : lowers) total += l.size() + 1;
  ASSERT_GT(total, 256u);
  EXPECT_EQ(openshell::namespaces::overlay_problem(lowers, dir.path() + "/scratch", true), "");
  EXPECT_EQ(openshell::namespaces::overlay_problem(lowers, dir.path() + "/scratch", false), "");
  // The scratch directory is left empty.
  EXPECT_TRUE(std::filesystem::is_empty(dir.path() + "/scratch"));
}
