// `openshell oci ...`: the runc command line over openshell's runtime, as an
// engine drives it: a bundle (config.json and a root), then create, start,
// state, exec, kill and delete; and a container confined exactly as
// `openshell run` confines a sandbox.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <sstream>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"

using nlohmann::json;
using testing::HasSubstr;

namespace e2e {
namespace {

// An fd the test opened, closed at the end of its scope.
struct UniqueFdForTest {
  explicit UniqueFdForTest(int f) : fd(f) {}
  ~UniqueFdForTest() { reset(); }
  void reset() {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  int fd;
};

class Oci : public ModeTest {
 protected:
  void SetUp() override {
    ModeTest::SetUp();
    if (IsSkipped()) return;
    static int n = 0;
    const std::string name = "oci-" + mode_name(mode()) + "-" + std::to_string(++n);
    root_ = make_dir(mode(), name + "-state", 0700);
    bundle_ = make_dir(mode(), name + "-bundle");
    id_ = "osh-" + std::to_string(::getpid()) + "-" + std::to_string(n);
  }
  void TearDown() override {
    if (!root_.empty()) oci({"delete", "--force", id_});
    ModeTest::TearDown();
  }

  // A config that runs `args` as root inside, on the tests' busybox root
  // (read-only: it is shared).
  json config(const std::vector<std::string>& args) const {
    return {{"ociVersion", "1.0.2"},
            {"process",
             {{"terminal", false},
              {"user", {{"uid", 0}, {"gid", 0}}},
              {"args", args},
              {"env", {"PATH=/usr/bin:/bin:/usr/sbin:/sbin"}},
              {"cwd", "/"}}},
            {"root", {{"path", rootfs()}, {"readonly", true}}},
            {"hostname", "oci-test"},
            {"mounts",
             {{{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
              {{"destination", "/dev"}, {"type", "tmpfs"}, {"source", "tmpfs"}},
              {{"destination", "/dev/pts"}, {"type", "devpts"}, {"source", "devpts"}},
              {{"destination", "/sys"}, {"type", "sysfs"}, {"source", "sysfs"}}}},
            {"linux",
             {{"namespaces",
               {{{"type", "pid"}},
                {{"type", "network"}},
                {{"type", "ipc"}},
                {{"type", "uts"}},
                {{"type", "mount"}}}}}}};
  }
  void write_config(const json& c) { write_file(bundle_ + "/config.json", c.dump(2)); }

  Result oci(std::vector<std::string> args, Options o = {}) {
    args.insert(args.begin(), {"oci", "--root", root_});
    return openshell(mode(), args, o);
  }
  json state() {
    Result r = oci({"state", id_});
    json j = json::parse(r.out, nullptr, false);
    return j.is_discarded() ? json{{"status", "(none: " + r.err + ")"}} : j;
  }
  // Polls the state until it reads `want` (a loaded machine may be slow).
  bool wait_status(const std::string& want, int ms = 10000) {
    for (int waited = 0; waited < ms; waited += 50) {
      if (state().value("status", "") == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

  std::string root_, bundle_, id_;
};
E2E_ALL_MODES(Oci);

TEST_P(Oci, RunPrintsAndEndsWithTheStatus) {
  write_config(config({"sh", "-c", "echo hello from oci; hostname; exit 7"}));
  Result r = oci({"run", "--bundle", bundle_, id_});
  EXPECT_EQ(r.status, 7) << r.err;
  EXPECT_EQ(r.out, "hello from oci\noci-test\n");
  // run removes its record, as runc's does.
  Result s = oci({"state", id_});
  EXPECT_EQ(s.status, 1);
  EXPECT_THAT(s.err, HasSubstr("container " + id_ + " does not exist"));
}

TEST_P(Oci, CreateStartStateKillDelete) {
  write_config(config({"sleep", "60"}));
  const std::string pid_file = bundle_ + "/pid";
  Result c = oci({"create", "--bundle", bundle_, "--pid-file", pid_file, id_});
  ASSERT_EQ(c.status, 0) << c.err;
  json s = state();
  EXPECT_EQ(s["status"], "created");
  EXPECT_EQ(s["id"], id_);
  EXPECT_EQ(s["bundle"], bundle_);
  const int pid = s.value("pid", 0);
  ASSERT_GT(pid, 0);
  // The pid file holds the init's pid: the process an engine waits for.
  EXPECT_EQ(file_contents(pid_file), std::to_string(pid));
  EXPECT_THAT(file_contents("/proc/" + std::to_string(pid) + "/cmdline"),
              testing::StartsWith("openshell-init"));
  // Nothing of the process runs before start.
  EXPECT_THAT(file_contents_of_dir("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                                   "/children"),
              "");

  Result st = oci({"start", id_});
  ASSERT_EQ(st.status, 0) << st.err;
  EXPECT_EQ(state()["status"], "running");
  Result again = oci({"start", id_});
  EXPECT_EQ(again.status, 1);
  EXPECT_THAT(again.err, HasSubstr("cannot start a container that is running"));

  Result list = oci({"list", "--format", "json"});
  ASSERT_EQ(list.status, 0) << list.err;
  EXPECT_THAT(list.out, HasSubstr("\"id\":\"" + id_ + "\""));

  // A running container is not deleted without --force.
  Result d = oci({"delete", id_});
  EXPECT_EQ(d.status, 1);
  EXPECT_THAT(d.err, HasSubstr("not stopped"));

  Result k = oci({"kill", id_, "TERM"});
  EXPECT_EQ(k.status, 0) << k.err;
  EXPECT_TRUE(wait_status("stopped")) << state().dump();
  EXPECT_EQ(state()["pid"], 0);
  Result del = oci({"delete", id_});
  EXPECT_EQ(del.status, 0) << del.err;
  Result gone = oci({"state", id_});
  EXPECT_EQ(gone.status, 1);
  EXPECT_EQ(file_contents_of_dir(root_), "");
  // As runc: deleting what is not there fails, unless forced.
  Result missing = oci({"delete", id_});
  EXPECT_EQ(missing.status, 1);
  EXPECT_THAT(missing.err, HasSubstr("container " + id_ + " does not exist"));
  EXPECT_EQ(oci({"delete", "--force", id_}).status, 0);
}

// As runc's: a container's cgroups outlive its processes until `delete`,
// where an engine reads the stats and OOM events of one that has exited.
TEST_P(Oci, TheCgroupsStayUntilDelete) {
  json c = config({"true"});
  c["linux"]["cgroupsPath"] = "/" + id_;
  write_config(c);
  ASSERT_EQ(oci({"create", "--bundle", bundle_, id_}).status, 0);
  const std::string pids_dir = "/sys/fs/cgroup/pids/" + id_;
  if (!std::filesystem::exists(pids_dir)) {
    oci({"delete", "--force", id_});
    GTEST_SKIP() << "no pids cgroup made here (" << pids_dir << "): cgroups need root";
  }
  ASSERT_EQ(oci({"start", id_}).status, 0);
  EXPECT_TRUE(wait_status("stopped")) << state().dump();
  // The monitor is gone with the init; the cgroup is still there.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(std::filesystem::exists(pids_dir));
  EXPECT_EQ(oci({"delete", id_}).status, 0);
  EXPECT_FALSE(std::filesystem::exists(pids_dir));
}

TEST_P(Oci, ExecRunsBesideTheMainProcess) {
  write_config(config({"sleep", "60"}));
  ASSERT_EQ(oci({"run", "--detach", "--bundle", bundle_, id_}).status, 0);
  EXPECT_EQ(state()["status"], "running");
  Result e = oci({"exec", id_, "sh", "-c", "echo in $(hostname); exit 4"});
  EXPECT_EQ(e.status, 4) << e.err;
  EXPECT_EQ(e.out, "in oci-test\n");
  // It is in the container's pid namespace: the main process is there.
  Result ps = oci({"exec", id_, "ps", "-o", "comm"});
  EXPECT_THAT(ps.out, HasSubstr("sleep"));
  Result missing = oci({"exec", id_, "no-such-command"});
  EXPECT_EQ(missing.status, 127) << missing.err;
  // The processes, as the engine lists them.
  Result pids = oci({"ps", "--format", "json", id_});
  EXPECT_EQ(pids.status, 0) << pids.err;
  EXPECT_GE(json::parse(pids.out, nullptr, false).size(), 2u) << pids.out;
  EXPECT_EQ(oci({"delete", "--force", id_}).status, 0);
  EXPECT_EQ(oci({"state", id_}).status, 1);
}

TEST_P(Oci, ConfinedAsOpenshellRunConfines) {
  // Root inside, with a capability of the config's, and no seccomp profile
  // of its own: openshell's default profile and no_new_privs still hold.
  json c = config({"osh-probe", "status"});
  json caps = {"CAP_NET_ADMIN"};
  c["process"]["capabilities"] = {
      {"bounding", caps}, {"permitted", caps}, {"effective", caps}, {"ambient", caps}};
  c["process"]["noNewPrivileges"] = false;
  write_config(c);
  Result r = oci({"run", "--bundle", bundle_, id_});
  ASSERT_EQ(r.status, 0) << r.err;
  for (const char* set : {"CapPrm", "CapEff", "CapBnd"})
    EXPECT_THAT(r.out, HasSubstr(std::string(set) + ":\t0000000000001000")) << set;
  EXPECT_THAT(r.out, HasSubstr("NoNewPrivs:\t1"));
  EXPECT_THAT(r.out, HasSubstr("Seccomp:\t2"));
}

TEST_P(Oci, TheEscapeBatteryFails) {
  // Every capability the config can give: only openshell stands in the way.
  json all = json::array();
  for (const char* cap :
       {"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_KILL", "CAP_SETGID", "CAP_SETUID",
        "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_ADMIN",
        "CAP_SYS_MODULE", "CAP_SYS_BOOT", "CAP_MKNOD", "CAP_SYS_RAWIO", "CAP_BPF", "CAP_PERFMON",
        "CAP_DAC_READ_SEARCH"})
    all.push_back(cap);
  const std::vector<std::vector<std::string>> attempts = {
      {"mount"},           {"umount", "/proc"},
      {"unshare-user"},    {"clone-newuser"},
      {"setns"},           {"ptrace", "child"},
      {"keyctl"},          {"bpf"},
      {"io_uring"},        {"perf_event_open"},
      {"userfaultfd"},     {"kexec_load"},
      {"init_module"},     {"open_by_handle_at"},
      {"raw-socket"},      {"packet-socket"},
      {"chroot", "/tmp"},  {"sethostname"},
      {"mknod", "/dev/x"}, {"write", "/proc/sys/kernel/hostname", "escaped"}};
  // One container tries them all, one probe after another: a line each,
  // its status and the first line it printed.
  std::string script;
  for (const auto& attempt : attempts) {
    script += "out=$(osh-probe";
    for (const auto& a : attempt) script += " '" + a + "'";
    script += " 2>&1); echo \"$? $(echo \"$out\" | head -n 1)\"; ";
  }
  json c = config({"sh", "-c", script});
  c["process"]["capabilities"] = {
      {"bounding", all}, {"permitted", all}, {"effective", all}, {"ambient", all}};
  write_config(c);
  Result r = oci({"run", "--bundle", bundle_, id_});
  ASSERT_EQ(r.status, 0) << r.out << r.err;
  std::vector<std::string> lines;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), attempts.size()) << r.out;
  for (size_t i = 0; i < attempts.size(); ++i)
    EXPECT_THAT(lines[i], testing::StartsWith("1 denied: ")) << attempts[i][0] << ": " << r.out;
}

TEST_P(Oci, AProfileNarrowsTheSandbox) {
  json c = config({"mkdir", "/dev/shm/made"});
  write_config(c);
  Result control = oci({"run", "--bundle", bundle_, id_});
  EXPECT_EQ(control.status, 0) << control.err;
  c["linux"]["seccomp"] = {
      {"defaultAction", "SCMP_ACT_ALLOW"},
      {"syscalls",
       {{{"names", {"mkdir", "mkdirat"}}, {"action", "SCMP_ACT_ERRNO"}, {"errnoRet", 13}}}}};
  write_config(c);
  Result r = oci({"run", "--bundle", bundle_, id_});
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("Permission denied"));
  // A profile cannot widen it: one that allows everything leaves openshell's.
  c = config({"osh-probe", "mount"});
  c["linux"]["seccomp"] = {{"defaultAction", "SCMP_ACT_ALLOW"}};
  write_config(c);
  Result wide = oci({"run", "--bundle", bundle_, id_});
  EXPECT_EQ(wide.status, 1) << wide.out << wide.err;
  EXPECT_THAT(wide.out, testing::StartsWith("denied: EPERM"));
}

// The annotation's policy: Landlock on the files it does not list, and the
// network only through the monitor's egress proxy, to what it allows.
TEST_P(Oci, ThePolicyAnnotationConfinesFilesAndNetwork) {
  TestServer server;
  const std::string port = std::to_string(server.port());
  const std::string hosts = write_file(bundle_ + "/hosts", "127.0.0.1 localhost\n");
  write_file(bundle_ + "/policy.toml",
             "version = 1\n[filesystem_policy]\nread_only = [\"/bin\", \"/usr\", \"/lib\", "
             "\"/proc\", \"/dev\"]\nread_write = "
             "[\"/dev/null\"]\n[network_policies.local]\nendpoints = [ { host = "
             "\"localhost\", port = " +
                 port + ", allowed_ips = [\"127.0.0.1/32\"] } ]\n");
  json c = config({"sh", "-c",
                   "cat /etc/passwd >/dev/null 2>&1; echo \"etc $?\"; "
                   "ls /bin/sh >/dev/null; echo \"bin $?\"; "
                   "wget -q -O- http://localhost:" +
                       port +
                       "/; echo \"allowed $?\"; "
                       "wget -q -O- http://localhost:1/ 2>&1 | grep -o '403 Forbidden'; "
                       "env -u http_proxy wget -q -T 2 -O- http://127.0.0.1:" +
                       port +
                       "/ 2>/dev/null; "
                       "echo \"direct $?\"; echo \"proxy $HTTP_PROXY\""});
  c["annotations"] = {{"org.openshell.policy", "policy.toml"}};
  write_config(c);
  Options o;
  o.env = {"OPENSHELL_HOSTS_FILE=" + hosts};
  Result r = oci({"run", "--bundle", bundle_, id_}, o);
  EXPECT_EQ(r.status, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("etc 1\n")) << "read outside the policy: " << r.out;
  EXPECT_THAT(r.out, HasSubstr("bin 0\n")) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("hello from the test server\nallowed 0\n")) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("403 Forbidden\n")) << r.out;
  EXPECT_THAT(r.out, testing::ContainsRegex("direct [1-9][0-9]*\n"))
      << "a way out beside the proxy: " << r.out;
  EXPECT_THAT(r.out, testing::Not(HasSubstr("direct 0"))) << r.out;
  EXPECT_THAT(r.out, HasSubstr("proxy http://127.0.0.1:3128\n")) << r.out;
  EXPECT_EQ(server.connections(), 1) << "only the allowed request reaches the server";

  // One that cannot apply is refused at create, naming the annotation.
  json joined_config = c;
  joined_config["linux"]["namespaces"] = {{{"type", "pid"}}, {{"type", "mount"}}};
  joined_config.erase("hostname");
  write_config(joined_config);
  Result joined = oci({"run", "--bundle", bundle_, id_}, o);
  EXPECT_EQ(joined.status, 1);
  EXPECT_THAT(joined.err, HasSubstr("annotations.org.openshell.policy: its network_policies need "
                                    "a network namespace of the container's own"));
  c["annotations"] = {{"org.openshell.policy", "missing.toml"}};
  write_config(c);
  Result missing = oci({"run", "--bundle", bundle_, id_}, o);
  EXPECT_EQ(missing.status, 1);
  EXPECT_THAT(missing.err,
              HasSubstr("annotations.org.openshell.policy: read " + bundle_ + "/missing.toml"));
}

TEST_P(Oci, HooksSeeTheContainersState) {
  const std::string log = bundle_ + "/hooks.log";
  const std::string hook =
      write_file(bundle_ + "/hook.sh", "#!/bin/sh\necho \"$1 $(cat)\" >> " + log + "\n", 0755);
  json c = config({"true"});
  auto entry = [&](const char* stage) {
    return json::array({{{"path", hook}, {"args", {"hook.sh", stage}}}});
  };
  c["hooks"] = {{"createRuntime", entry("createRuntime")},
                {"createContainer", entry("createContainer")},
                {"poststart", entry("poststart")},
                {"poststop", entry("poststop")}};
  write_config(c);
  Result r = oci({"run", "--bundle", bundle_, id_});
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string seen = file_contents(log);
  for (const char* stage : {"createRuntime", "createContainer", "poststart", "poststop"})
    EXPECT_THAT(seen, HasSubstr(std::string(stage) + " {")) << seen;
  EXPECT_THAT(seen, HasSubstr("\"id\":\"" + id_ + "\""));
  EXPECT_THAT(seen, HasSubstr("\"bundle\":\"" + bundle_ + "\""));
}

// startContainer hooks run at start, inside the container (its files, its
// hostname, its root), before the main process.
TEST_P(Oci, StartContainerHooksRunInsideBeforeTheProcess) {
  json c = config({"sh", "-c", "cat /dev/shm/hook; echo main $(id -u)"});
  c["hooks"] = {{"startContainer",
                 {{{"path", "/bin/sh"},
                   {"args",
                    {"sh", "-c",
                     "echo \"$(hostname) $(id -u) $(grep -o '\"status\":\"[a-z]*\"')\" > "
                     "/dev/shm/hook"}}}}}};
  write_config(c);
  Result r = oci({"run", "--bundle", bundle_, id_});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "oci-test 0 \"status\":\"created\"\nmain 0\n");
  // A failing one fails the start, naming it; the main process never runs.
  c["hooks"] = {{"startContainer", {{{"path", "/bin/false"}}}}};
  write_config(c);
  Result failed = oci({"run", "--bundle", bundle_, id_});
  EXPECT_EQ(failed.status, 1);
  EXPECT_THAT(failed.err, HasSubstr("startContainer hook /bin/false: exited with 1"));
  EXPECT_EQ(failed.out, "");
}

// --preserve-fds N: the caller's fds 3 to 3+N-1 are the process's 3 to
// 3+N-1, for create/start (held by the monitor until the start) and exec.
TEST_P(Oci, PreservedFdsReachTheProcess) {
  const std::string in = write_file(bundle_ + "/in.txt", "from fd 3\n");
  UniqueFdForTest file(::open(in.c_str(), O_RDONLY | O_CLOEXEC));
  int ends[2];
  ASSERT_EQ(::pipe2(ends, O_CLOEXEC), 0);
  UniqueFdForTest read_end(ends[0]), write_end(ends[1]);
  write_config(config({"sh", "-c", "cat <&3; echo to fd 4 >&4"}));
  Options o;
  o.pass_fds = {file.fd, write_end.fd};
  Result r = oci({"run", "--preserve-fds", "2", "--bundle", bundle_, id_}, o);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "from fd 3\n");
  write_end.reset();
  char buf[64] = {};
  EXPECT_EQ(std::string(buf, static_cast<size_t>(
                                 std::max<ssize_t>(0, ::read(read_end.fd, buf, sizeof buf)))),
            "to fd 4\n");
  // Without them the process has none.
  Result none = oci({"run", "--bundle", bundle_, id_});
  EXPECT_NE(none.status, 0) << none.out;
  EXPECT_EQ(none.out, "");

  Result too_many = oci({"run", "--preserve-fds", "40", "--bundle", bundle_, id_});
  EXPECT_EQ(too_many.status, 1);
  EXPECT_THAT(too_many.err, HasSubstr("--preserve-fds 40: between 0 and 32"));
}

TEST_P(Oci, BadConfigIsOneLineNamingTheField) {
  json c = config({"true"});
  c["process"].erase("args");
  write_config(c);
  Result r = oci({"create", "--bundle", bundle_, id_});
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "openshell: config.json: process.args: is required (the command to run)\n");
  c = config({"true"});
  c["mounts"].push_back({{"destination", "/mnt"}, {"type", "nfs"}, {"source", "x:/y"}});
  write_config(c);
  r = oci({"create", "--bundle", bundle_, id_});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("config.json: mounts[4] (/mnt): type \"nfs\" is not supported"));
  c = config({"true"});
  c["linux"]["namespaces"].push_back({{"type", "pid"}, {"path", "/proc/1/ns/pid"}});
  write_config(c);
  r = oci({"create", "--bundle", bundle_, id_});
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("linux.namespaces[5].type: \"pid\" is listed twice"));
  // Nothing was left of the attempts.
  EXPECT_EQ(file_contents_of_dir(root_), "");
  Result unknown = oci({"state", "no-such"});
  EXPECT_EQ(unknown.status, 1);
  EXPECT_EQ(unknown.err, "openshell: container no-such does not exist\n");
  Result bad_id = oci({"state", "../x"});
  EXPECT_EQ(bad_id.status, 1);
  EXPECT_THAT(bad_id.err, HasSubstr("invalid container id"));
}

TEST_P(Oci, SpecWritesAConfigThatRuns) {
  Result s = oci({"spec", "--bundle", bundle_});
  ASSERT_EQ(s.status, 0) << s.err;
  json c = json::parse(file_contents(bundle_ + "/config.json"), nullptr, false);
  ASSERT_FALSE(c.is_discarded());
  EXPECT_EQ(c["process"]["args"], json::array({"sh"}));
  Result again = oci({"spec", "--bundle", bundle_});
  EXPECT_EQ(again.status, 1);
  EXPECT_THAT(again.err, HasSubstr("exists already"));
  c["root"]["path"] = rootfs();
  c["process"]["terminal"] = false;
  c["process"]["args"] = {"sh", "-c", "echo spec ok"};
  write_config(c);
  Result r = oci({"run", "--bundle", bundle_, id_});
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "spec ok\n");
}

TEST_P(Oci, FeaturesAndVersion) {
  Result f = oci({"features"});
  ASSERT_EQ(f.status, 0) << f.err;
  json j = json::parse(f.out, nullptr, false);
  EXPECT_EQ(j["ociVersionMax"], "1.2.0");
  EXPECT_TRUE(j["linux"]["seccomp"]["enabled"].get<bool>());
  Result sys = oci({"--systemd-cgroup", "list"});
  EXPECT_EQ(sys.status, 1);
  EXPECT_THAT(sys.err, HasSubstr("--systemd-cgroup is not supported"));
}

}  // namespace
}  // namespace e2e
