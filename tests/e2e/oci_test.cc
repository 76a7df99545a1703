// `openshell oci ...`: the runc command line over openshell's runtime, as an
// engine drives it: a bundle (config.json and a root), then create, start,
// state, exec, kill and delete; and a container confined exactly as
// `openshell run` confines a sandbox.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <nlohmann/json.hpp>

#include "harness.h"

using nlohmann::json;
using testing::HasSubstr;

namespace e2e {
namespace {

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
  for (const auto& attempt : attempts) {
    json c = config({});
    c["process"]["args"] = json::array({"osh-probe"});
    for (const auto& a : attempt) c["process"]["args"].push_back(a);
    c["process"]["capabilities"] = {
        {"bounding", all}, {"permitted", all}, {"effective", all}, {"ambient", all}};
    write_config(c);
    Result r = oci({"run", "--bundle", bundle_, id_});
    EXPECT_EQ(r.status, 1) << attempt[0] << ": " << r.out << r.err;
    EXPECT_THAT(r.out, testing::StartsWith("denied: ")) << attempt[0] << ": " << r.err;
  }
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
