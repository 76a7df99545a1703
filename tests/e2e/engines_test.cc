// Real engines drive `openshell-runc`: containerd 1.6's own runc v2 shim
// (the path the CRI plugin, and so the kubelet, takes) through
// `ctr run --runc-binary`, and Docker 20.10 with `--add-runtime`. Each
// engine is started by its suite with its own root, state and socket, and
// removed with them afterwards.
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>

#include "harness.h"
#include "image_helpers.h"

using testing::HasSubstr;

namespace e2e {
namespace {

using namespace image_helpers;

bool have(const std::string& program) {
  return sh("command -v " + program + " >/dev/null").status == 0;
}

// An engine the suite started: ended, then its mounts (snapshots, roots)
// and its files.
void stop_engine(pid_t pid, const std::string& dir) {
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  sh("grep -o ' " + dir + "/[^ ]*' /proc/self/mountinfo | sort -r | xargs -r -n1 umount");
  std::filesystem::remove_all(dir);
}

// No process of the test's is left: those running before it do not count.
void expect_no_processes_since(const std::vector<std::string>& before) {
  auto now = leftover_processes();
  std::erase_if(now, [&](const std::string& p) {
    return std::find(before.begin(), before.end(), p) != before.end();
  });
  EXPECT_EQ(now, std::vector<std::string>{}) << "processes left behind";
}

class Containerd : public testing::Test {
 public:
  static void SetUpTestSuite() {
    if (binary().empty() || ::geteuid() != 0) {
      skip_ = "needs root";
      return;
    }
    if (!have("containerd") || !have("ctr") || !have("containerd-shim-runc-v2")) {
      skip_ = "needs containerd (apt-get install containerd)";
      return;
    }
    dir_ = scratch() + "/containerd";
    std::filesystem::create_directories(dir_);
    link_ = dir_ + "/openshell-runc";
    std::filesystem::create_symlink(binary(), link_);
    std::ofstream(dir_ + "/config.toml")
        << "version = 2\nroot = \"" << dir_ << "/root\"\nstate = \"" << dir_
        << "/state\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \""
        << dir_ << "/sock\"\n[ttrpc]\n  address = \"" << dir_ << "/sock.ttrpc\"\n";
    pid_ = ::fork();
    if (pid_ == 0) {
      std::string log = dir_ + "/containerd.log";
      std::freopen(log.c_str(), "w", stderr);
      std::freopen("/dev/null", "w", stdout);
      ::execlp("containerd", "containerd", "--config", (dir_ + "/config.toml").c_str(), nullptr);
      ::_exit(127);
    }
    for (int i = 0; i < 200 && !std::filesystem::exists(dir_ + "/sock"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    // The busybox image, with the probe.
    const char* script = std::getenv("OSH_IMAGE_SCRIPT");
    const char* probe = std::getenv("OSH_PROBE");
    Shell image = sh(q(script ? script : "rootfs-tools/build-busybox-image") + " " +
                     q(dir_ + "/layout") + " " + (probe ? q(probe) : "") + " >/dev/null && cd " +
                     q(dir_ + "/layout") + " && tar cf ../image.tar . && " + ctr() +
                     " image import --index-name busybox:latest ../image.tar");
    if (image.status != 0) skip_ = "cannot import the busybox image: " + image.out;
  }
  static void TearDownTestSuite() {
    if (pid_ > 0) {
      sh(ctr() + " task ls -q | xargs -r -n1 " + ctr() + " task kill -s KILL; sleep 0.5; " + ctr() +
         " task ls -q | xargs -r -n1 " + ctr() + " task delete; " + ctr() +
         " container ls -q | xargs -r -n1 " + ctr() + " container delete");
      stop_engine(pid_, dir_);
      // The cgroup of ctr's namespace, parent of every container's (the
      // runtime removes only a container's own, as runc does).
      remove_empty_cgroups("osh");
    }
  }

 protected:
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    forget_started_processes();
    processes_before_ = leftover_processes();
    static int n = 0;
    id_ = "osh-ctr-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
  }
  void TearDown() override {
    if (!skip_.empty()) return;
    sh(ctr() + " task kill -s KILL " + id_ + "; sleep 0.3; " + ctr() + " task delete " + id_ +
       "; " + ctr() + " container delete " + id_);
    expect_no_processes_since(processes_before_);
    // openshell's record of the container is gone with it.
    EXPECT_FALSE(std::filesystem::exists("/run/containerd/runc/osh/" + id_));
  }

  static std::string ctr() { return "ctr --address " + q(dir_ + "/sock") + " -n osh"; }
  std::string run(const std::string& flags, const std::string& command) {
    return ctr() + " run --runc-binary " + q(link_) + " " + flags + " busybox:latest " + id_ + " " +
           command;
  }
  std::string task(const std::string& what) { return ctr() + " task " + what; }

  static std::string skip_, dir_, link_;
  static pid_t pid_;
  std::vector<std::string> processes_before_;
  std::string id_;
};
std::string Containerd::skip_, Containerd::dir_, Containerd::link_;
pid_t Containerd::pid_ = -1;

TEST_F(Containerd, RunEndsWithTheProcesssStatus) {
  Shell r = sh(run("--rm", "sh -c 'echo hello from ctr; exit 5'"));
  EXPECT_EQ(r.status, 5) << r.out;
  EXPECT_EQ(r.out, "hello from ctr\n");
}

// With an id map (ctr's --uidmap: containerd gives the snapshot's files
// those host ids), the container's root owns its image and may change it.
// Without one its files are the host's root's, which no container's root
// is: they read as nobody, as under rootless runtimes.
TEST_F(Containerd, TheContainersRootOwnsItsImageWithAnIdMap) {
  Shell r = sh(run("--rm --uidmap 0:1500000000:65536 --gidmap 0:1500000000:65536",
                   "sh -c 'stat -c %u:%g /etc; echo x >>/etc/passwd && mkdir /new && chown 5 /new "
                   "&& stat -c %u /new; cat /proc/self/uid_map'"));
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_THAT(r.out, testing::MatchesRegex("0:0\n5\n +0 +1500000000 +65536\n"));
  Shell plain = sh(run("--rm", "stat -c %u /etc"));
  EXPECT_EQ(plain.out, "65534\n");
}

TEST_F(Containerd, ExecKillPauseStatsDelete) {
  ASSERT_EQ(sh(run("-d", "sleep 100")).status, 0);
  Shell ls = sh(task("ls"));
  EXPECT_THAT(ls.out, testing::ContainsRegex(id_ + " +[0-9]+ +RUNNING"));
  // exec: its output and status, through the shim's relay.
  Shell e = sh(task("exec --exec-id e1 " + id_ + " sh -c 'echo exec out; exit 3'"));
  EXPECT_EQ(e.status, 3) << e.out;
  EXPECT_EQ(e.out, "exec out\n");
  Shell missing = sh(task("exec --exec-id e2 " + id_ + " no-such-command"));
  EXPECT_NE(missing.status, 0);
  EXPECT_THAT(missing.out, HasSubstr("cannot run no-such-command"));
  Shell ps = sh(task("ps " + id_));
  EXPECT_EQ(ps.status, 0) << ps.out;
  // Statistics from the container's own cgroups.
  Shell metrics = sh(task("metrics " + id_));
  EXPECT_EQ(metrics.status, 0) << metrics.out;
  EXPECT_THAT(metrics.out, HasSubstr("memory.usage_in_bytes"));
  EXPECT_EQ(sh(task("pause " + id_)).status, 0);
  EXPECT_THAT(sh(task("ls")).out, testing::ContainsRegex(id_ + " +[0-9]+ +PAUSED"));
  EXPECT_EQ(sh(task("resume " + id_)).status, 0);
  EXPECT_THAT(sh(task("ls")).out, testing::ContainsRegex(id_ + " +[0-9]+ +RUNNING"));
  EXPECT_EQ(sh(task("kill " + id_)).status, 0);
  bool stopped = false;
  for (int i = 0; i < 100 && !stopped; ++i) {
    stopped = sh(task("ls")).out.find("STOPPED") != std::string::npos;
    if (!stopped) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(stopped) << sh(task("ls")).out;
  EXPECT_EQ(sh(task("delete " + id_)).status, 0);
}

// Logs: the shim writes the container's stdout and stderr where
// --log-uri says, as for runc. stderr comes first, and stdout a moment
// later: containerd 1.6's shim closes a file log as soon as stdout ends
// (copyPipes gives the stdout copier the file itself, not the counted
// wrapper that stderr's copier shares), so what stderr still has in its
// pipe then is lost, whatever the runtime.
TEST_F(Containerd, TheProcesssOutputGoesToItsLog) {
  const std::string log = dir_ + "/" + id_ + ".log";
  Shell r = sh(run("--rm --log-uri " + q("file://" + log),
                   "sh -c 'echo to stderr >&2; sleep 0.3; echo to stdout; exit 2'"));
  EXPECT_EQ(r.status, 2) << r.out;
  std::string text;
  for (int i = 0; i < 50 && text.find("to stdout") == std::string::npos; ++i) {
    text = file_contents(log);
    if (text.find("to stdout") == std::string::npos)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(text, "to stderr\nto stdout\n");
  std::filesystem::remove(log);
}

TEST_F(Containerd, ATerminal) {
  // ctr wants a terminal of its own for -t: script(1) gives it one, and
  // runs the command from a file (its quoting stays the shell's).
  const std::string command =
      write_file(dir_ + "/" + id_ + ".sh",
                 "#!/bin/sh\nexec " + run("--rm -t", "sh -c 'tty; exit 4'") + "\n", 0755);
  Shell t = sh("SHELL=/bin/sh timeout -k 5 40 script -qec " + q(command) + " /dev/null </dev/null");
  EXPECT_EQ(t.status, 4) << t.out;
  EXPECT_THAT(t.out, HasSubstr("/dev/pts/0"));
}

TEST_F(Containerd, TheEscapeBatteryFails) {
  // --privileged: every capability and no seccomp profile from the engine;
  // openshell's own confinement stands.
  for (const char* attempt :
       {"mount", "unshare-user", "setns", "keyctl", "bpf", "io_uring", "perf_event_open",
        "kexec_load", "init_module", "raw-socket", "sethostname"}) {
    Shell r = sh(run("--rm --privileged", std::string("osh-probe ") + attempt));
    EXPECT_EQ(r.status, 1) << attempt << ": " << r.out;
    EXPECT_THAT(r.out, testing::StartsWith("denied: ")) << attempt;
  }
  Shell control = sh(run("--rm --privileged", "osh-probe tcp-socket"));
  EXPECT_EQ(control.status, 0) << control.out;
}

// Docker 20.10: a dockerd of the suite's own (its data root, exec root,
// socket and pid file in the scratch directory; no bridge, no iptables),
// with openshell-runc added as the runtime "openshell".
class Docker : public testing::Test {
 public:
  static void SetUpTestSuite() {
    if (binary().empty() || ::geteuid() != 0) {
      skip_ = "needs root";
      return;
    }
    if (!have("dockerd") || !have("docker")) {
      skip_ = "needs Docker 20.10 (dockerd and docker)";
      return;
    }
    dir_ = scratch() + "/docker";
    std::filesystem::create_directories(dir_);
    const std::string link = dir_ + "/openshell-runc";
    std::filesystem::create_symlink(binary(), link);
    pid_ = ::fork();
    if (pid_ == 0) {
      std::string log = dir_ + "/dockerd.log";
      std::freopen(log.c_str(), "w", stderr);
      std::freopen("/dev/null", "w", stdout);
      const std::string data = "--data-root=" + dir_ + "/root",
                        exec = "--exec-root=" + dir_ + "/exec",
                        pidfile = "--pidfile=" + dir_ + "/pid",
                        host = "--host=unix://" + dir_ + "/sock",
                        runtime = "--add-runtime=openshell=" + link,
                        config = "--config-file=" + dir_ + "/daemon.json";
      std::ofstream(dir_ + "/daemon.json") << "{}\n";
      ::execlp("dockerd", "dockerd", data.c_str(), exec.c_str(), pidfile.c_str(), host.c_str(),
               config.c_str(), runtime.c_str(), "--bridge=none", "--iptables=false",
               "--ip6tables=false", "--userland-proxy=false", nullptr);
      ::_exit(127);
    }
    bool up = false;
    for (int i = 0; i < 300 && !up; ++i) {
      up = sh(docker() + " info >/dev/null 2>&1").status == 0;
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!up) {
      skip_ = "dockerd did not start: " + file_contents(dir_ + "/dockerd.log").substr(0, 2000);
      return;
    }
    // The tests' busybox root (with the probe), as an image.
    Shell image = sh("tar -C " + q(rootfs()) + " -c . | " + docker() + " import - osh-busybox");
    if (image.status != 0) skip_ = "cannot import the busybox image: " + image.out;
  }
  static void TearDownTestSuite() {
    if (pid_ <= 0) return;
    sh(docker() + " ps -aq | xargs -r " + docker() + " rm -f");
    stop_engine(pid_, dir_);  // the containerd it started ends with it
    remove_empty_cgroups("docker");
  }

 protected:
  void SetUp() override {
    if (!skip_.empty()) GTEST_SKIP() << skip_;
    forget_started_processes();
    processes_before_ = leftover_processes();
    static int n = 0;
    name_ = "osh-docker-" + std::to_string(::getpid()) + "-" + std::to_string(++n);
  }
  void TearDown() override {
    if (!skip_.empty()) return;
    sh(docker() + " rm -f " + name_ + " >/dev/null 2>&1");
    expect_no_processes_since(processes_before_);
  }

  static std::string docker() {
    return "timeout 60 docker --host " + q("unix://" + dir_ + "/sock");
  }
  std::string run(const std::string& flags, const std::string& command) {
    return docker() + " run --runtime openshell --network none --name " + name_ + " " + flags +
           " osh-busybox " + command;
  }

  static std::string skip_, dir_;
  static pid_t pid_;
  std::vector<std::string> processes_before_;
  std::string name_;
};
std::string Docker::skip_, Docker::dir_;
pid_t Docker::pid_ = -1;

TEST_F(Docker, RunExecStop) {
  Shell r = sh(run("--rm", "sh -c 'echo hello from docker; exit 5'"));
  EXPECT_EQ(r.status, 5) << r.out;
  EXPECT_EQ(r.out, "hello from docker\n");
  ASSERT_EQ(sh(run("-d", "sleep 100")).status, 0);
  Shell e = sh(docker() + " exec " + name_ + " sh -c 'echo exec out; exit 3'");
  EXPECT_EQ(e.status, 3) << e.out;
  EXPECT_EQ(e.out, "exec out\n");
  Shell ps = sh(docker() + " ps --format '{{.Names}} {{.Status}}'");
  EXPECT_THAT(ps.out, HasSubstr(name_ + " Up")) << ps.out;
  // sleep ignores nothing: SIGTERM ends it well before the timeout.
  Shell stop = sh(docker() + " stop -t 5 " + name_);
  EXPECT_EQ(stop.status, 0) << stop.out;
  Shell state = sh(docker() + " inspect -f '{{.State.Status}} {{.State.ExitCode}}' " + name_);
  EXPECT_EQ(state.out, "exited 143\n");
  Shell logs = sh(docker() + " logs " + name_);
  EXPECT_EQ(logs.status, 0);
}

TEST_F(Docker, TheEscapeBatteryFails) {
  for (const char* attempt :
       {"mount", "unshare-user", "setns", "keyctl", "bpf", "io_uring", "perf_event_open",
        "kexec_load", "init_module", "raw-socket", "sethostname"}) {
    Shell r = sh(run("--rm --privileged", std::string("osh-probe ") + attempt));
    EXPECT_EQ(r.status, 1) << attempt << ": " << r.out;
    EXPECT_THAT(r.out, testing::StartsWith("denied: ")) << attempt;
  }
}

}  // namespace
}  // namespace e2e
