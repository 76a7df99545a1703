// Podman 4 drives `openshell-runc` through `podman --runtime`, as root and
// rootless (an ordinary user with subordinate ids, Podman then in a user
// namespace of its own with the runtime as its root). Each engine has its
// own storage, run and temporary directories under the scratch directory,
// its CNI configuration there too, and `--network none`: no storage,
// state or network of the host's Podman is used or left. The engines are
// set up on first use and removed, with what they made, at the end of the
// suite.
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>

#include "harness.h"
#include "image_helpers.h"

using testing::HasSubstr;

namespace e2e {
namespace {

using namespace image_helpers;

// A podman command's status, standard output and standard error.
struct Podman {
  int status;
  std::string out, err;
  std::string all() const { return out + err; }
};

// The battery of tests/e2e/confinement_test.cc, as osh-probe's actions:
// each must be denied in a container with every capability Podman gives
// and no seccomp profile of Podman's (--privileged).
constexpr const char* kEscapes[] = {"mount",           "umount /proc",
                                    "unshare-user",    "clone-newuser",
                                    "clone3",          "setns",
                                    "ptrace child",    "keyctl",
                                    "add_key",         "perf_event_open",
                                    "userfaultfd",     "bpf",
                                    "io_uring",        "kexec_load",
                                    "init_module",     "open_by_handle_at",
                                    "raw-socket",      "packet-socket",
                                    "chroot /tmp",     "sethostname",
                                    "mknod /tmp/null", "name_to_handle_at /tmp"};

// One shell loop that tries each in turn: "ACTION => STATUS OUTPUT" a line.
std::string battery_script() {
  std::string script = "for a in";
  for (const char* attempt : kEscapes) script += std::string(" \"") + attempt + "\"";
  script += "; do r=$(osh-probe $a 2>&1); echo \"$a => $? $r\"; done";
  return script;
}

void expect_every_escape_denied(const Podman& r) {
  for (const char* attempt : kEscapes)
    EXPECT_THAT(r.out, testing::ContainsRegex(std::string("(^|\n)") + attempt + " => 1 denied: "))
        << attempt << ":\n"
        << r.all();
}

bool have(const std::string& program) {
  return sh("command -v " + program + " >/dev/null").status == 0;
}

long elapsed_ms(std::chrono::steady_clock::time_point since) {
  return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                               std::chrono::steady_clock::now() - since)
                               .count());
}

// The busybox image with osh-probe, as an OCI layout every test user may
// read; built once ("" when it cannot be, *why says why).
const std::string& probe_layout(std::string* why) {
  static std::string error;
  static const std::string layout = [] {
    const char* script = std::getenv("OSH_IMAGE_SCRIPT");
    const char* probe = std::getenv("OSH_PROBE");
    const std::string dir = scratch() + "/podman-layout";
    Shell r = sh(q(script ? script : "rootfs-tools/build-busybox-image") + " " + q(dir) + " " +
                 q(probe ? probe : "build/tests/e2e/osh-probe") + " >/dev/null && chmod -R a+rX " +
                 q(dir));
    if (r.status != 0) {
      error = "cannot build the busybox image: " + r.out;
      return std::string();
    }
    return dir;
  }();
  *why = error;
  return layout;
}

// One Podman: root's, or the rootless test user's.
class PodmanEngine {
 public:
  explicit PodmanEngine(bool rootless) : rootless_(rootless) {
    if (binary().empty() || ::geteuid() != 0) {
      skip_ = "needs root";
      return;
    }
    if (!have("podman") || !have("conmon")) {
      skip_ = "needs podman 4 and conmon (apt-get install podman)";
      return;
    }
    if (rootless && (!have("newuidmap") || !have("setpriv"))) {
      skip_ = "rootless Podman needs newuidmap and setpriv (apt-get install uidmap util-linux)";
      return;
    }
    const std::string name = rootless ? "podman-rootless" : "podman-root";
    if (rootless) {
      // The user's own directories: its home (Podman's configuration and
      // storage) and its runtime directory (the runtime's records).
      dir_ = make_dir(Mode::kRootlessSubuid, name);
      runtime_dir_ = make_dir(Mode::kRootlessSubuid, name + "-xdg", 0700);
    } else {
      dir_ = scratch() + "/" + name;
      std::filesystem::create_directories(dir_);
    }
    // Through a link named openshell-runc, as the packages install it.
    link_ = scratch() + "/" + name + "-bin/openshell-runc";
    std::filesystem::create_directories(scratch() + "/" + name + "-bin");
    std::filesystem::create_symlink(binary(), link_);
    if (rootless)
      make_dir(Mode::kRootlessSubuid, name + "/cni");
    else
      std::filesystem::create_directories(dir_ + "/cni");
    had_cache_ = std::filesystem::exists("/var/lib/containers/cache");
    std::string why;
    const std::string& layout = probe_layout(&why);
    if (layout.empty()) {
      skip_ = why;
      return;
    }
    Podman version = podman("version --format '{{.Client.Version}}'");
    if (version.status != 0) {
      skip_ = "podman does not run here: " + version.all();
      return;
    }
    // A relative path: Podman names the image after it, and the scratch
    // directory's name has capitals, which no image name may have.
    const std::filesystem::path path(layout);
    Podman pull = podman("pull -q oci:" + path.filename().string() + ":latest", 120,
                         path.parent_path().string());
    if (pull.status != 0) {
      skip_ = "podman pull oci:" + layout + " failed: " + pull.all();
      return;
    }
    Podman tag = podman("tag " + last_line(pull.out) + " osh-busybox");
    if (tag.status != 0) skip_ = "podman tag failed: " + tag.all();
  }

  ~PodmanEngine() {
    if (dir_.empty()) return;
    podman("rm -af -t 0", 60);
    podman("rmi -af", 60);
    // What is left of this engine's: rootless Podman's pause process, which
    // holds its user namespace for later calls; a conmon, should any
    // outlive its container. They are its own by their runtime directory,
    // or a path of its directories on their command line.
    for (const std::string& pid : processes()) {
      const std::string command = command_of(pid);
      // The pause process is catatonit, or Podman itself named so (comm
      // "podman pause", command line "podman"), as this Podman makes it.
      const std::string comm = file_contents("/proc/" + pid + "/comm");
      if (!kill_and_wait(pid)) ADD_FAILURE() << "cannot end podman's " << pid << ": " << command;
      if (command.find("catatonit") == std::string::npos && comm != "podman pause\n")
        ADD_FAILURE() << "left behind by podman: " << pid << ": " << command;
    }
    // Its storage's mounts (overlay's, as root), then its files.
    sh("grep -o ' " + dir_ + "/[^ ]*' /proc/self/mountinfo | sort -r | xargs -r -n1 umount");
    std::filesystem::remove_all(dir_);
    // The parent of its containers' cgroups (and conmon's), as root.
    if (!rootless_) remove_empty_cgroups("libpod_parent");
    if (!runtime_dir_.empty()) std::filesystem::remove_all(runtime_dir_);
    std::filesystem::remove_all(std::filesystem::path(link_).parent_path());
    // Root's Podman keeps a blob cache there whatever --root says: when the
    // suite made it, it goes, and the directory above if nothing else is.
    if (!had_cache_) {
      std::error_code ignored;
      std::filesystem::remove_all("/var/lib/containers/cache", ignored);
      std::filesystem::remove("/var/lib/containers", ignored);
    }
  }

  PodmanEngine(const PodmanEngine&) = delete;
  PodmanEngine& operator=(const PodmanEngine&) = delete;

  // The processes this engine started that still run (zombies aside).
  std::vector<std::string> processes() const {
    std::vector<std::string> out;
    for (const std::string& pid : processes_matching("")) {
      const std::string stat = file_contents("/proc/" + pid + "/stat");
      const auto paren = stat.rfind(')');
      if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z')
        continue;
      if ((rootless_ && environment_of(pid).find("XDG_RUNTIME_DIR=" + runtime_dir_ + '\0') !=
                            std::string::npos) ||
          command_of(pid).find(dir_ + "/") != std::string::npos)
        out.push_back(pid);
    }
    return out;
  }

  const std::string& skip() const { return skip_; }
  const std::string& dir() const { return dir_; }
  bool rootless() const { return rootless_; }

  // podman ARGS as the engine's user, with its own directories, killed
  // after timeout_s. On a terminal, timeout stays in the terminal's
  // foreground process group (--foreground): in a group of its own, Podman's
  // first tcsetattr on the terminal stops it with SIGTTOU, for good.
  enum class Tty { kNo, kYes };
  std::string command(const std::string& args, int timeout_s = 30, Tty tty = Tty::kNo) const {
    std::string prefix = std::string("timeout ") + (tty == Tty::kYes ? "--foreground " : "") +
                         "-k 5 " + std::to_string(timeout_s) + " ";
    std::string podman = "podman --root " + q(dir_ + "/storage") + " --runroot " +
                         q((rootless_ ? runtime_dir_ : dir_) + "/run") + " --tmpdir " +
                         q((rootless_ ? runtime_dir_ : dir_) + "/tmp") + " --network-config-dir " +
                         q(dir_ + "/cni") +
                         " --cgroup-manager cgroupfs --events-backend file --runtime " + q(link_) +
                         " ";
    if (rootless_)
      prefix += "setpriv --reuid " + std::to_string(uid_of(Mode::kRootlessSubuid)) + " --regid " +
                std::to_string(gid_of(Mode::kRootlessSubuid)) +
                " --clear-groups env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=" + q(dir_) +
                " XDG_RUNTIME_DIR=" + q(runtime_dir_) + " ";
    return prefix + podman + args;
  }
  // Its output apart from its diagnostics (rootless Podman warns on every
  // call when / is not a shared mount). From the directory `cwd`, if given.
  Podman podman(const std::string& args, int timeout_s = 30, const std::string& cwd = "") const {
    const std::string err = dir_ + "/stderr";
    Shell r = sh((cwd.empty() ? "" : "cd " + q(cwd) + " && ") + command(args, timeout_s) + " 2>" +
                 q(err));
    return {r.status, r.out, file_contents(err)};
  }

 private:
  static std::string last_line(std::string text) {
    while (!text.empty() && text.back() == '\n') text.pop_back();
    auto nl = text.rfind('\n');
    return nl == std::string::npos ? text : text.substr(nl + 1);
  }

  bool rootless_;
  std::string skip_, dir_, runtime_dir_, link_;
  bool had_cache_ = true;
};

enum class Who { kRoot, kRootless };

class Runtime : public testing::TestWithParam<Who> {
 public:
  static void TearDownTestSuite() {
    engines_.clear();
    // The default network's bridge, should anything have made it.
    if (!had_bridge_ && sh("ip link show cni-podman0").status == 0) sh("ip link del cni-podman0");
  }

 protected:
  void SetUp() override {
    if (engines_.empty()) had_bridge_ = sh("ip link show cni-podman0").status == 0;
    auto& engine = engines_[GetParam()];
    if (!engine) engine = std::make_unique<PodmanEngine>(GetParam() == Who::kRootless);
    engine_ = engine.get();
    if (!engine_->skip().empty()) GTEST_SKIP() << engine_->skip();
    forget_started_processes();
    processes_before_ = leftover_processes();
    static int n = 0;
    name_ = "osh-pod-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
  }
  void TearDown() override {
    if (!engine_ || !engine_->skip().empty()) return;
    podman("rm -f -t 0 " + name_);
    // Once removed, nothing of the container runs: neither its init nor its
    // conmon (which may take a moment to end on a loaded machine).
    std::vector<std::string> inits, conmons;
    for (int i = 0; i < 100; ++i) {
      inits = leftover_processes();
      std::erase_if(inits, [&](const std::string& p) {
        return std::find(processes_before_.begin(), processes_before_.end(), p) !=
               processes_before_.end();
      });
      conmons = processes_matching(name_);
      if (inits.empty() && conmons.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(inits, std::vector<std::string>{}) << "processes left behind";
    EXPECT_EQ(conmons, std::vector<std::string>{}) << "conmon left behind";
  }

  Podman podman(const std::string& args, int timeout_s = 30) {
    return engine_->podman(args, timeout_s);
  }
  std::string run(const std::string& flags, const std::string& command) {
    return "run --name " + name_ + " --network none " + flags + " osh-busybox " + command;
  }

  static std::map<Who, std::unique_ptr<PodmanEngine>> engines_;
  static bool had_bridge_;
  PodmanEngine* engine_ = nullptr;
  std::vector<std::string> processes_before_;
  std::string name_;
};
std::map<Who, std::unique_ptr<PodmanEngine>> Runtime::engines_;
bool Runtime::had_bridge_ = false;

TEST_P(Runtime, RunRmEndsWithTheProcesssStatus) {
  Podman r = podman(run("--rm", "sh -c 'echo hello from podman; exit 6'"));
  EXPECT_EQ(r.status, 6) << r.all();
  EXPECT_EQ(r.out, "hello from podman\n");
  // --rm: the container is gone with its end.
  Podman left = podman("ps -a -q --filter " + q("name=^" + name_ + "$"));
  EXPECT_EQ(left.status, 0) << left.all();
  EXPECT_EQ(left.out, "");
}

TEST_P(Runtime, ATerminal) {
  // podman -t wants a terminal of its own: script(1) gives it one, and runs
  // the command from a file (its quoting stays the shell's; nothing is
  // written to the working directory). The process lingers a moment after
  // its output: Podman 4.3's attach loses the last output of a process that
  // ends at once, with runc too (4 runs in 20 here). script runs the file
  // through $SHELL: named here, so the test does not follow the caller's
  // environment (bash runs the file in the terminal's own process group;
  // dash, script's choice with no SHELL, in a child of it).
  const std::string command =
      write_file(engine_->dir() + "/" + name_ + ".sh",
                 "#!/bin/sh\nexec " +
                     engine_->command(run("--rm -it", "sh -c 'tty; sleep 0.5; exit 4'"), 30,
                                      PodmanEngine::Tty::kYes) +
                     "\n",
                 0755);
  Shell t = sh("SHELL=/bin/sh timeout -k 5 40 script -qec " + q(command) + " /dev/null </dev/null");
  EXPECT_EQ(t.status, 4) << t.out;
  EXPECT_THAT(t.out, HasSubstr("/dev/pts/"));
}

TEST_P(Runtime, ExecPsStop) {
  Podman started = podman(run("-d", "sleep 100"));
  ASSERT_EQ(started.status, 0) << started.all();
  // ps: listed, and up.
  Podman ps =
      podman("ps --filter " + q("name=^" + name_ + "$") + " --format '{{.Names}} {{.Status}}'");
  EXPECT_EQ(ps.status, 0) << ps.all();
  EXPECT_THAT(ps.out, testing::StartsWith(name_ + " Up "));
  // Its root is root of a user namespace of its own, never the host's: as
  // root, ids of the container's own range; rootless, the user itself
  // (Podman's root, whose namespace the container's is nested in).
  const std::string pid = podman("inspect --format '{{.State.Pid}}' " + name_).out;
  std::istringstream map(file_contents("/proc/" + pid.substr(0, pid.find('\n')) + "/uid_map"));
  uint64_t inside = 1, outside = 0, count = 0;
  map >> inside >> outside >> count;
  EXPECT_EQ(inside, 0u);
  EXPECT_GT(count, 0u);
  if (engine_->rootless())
    EXPECT_EQ(outside, uid_of(Mode::kRootlessSubuid));
  else
    EXPECT_GE(outside, 65536u);
  // exec: its output and its status; a missing command fails.
  Podman e = podman("exec " + name_ + " sh -c 'echo exec out; exit 3'");
  EXPECT_EQ(e.status, 3) << e.all();
  EXPECT_EQ(e.out, "exec out\n");
  Podman missing = podman("exec " + name_ + " no-such-command");
  EXPECT_NE(missing.status, 0) << missing.all();
  EXPECT_NE(missing.status, 3);
  // stop: SIGTERM ends sleep (not pid 1: openshell's init is), well within
  // the timeout; the container is exited, killed by SIGTERM.
  auto before = std::chrono::steady_clock::now();
  Podman stop = podman("stop -t 10 " + name_);
  const long stop_ms = elapsed_ms(before);
  EXPECT_EQ(stop.status, 0) << stop.all();
  EXPECT_LT(stop_ms, 8000) << "stop waited for its timeout";
  Podman state = podman("inspect --format '{{.State.Status}} {{.State.ExitCode}}' " + name_);
  EXPECT_EQ(state.out, "exited 143\n");
  EXPECT_EQ(podman("ps -q --filter " + q("name=^" + name_ + "$")).out, "");
  EXPECT_EQ(podman("rm " + name_).status, 0);
}

TEST_P(Runtime, AnEnginesIdMap) {
  if (!engine_->rootless()) {
    // As root, the engine's map in host ids: Podman gave the image's files
    // those ids, so the container's root owns its root and can write it.
    Podman r = podman(run("--rm --uidmap 0:1500000000:65536 --gidmap 0:1500000000:65536",
                          "sh -c 'id -u; stat -c %u:%g /bin/busybox; touch /new && echo wrote; "
                          "cat /proc/self/uid_map'"));
    EXPECT_EQ(r.status, 0) << r.all();
    EXPECT_THAT(r.out, testing::MatchesRegex("0\n0:0\nwrote\n +0 +1500000000 +65536\n"));
    // Never one that maps the host's root in: refused, with the reason.
    Podman zero = podman(run("--rm --uidmap 0:0:65536 --gidmap 0:0:65536", "true"));
    EXPECT_NE(zero.status, 0) << zero.all();
    EXPECT_THAT(zero.err, HasSubstr("config.json: linux.uidMappings: maps the host's root"));
    return;
  }
  // Rootless, the map is in Podman's namespace's ids, all the user's:
  // keep-id makes the user itself the container's user.
  const std::string uid = std::to_string(uid_of(Mode::kRootlessSubuid));
  const std::string gid = std::to_string(gid_of(Mode::kRootlessSubuid));
  Podman r = podman(run("--rm --userns keep-id", "sh -c 'id -u; id -g; touch /tmp/x; exit 7'"));
  EXPECT_EQ(r.status, 7) << r.all();
  EXPECT_EQ(r.out, uid + "\n" + gid + "\n");
}

// The image's files are the container root's: it owns them and may change
// them. Rootless, Podman's own namespace makes them so; as root, an id map
// (--uidmap, --userns=auto) does, Podman giving the files those ids.
// Without one, as root, they are the host's root's, which no container's
// root is: they read as nobody.
TEST_P(Runtime, TheContainersRootOwnsItsImage) {
  const std::string map =
      engine_->rootless() ? "" : " --uidmap 0:1500000000:65536 --gidmap 0:1500000000:65536";
  Podman r = podman(run("--rm" + map,
                        "sh -c 'stat -c %u:%g /bin/busybox /etc; echo x >>/etc/passwd "
                        "&& mkdir /new && chown 5:5 /new && stat -c %u /new'"));
  EXPECT_EQ(r.status, 0) << r.all();
  EXPECT_EQ(r.out, "0:0\n0:0\n5\n") << r.all();
  if (!engine_->rootless()) {
    EXPECT_EQ(podman(run("--rm", "stat -c %u /etc")).out, "65534\n");
  }
}

TEST_P(Runtime, TheEscapeBatteryFails) {
  // --privileged: every capability Podman gives, no seccomp profile of its
  // own; openshell's confinement stands, for the main process and for an
  // exec alike.
  Podman r = podman(run("--rm --privileged", "sh -c " + q(battery_script())));
  EXPECT_EQ(r.status, 0) << r.all();
  expect_every_escape_denied(r);
  // The control: what is allowed works.
  EXPECT_EQ(podman(run("--rm --privileged", "osh-probe tcp-socket")).out, "ok\n");
  ASSERT_EQ(podman(run("-d --privileged", "sleep 100")).status, 0);
  Podman e = podman("exec --privileged " + name_ + " sh -c " + q(battery_script()));
  EXPECT_EQ(e.status, 0) << e.all();
  expect_every_escape_denied(e);
}

INSTANTIATE_TEST_SUITE_P(Podman, Runtime, testing::Values(Who::kRoot, Who::kRootless),
                         [](const testing::TestParamInfo<Who>& info) {
                           return info.param == Who::kRoot ? "Root" : "Rootless";
                         });

}  // namespace
}  // namespace e2e
